"""The GPU set-up's decisions (tools/cuda_setup.py, tools/setup_env.sh,
tools/make_wheelhouse.sh), on the CPU: which architectures to build for,
which CUDA compiler, how the registry's compiler becomes a CUDA_HOME, which
PyTorch an offline set-up accepts, and what a CPU-only machine does."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / 'tools'))
import cuda_setup  # noqa: E402


def test_architectures_of_the_gpus_present():
    assert cuda_setup.arch_list([(9, 0)], {}) == '9.0'
    assert cuda_setup.arch_list([(9, 0), (8, 0), (9, 0)], {}) == '8.0;9.0'
    assert cuda_setup.arch_list([], {}) == ''
    # the user's list wins (mmcv's and PyTorch's variable)
    assert cuda_setup.arch_list([(9, 0)], {
        'TORCH_CUDA_ARCH_LIST': '8.6'}) == '8.6'


def test_nvcc_version():
    text = ('nvcc: NVIDIA (R) Cuda compiler driver\n'
            'Cuda compilation tools, release 13.0, V13.0.88\n')
    assert cuda_setup.nvcc_version(text) == (13, 0)
    assert cuda_setup.nvcc_version('command not found') is None


def _fake_nvcc(root):
    nvcc = root / 'bin' / 'nvcc'
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text('')
    return str(nvcc)


def test_compiler_matching_pytorchs_cuda_is_chosen(tmp_path):
    old = _fake_nvcc(tmp_path / 'cuda-12.4')
    new = _fake_nvcc(tmp_path / 'cuda-13.0')
    versions = {old: (12, 4), new: (13, 0)}
    home, notes = cuda_setup.choose_compiler(
        '13.0', [old, str(tmp_path / 'missing' / 'nvcc'), new],
        version_of=versions.get)
    assert home == str(tmp_path / 'cuda-13.0')
    assert notes == [f'{old} is CUDA 12.4, PyTorch is built with CUDA 13.0']
    home, notes = cuda_setup.choose_compiler('13.0', [old],
                                             version_of=versions.get)
    assert home is None and len(notes) == 1


def test_candidates_follow_pytorchs_search_order(tmp_path):
    env = dict(CUDA_HOME='/opt/cuda', PATH=str(tmp_path))
    found = cuda_setup.nvcc_candidates(env)
    assert found[0] == '/opt/cuda/bin/nvcc'
    assert found[-1] == '/usr/local/cuda/bin/nvcc'


def test_registry_compiler_is_pytorchs_cuda_release():
    assert cuda_setup.registry_requirement('13.0', '13.0.2') == \
        'cuda-toolkit[nvcc,cccl]==13.0.2'
    assert cuda_setup.registry_requirement('12.8', None) == \
        'cuda-toolkit[nvcc,cccl]==12.8.*'


@pytest.mark.parametrize('layout', ['cu13', 'cu12'])
def test_registry_wheels_become_one_cuda_home(tmp_path, layout):
    """CUDA 13's wheels share nvidia/cu13; CUDA 12's have a folder each.
    Either way one tree with bin/nvcc, the headers, lib and lib64, and the
    unversioned libcudart.so the extension builder links against."""
    site = tmp_path / 'site'
    parts = {'cu13': {'cu13': ['bin/nvcc', 'include/cuda_runtime.h',
                               'lib/libcudart.so.13', 'nvvm/bin/cicc']},
             'cu12': {'cuda_nvcc': ['bin/nvcc', 'nvvm/bin/cicc'],
                      'cuda_runtime': ['include/cuda_runtime.h',
                                       'lib/libcudart.so.12']}}[layout]
    for folder, files in parts.items():
        for name in files:
            path = site / 'nvidia' / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(name)
    roots = cuda_setup.registry_roots(str(site))
    home = cuda_setup.merge_cuda_home(roots, str(tmp_path / 'cuda'))
    for name in ('bin/nvcc', 'include/cuda_runtime.h', 'nvvm/bin/cicc',
                 'lib/libcudart.so', 'lib64/libcudart.so'):
        assert os.path.exists(os.path.join(home, name)), name
    # made again from scratch on a second run
    assert cuda_setup.merge_cuda_home(roots, home) == home


def test_wheels_without_a_compiler_are_one_paragraph(tmp_path):
    (tmp_path / 'nvidia' / 'cu13' / 'lib').mkdir(parents=True)
    with pytest.raises(cuda_setup.SetupError, match='No CUDA compiler'):
        cuda_setup.merge_cuda_home(cuda_setup.registry_roots(str(tmp_path)),
                                   str(tmp_path / 'cuda'))


def test_pytorch_range_of_an_offline_set_up():
    runtime = str(REPO / 'requirements' / 'runtime.txt')
    assert cuda_setup.check_torch('2.12.1+cu130', runtime) == ''
    assert 'not tested' in cuda_setup.check_torch('2.5.1', runtime)
    for version in ('2.0.1', '2.14.0'):
        with pytest.raises(cuda_setup.SetupError,
                           match=r'outside the range .*>=2\.1, <2\.14'):
            cuda_setup.check_torch(version, runtime)


def test_gpu_pytorch_cannot_use_is_one_paragraph():
    text = cuda_setup.gpu_without_torch_paragraph(
        '2.12.1', '13.0', 'GPU 0: NVIDIA H100 80GB HBM3\n')
    assert 'driver' in text and '\n' not in text
    assert 'CPU-only build' in cuda_setup.gpu_without_torch_paragraph(
        '2.12.1+cpu', None, 'GPU 0: NVIDIA A100')


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is present')
def test_plan_on_this_cpu_machine(monkeypatch):
    monkeypatch.setattr(cuda_setup, '_nvidia_smi', lambda: '')
    assert cuda_setup.plan({}) == dict(ARCHS='')  # as before: the CPU build
    assert cuda_setup.plan(dict(FORCE_CUDA='0')) == dict(ARCHS='')
    with pytest.raises(cuda_setup.SetupError, match='TORCH_CUDA_ARCH_LIST'):
        cuda_setup.plan(dict(FORCE_CUDA='1'))
    # building for a GPU elsewhere: the registry's compiler of PyTorch's
    # CUDA when no system one matches
    monkeypatch.setattr(cuda_setup, 'nvcc_candidates', lambda env: [])
    planned = cuda_setup.plan(dict(FORCE_CUDA='1',
                                   TORCH_CUDA_ARCH_LIST='9.0'))
    assert planned['ARCHS'] == '9.0'
    assert planned['CUDA_WHEELS'].startswith('cuda-toolkit[nvcc,cccl]==')
    # a GPU that nvidia-smi sees but PyTorch cannot use
    monkeypatch.setattr(cuda_setup, '_nvidia_smi',
                        lambda: 'GPU 0: NVIDIA H100 80GB HBM3\n')
    with pytest.raises(cuda_setup.SetupError, match='cannot use it|CPU-only'):
        cuda_setup.plan({})


def test_wheelhouse_holds_the_stack_but_not_pytorch():
    proc = subprocess.run(['bash', 'tools/make_wheelhouse.sh', '--list'],
                          cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PY=sys.executable))
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split('\n')
    names = {line.split('==')[0].lower() for line in listed if line}
    assert {'mmengine', 'mmdet', 'mmsegmentation', 'timm', 'onnxruntime',
            'pycocotools'} <= names
    assert not {n for n in names if n in ('torch', 'torchvision', 'triton')
                or n.startswith(('nvidia-', 'cuda-'))}
    assert any(line.startswith('mmcv==') and 'source' in line
               for line in listed)
