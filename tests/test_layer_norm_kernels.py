"""The blocks' pre-norms in Triton kernels (xcit_dense/models/ops/
layer_norm_kernels.py) against ``nn.LayerNorm`` followed by the cast the
next layer makes, forward and backward, on the CPU through Triton's
interpreter (tests/test_cuda.py checks the compiled kernels on a GPU);
then where the blocks use them, and where not."""
import os

import pytest
import torch
import torch.nn as nn

from xcit_dense import fast_path
from xcit_dense.models import policy
from xcit_dense.models.ops import layer_norm_kernels as kernels

from test_fast_path import randomized

pytestmark = pytest.mark.skipif(
    not kernels.available() or os.environ.get('TRITON_INTERPRET') != '1',
    reason='needs Triton, interpreted on the CPU (a machine without a GPU)')


@pytest.mark.parametrize('channels, tokens', [(128, 37), (96, 5), (384, 9)])
@pytest.mark.parametrize('out_dtype', [torch.float16, torch.bfloat16])
def test_kernels_match_the_norm_and_its_cast(channels, tokens, out_dtype):
    """Outputs rounded once from fp32 (as the norm's fp32 output cast);
    the input's gradient (fp32, as the residual stream's) and the weight's
    and bias's to fp32's rounding. Channels not a power of two, tokens
    not a multiple of a program's."""
    torch.manual_seed(0)
    norm = nn.LayerNorm(channels)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_(0, 0.3)
    x = (torch.randn(2, tokens, channels) * 3 + 1).requires_grad_()
    grad = torch.randn(2, tokens, channels).to(out_dtype)

    y = kernels.layer_norm(x, norm, out_dtype)
    got = torch.autograd.grad(y, (x, norm.weight, norm.bias), grad)
    ref_y = norm(x).to(out_dtype)
    ref = torch.autograd.grad(ref_y, (x, norm.weight, norm.bias), grad)

    assert y.dtype == out_dtype and y.shape == x.shape
    # one rounding of nearly the same fp32 value: at most one unit apart
    ulp = torch.finfo(out_dtype).eps * ref_y.float().abs().clamp(min=1)
    assert ((y.float() - ref_y.float()).abs() <= ulp).all()
    for name, g, r in zip(('x', 'weight', 'bias'), got, ref):
        assert g.dtype == r.dtype == torch.float32, name
        err = (g - r).abs().max() / r.abs().max()
        assert err < 1e-5, f'{name}: {err:.2e}'


@pytest.fixture
def normed_in_kernels(monkeypatch):
    """The norms the kernels compute from now on, in order, on CUDA's path
    on the CPU (the devices the kernels run on widened to it)."""
    monkeypatch.setattr(policy, 'KERNEL_DEVICES', ('cpu', 'cuda'))
    calls = []
    layer_norm = kernels.layer_norm
    monkeypatch.setattr(kernels, 'layer_norm', lambda *a: (
        calls.append(a[1]) or layer_norm(*a)))
    return calls


def test_pre_norm_only_where_it_is_written_for(normed_in_kernels):
    """Under autocast a plain ``nn.LayerNorm``'s output comes in autocast's
    dtype from the kernels; without autocast, for another norm, a subclass,
    a hooked norm or one over other channels, ``norm(x)`` runs as it is."""
    calls = normed_in_kernels
    x = torch.randn(1, 6, 32)

    def kernels_run(norm):
        calls.clear()
        with torch.autocast('cpu', dtype=torch.float16):
            y = kernels.pre_norm(norm, x)
        ref = norm(x)
        assert ((y.float() - ref.float()).abs() < 1e-2).all()
        return bool(calls)

    norm = nn.LayerNorm(32)
    assert kernels_run(norm)
    assert kernels.pre_norm(norm, x).dtype == torch.float32  # no autocast

    class Edited(nn.LayerNorm):
        pass
    assert not kernels_run(Edited(32))
    assert not kernels_run(nn.LayerNorm(32, elementwise_affine=False))
    assert not kernels_run(nn.LayerNorm((6, 32)))
    hooked = nn.LayerNorm(32)
    seen = []
    hooked.register_forward_hook(lambda *_: seen.append(1))
    assert not kernels_run(hooked) and seen


def test_blocks_take_their_pre_norms_in_autocasts_dtype(normed_in_kernels):
    """On CUDA's path under autocast each block's three pre-norms run in
    the kernels (their outputs go on in autocast's dtype, with no cast);
    with ``fast_path=False`` none does."""
    calls = normed_in_kernels
    model = randomized().eval()
    x = torch.randn(1, 3, 32, 48)
    norms = [n for b in model.blocks for n in (b.norm1, b.norm3, b.norm2)]
    for setting, expected in ((True, norms), (False, [])):
        with torch.no_grad(), fast_path(setting, fused_kernels=False), \
                torch.autocast('cpu', dtype=torch.float16):
            model(x)  # the kernels' probes, once
            calls.clear()
            model(x)
        assert [id(n) for n in calls] == [id(n) for n in expected]
