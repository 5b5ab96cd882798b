"""tools/compile_kernels.py: XCA's, LPI's and the pre-norms' Triton kernels
compiled for an H100 (sm_90) on this machine, which has no GPU, as a
training step and an inference of XCiT-S12 launch them in fp32 and under
bf16 autocast: every kernel compiles, and none spills registers to local
memory or needs more shared memory than the GPU has. The interpreter
(tests/test_*_kernels.py) checks the kernels' arithmetic; this checks what
the GPU compiler makes of them."""
import json
import os
import subprocess
import sys

import pytest

from xcit_dense.errors import UserError
from xcit_dense.models.ops import triton_support

pytestmark = pytest.mark.skipif(not triton_support.available(),
                                reason='needs Triton')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tools'))
import compile_kernels  # noqa: E402

LAUNCHED = {
    'xca_kernels._token_products', 'xca_kernels._attention',
    'xca_kernels._attend', 'xca_kernels._score_gradients',
    'xca_kernels._token_gradients', 'lpi_kernels._forward',
    'lpi_kernels._statistics', 'lpi_kernels._backward',
    'lpi_kernels._parameter_gradients', 'lpi_kernels._gelu_backward',
    'layer_norm_kernels._forward', 'layer_norm_kernels._backward'}


def test_every_kernel_compiles_for_sm90_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    out = tmp_path / 'made' / 'rows.json'  # its folder made when written
    # a 48 x 80 image: a 3 x 5 token grid, S12's 384 channels in 8 heads
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'tools', 'compile_kernels.py'),
         '--size', '48', '80', '--arch', '90', '--dtype', 'float32',
         'bfloat16', '--check', '--out', str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {r['kernel'] for r in rows} == LAUNCHED
    assert {r['step'] for r in rows} == {'float32', 'bfloat16'}
    assert all(r['error'] is None and r['local_bytes'] == 0 and
               r['registers'] > 0 for r in rows)


def test_what_check_counts_as_a_problem():
    fine = compile_kernels.Row('k', '', 'float32', 'fp32', 90, 4, 128, 0,
                               49152)
    assert fine.problems() == []
    spills = compile_kernels.Row('k', '', 'float32', 'fp32', 90, 4, 255, 40,
                                 512)
    assert 'spilled' in spills.problems()[0]
    shared = compile_kernels.Row('k', '', 'float32', 'fp32', 80, 4, 64, 0,
                                 200000)
    assert 'shared memory' in shared.problems()[0]
    failed = compile_kernels.Row('k', '', 'float32', 'fp32', 90, 4,
                                 error='out of resources')
    assert failed.problems() == ['does not compile: out of resources']


def test_bad_input_is_refused_in_one_paragraph(monkeypatch, tmp_path):
    with pytest.raises(UserError, match="Unknown XCiT preset 'small'"):
        compile_kernels.main(['--preset', 'small'])
    with pytest.raises(UserError, match='must be positive'):
        compile_kernels.main(['--batch', '0'])
    # compute capabilities LLVM would abort on, before any work
    for arch in ('0', '1000', '-5', '88'):
        with pytest.raises(UserError, match=f'--arch {arch}: .* sm_70 to '
                           'sm_121'):
            compile_kernels.main(['--arch', '90', arch])
    # outputs that cannot be written, before any work
    with pytest.raises(UserError, match='is a folder'):
        compile_kernels.main(['--out', str(tmp_path)])
    (tmp_path / 'a_file').write_text('')
    with pytest.raises(UserError, match='is a file, not a folder'):
        compile_kernels.main(['--out', str(tmp_path / 'a_file' / 'x.json')])
    with pytest.raises(UserError, match='cannot be written'):
        compile_kernels.main(['--out', '/proc/xcit_dense.json'])
    monkeypatch.setenv('TRITON_INTERPRET', '1')  # as the CPU tests run
    with pytest.raises(UserError, match='without TRITON_INTERPRET=1'):
        compile_kernels.main(['--arch', '90'])
