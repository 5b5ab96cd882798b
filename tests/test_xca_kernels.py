"""XCA's attention core in Triton kernels (xcit_dense/models/ops/
xca_kernels.py) against the straightforward computation, forward and
backward, on the CPU through Triton's interpreter (which conftest.py selects
on a machine without a GPU; with one, tests/test_cuda.py checks the compiled
kernels). Token counts not a multiple of a tile and above one program's
range, head widths not a power of two, a channel of zeros (F.normalize's
eps), fp32, fp16 and bf16; then the whole backbone with XCA on the kernels,
and what is not written for them."""
import copy
import logging
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from xcit_dense import fast_path
from xcit_dense.models import policy, xca
from xcit_dense.models.ops import lpi_kernels, xca_kernels

from conftest import logged
from test_fast_path import assert_training_matches_reference, narrow

pytestmark = pytest.mark.skipif(
    not xca_kernels.available() or os.environ.get('TRITON_INTERPRET') != '1',
    reason='needs Triton, interpreted on the CPU (a machine without a GPU)')


@pytest.fixture
def interpreted():
    """The kernels' module (interpreted on the CPU)."""
    return xca_kernels


def straightforward(qkv, temperature, heads):
    """timm's XCA between its qkv and proj layers."""
    B, N, C3 = qkv.shape
    C = C3 // 3
    q, k, v = qkv.reshape(B, N, 3, heads, C // heads).permute(
        2, 0, 3, 4, 1).unbind(0)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    attn = ((q @ k.transpose(-2, -1)) * temperature).softmax(dim=-1)
    return (attn @ v).permute(0, 3, 1, 2).reshape(B, N, C)


def outputs_and_gradients(fn, qkv, temperature, heads, grad):
    qkv = qkv.detach().requires_grad_()
    temperature = temperature.detach().requires_grad_()
    out = fn(qkv, temperature, heads)
    return (out, *torch.autograd.grad(out, (qkv, temperature), grad))


def relative_errors(got, ref):
    """The largest difference of each of the output, dq, dk, dv (the thirds
    of qkv's gradient) and the temperature's gradient to its reference, as
    a fraction of that reference's own largest value: dq and dk are tens of
    times smaller than dv, so on one common scale they could be anything."""
    errors = {}
    for name, g, r in zip(('output', 'dq', 'dk', 'dv', 'temperature'),
                          [got[0], *got[1].chunk(3, dim=-1), got[2]],
                          [ref[0], *ref[1].chunk(3, dim=-1), ref[2]]):
        assert g.shape == r.shape, name
        errors[name] = ((g.float() - r.float()).abs().max() /
                        r.float().abs().max()).item()
    return errors


def assert_close(got, ref, tol):
    """Each of :func:`relative_errors` below ``tol``."""
    errors = relative_errors(got, ref)
    assert max(errors.values()) < tol, errors


@pytest.mark.parametrize('batch, tokens, channels, heads', [
    # two programs of token sums, a ragged last tile, d=12 (one image of
    # two heads: batches and three heads are the half-precision test's)
    (1, 531, 24, 2),
    (1, 7, 32, 1),  # fewer tokens than one tile, d=32
])
def test_kernels_match_the_straightforward_attention(
        interpreted, batch, tokens, channels, heads):
    torch.manual_seed(0)
    qkv = torch.randn(batch, tokens, 3 * channels)
    qkv[0, :, 1] = 0  # a query channel of zeros: its norm is F.normalize's eps
    temperature = torch.rand(heads, 1, 1) + 0.5
    grad = torch.randn(batch, tokens, channels)
    got = outputs_and_gradients(interpreted.attention, qkv, temperature,
                                heads, grad)
    ref = outputs_and_gradients(straightforward, qkv, temperature, heads,
                                grad)
    assert [t.dtype for t in got] == [torch.float32] * 3
    assert_close(got, ref, 1e-5)
    # a view whose channels are not contiguous is copied, not misread
    wide = torch.cat([qkv, qkv], dim=-1)[..., ::2]
    assert wide.stride(-1) == 2
    with torch.no_grad():
        torch.testing.assert_close(
            interpreted.attention(wide, temperature, heads),
            straightforward(wide, temperature, heads), rtol=0, atol=1e-5)


@pytest.mark.parametrize('dtype, tol', [(torch.float16, 2e-3),
                                        (torch.bfloat16, 1.5e-2)])
def test_kernels_in_half_precision_accumulate_in_fp32(interpreted, dtype,
                                                      tol):
    """fp16 / bf16 inputs (what autocast gives the kernels): outputs and
    gradients in that dtype, within its rounding of the fp32 computation
    on the same inputs."""
    torch.manual_seed(1)
    qkv = torch.randn(2, 70, 72).to(dtype)
    temperature = torch.rand(3, 1, 1) + 0.5
    grad = torch.randn(2, 70, 24).to(dtype)
    got = outputs_and_gradients(interpreted.attention, qkv, temperature, 3,
                                grad)
    ref = outputs_and_gradients(straightforward, qkv.float(), temperature, 3,
                                grad.float())
    assert [t.dtype for t in got] == [dtype, dtype, torch.float32]
    assert_close(got, [r.to(g.dtype) for g, r in zip(got, ref)], tol)


@pytest.fixture
def kernels_on_the_cpu(interpreted, monkeypatch):
    """XCA takes its kernel path on the CPU too (probed before the tests
    count the kernels' calls, for fp32 heads of 16 and 32 channels with
    gradients: XCA(32, num_heads=2)'s and the narrow backbone's). LPI
    there on its straightforward computation: its kernels, interpreted,
    take most of a block's time, and tests/test_lpi_kernels.py runs
    the backbone on them."""
    monkeypatch.setattr(policy, 'KERNEL_DEVICES', ('cpu', 'cuda'))
    monkeypatch.setattr(lpi_kernels, 'works', lambda *_: False)
    for head_dim in (16, 32):
        assert xca_kernels.works(torch.device('cpu'), torch.float32,
                                 head_dim)


def test_backbone_on_the_kernels_matches_the_straightforward_one(
        kernels_on_the_cpu, monkeypatch):
    """The whole backbone in training mode with XCA on the kernels (LPI
    on its straightforward computation, see :func:`kernels_on_the_cpu`):
    outputs and every parameter's gradient as the straightforward
    computation's."""
    calls = []
    attention = xca_kernels.attention
    monkeypatch.setattr(xca_kernels, 'attention',
                        lambda *a: calls.append(1) or attention(*a))
    model = narrow().train()
    grads, _ = assert_training_matches_reference(model,
                                                 torch.randn(1, 3, 48, 80))
    assert len(calls) == 4  # every block's XCA
    assert any(name.endswith('attn.temperature') for name in grads)
    # tools/benchmark.py's row names the kernels that ran
    from benchmarks.harness.measure import fallbacks
    assert fallbacks(model)['triton_kernels'][
        "XCA's attention, cpu, float32"] == 'ran'


def test_kernels_run_only_for_what_they_are_written_for(kernels_on_the_cpu,
                                                        monkeypatch):
    """Live attention dropout, fp64, a subclass, ``fast_path=False`` and a
    hook below take the straightforward computation; the qkv and proj
    layers are called as they are (a replaced one runs)."""
    calls = []
    monkeypatch.setattr(xca.xca_kernels, 'attention',
                        lambda *a: calls.append(1) or straightforward(*a))
    x = torch.randn(1, 10, 32)

    def runs_kernels(module, x=x, setting='always'):
        calls.clear()
        with fast_path(setting):
            module(x)
        return bool(calls)

    attn = xca.XCA(32, num_heads=2)
    assert runs_kernels(attn)
    assert not runs_kernels(copy.deepcopy(attn).double(), x.double())
    assert not runs_kernels(attn, setting=False)
    attn.attn_drop.p = 0.1
    assert not runs_kernels(attn)
    attn.attn_drop.eval()
    assert runs_kernels(attn)

    class Edited(xca.XCA):
        pass
    assert not runs_kernels(Edited(32, num_heads=2))

    attn.qkv = nn.Sequential(attn.qkv)  # a wrapped layer runs as written
    assert runs_kernels(attn)
    seen = []
    attn.qkv.register_forward_hook(lambda *_: seen.append(1))
    # a hook below XCA: the straightforward computation, which calls it
    assert not runs_kernels(attn) and seen

    model = narrow()
    calls.clear()
    with fast_path('always'):
        model(torch.randn(1, 3, 32, 32))
    assert calls  # the block's fast path reaches XCA's kernels


def test_kernels_are_probed_for_the_dtype_they_take(kernels_on_the_cpu,
                                                    monkeypatch):
    """Under autocast the qkv layer hands the kernels bf16 for fp32 tokens:
    that dtype and head width are probed, and where that probe fails, the
    straightforward computation runs under autocast, said once."""
    from xcit_dense.models.ops import triton_support
    monkeypatch.setattr(triton_support, '_VERDICTS', {})
    probed, calls = [], []

    def failing(device, dtype, **variant):
        probed.append((dtype, variant['head_dim']))
        raise RuntimeError('out of resource: shared memory')
    monkeypatch.setattr(xca_kernels, 'probe', failing)
    monkeypatch.setattr(xca_kernels, 'attention', lambda *a: calls.append(1))
    torch.manual_seed(0)
    attn, x = xca.XCA(48, num_heads=2), torch.randn(1, 10, 48)
    with logged('test_probe_dtype', logging.WARNING) as warned, \
            torch.autocast('cpu', dtype=torch.bfloat16):
        for _ in range(2):
            with fast_path('always'):
                got = attn(x)
            with fast_path(False):
                ref = attn(x)
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert probed == [(torch.bfloat16, 24)] and not calls
    assert len(warned) == 1 and 'for torch.bfloat16' in warned[0]
    # that variant's verdict kept: not probed again
    assert not xca_kernels.works(torch.device('cpu'), torch.bfloat16, 24)
    assert len(probed) == 1
