"""Second derivatives through the fast paths (xcit_dense/models/ops/
higher_order.py): a gradient penalty's step (the input gradient recorded
with ``create_graph=True``, then the gradient of its squared norm) gives
what the straightforward computation gives, on the CPU's fast paths (XCA
from second moments, oneDNN's autograd functions) and on CUDA's kernels
(interpreted on the CPU), in training and in inference mode; and a
backward that is not recorded still runs the kernels."""
import copy
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from xcit_dense import fast_path
from xcit_dense.models import policy
from xcit_dense.models.ops import (
    layer_norm_kernels,
    lpi_kernels,
    onednn,
    residual,
    second_moments,
    xca_kernels,
)

from test_fast_path import narrow, randomized

interpreted = pytest.mark.skipif(
    not xca_kernels.available() or os.environ.get('TRITON_INTERPRET') != '1',
    reason='needs Triton, interpreted on the CPU (a machine without a GPU)')


def penalty_step(model, x):
    """The input gradient of a loss, recorded, and the gradients of its
    squared norm for the input and every parameter (zeros where a
    parameter has none)."""
    x = x.clone().requires_grad_()
    loss = sum((out ** 2).mean() for out in model(x))
    grad, = torch.autograd.grad(loss, x, create_graph=True)
    params = [p for p in model.parameters() if p.requires_grad]
    second = torch.autograd.grad(grad.pow(2).sum(), [x] + params,
                                 allow_unused=True)
    return [grad.detach()] + [torch.zeros_like(t) if g is None else g
                              for t, g in zip([x] + params, second)]


def assert_penalty_step_matches_reference(model, x, tol=1e-4):
    """:func:`penalty_step` of ``model`` and of a copy on the
    straightforward computation: every gradient within ``tol`` of the
    reference's largest of its kind, and the same BatchNorm statistics."""
    ref_model = copy.deepcopy(model)
    got = penalty_step(model, x)
    with fast_path(False):
        ref = penalty_step(ref_model, x)
    names = ['input gradient', 'its input gradient'] + \
        [n for n, p in model.named_parameters() if p.requires_grad]
    scale = max(r.abs().max().item() for r in ref[2:])
    for name, g, r in zip(names, got, ref):
        assert g.shape == r.shape, name
        err = (g - r).abs().max().item() / (
            r.abs().max().item() if name.startswith(('input', 'its'))
            else scale)
        assert err < tol, f'{name}: {err:.2e}'
    for buf, ref_buf in zip(model.buffers(), ref_model.buffers()):
        torch.testing.assert_close(buf, ref_buf, rtol=0, atol=1e-5)


def spy(monkeypatch, owner, name, calls):
    """Count ``owner.name``'s calls in ``calls[name]``."""
    function = getattr(owner, name)
    calls[name] = 0

    def counted(*args, **kwargs):
        calls[name] += 1
        return function(*args, **kwargs)
    monkeypatch.setattr(owner, name, counted)


@pytest.mark.parametrize('training', [True, False])
def test_cpu_fast_paths_give_the_straightforward_second_derivatives(
        training, monkeypatch):
    """256 tokens per image, 2 per channel: XCA from its second moments
    (the Gram matrix's backward is differentiable), and where this CPU has
    them oneDNN's linear and MLP functions (a recorded backward
    differentiates PyTorch's operators)."""
    calls = {}
    spy(monkeypatch, second_moments, 'gram', calls)
    for name in ('_reference_mlp', 'linear'):
        spy(monkeypatch, onednn, name, calls)
    model = randomized().train(training)
    assert_penalty_step_matches_reference(model, torch.randn(1, 3, 256, 256))
    assert calls['gram'] == 4
    if onednn.select_backend(torch.randn(1, 8), stochastic=True) == 'onednn':
        assert calls['_reference_mlp'] == 4  # the recorded backward's


@pytest.fixture
def kernels_on_the_cpu(monkeypatch):
    """CUDA's kernel paths taken on the CPU (the narrow backbone's XCA
    heads of 32 and LPI of 64 channels, probed with gradients)."""
    monkeypatch.setattr(policy, 'KERNEL_DEVICES', ('cpu', 'cuda'))
    assert xca_kernels.works(torch.device('cpu'), torch.float32, 32)
    for training in (True, False):
        assert lpi_kernels.works(torch.device('cpu'), torch.float32,
                                 nn.BatchNorm2d(64).train(training),
                                 torch.float32)


@interpreted
@pytest.mark.parametrize('training', [True, False])
def test_kernels_give_the_straightforward_second_derivatives(
        kernels_on_the_cpu, training, monkeypatch):
    """XCA's attention core, LPI's branch and the scaled residuals on
    their kernel paths: the forward in the kernels, a recorded backward
    differentiating the straightforward computation of each (LPI's
    BatchNorm on the batch in training, on its running statistics in
    inference, neither updated again)."""
    calls = {}
    spy(monkeypatch, xca_kernels, '_reference', calls)
    spy(monkeypatch, lpi_kernels, '_reference', calls)
    spy(monkeypatch, residual._ScaledResidual, 'apply', calls)
    spy(monkeypatch, xca_kernels, 'attention', calls)
    kernels = calls['attention']
    model = narrow().train(training)
    assert_penalty_step_matches_reference(model, torch.randn(1, 3, 48, 80))
    assert calls['attention'] - kernels == 4
    # one recomputation per block and recorded backward
    assert calls['_reference'] == 8
    assert calls['apply'] >= 8


@interpreted
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_layer_norm_kernels_give_the_norms_second_derivatives(dtype):
    """The pre-norm's kernels (fp32 or autocast's dtype out): first and
    second derivatives as ``F.layer_norm`` in fp32 and its cast."""
    torch.manual_seed(0)
    norm = nn.LayerNorm(40)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_()
    x = torch.randn(2, 9, 40) + 1
    grad = torch.randn(2, 9, 40).to(dtype)

    def step(fn):
        xi = x.clone().requires_grad_()
        g = torch.autograd.grad(fn(xi), xi, grad, create_graph=True)[0]
        # (the bias does not move the input gradient)
        return [g.detach(), *torch.autograd.grad(
            g.pow(2).sum(), (xi, norm.weight, norm.bias),
            materialize_grads=True)]
    got = step(lambda t: layer_norm_kernels.layer_norm(t, norm, dtype))
    ref = step(lambda t: norm(t).to(dtype))
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=0,
                                   atol=1e-5 * r.abs().max().item())


def test_a_backward_not_recorded_runs_its_own_gradients(monkeypatch):
    """The recomputation is for recorded backwards only: a plain
    backward of the scaled residual and of oneDNN's MLP runs their own
    gradient code, not the references."""
    calls = {}
    spy(monkeypatch, onednn, '_reference_mlp', calls)
    x = torch.randn(6, 8, requires_grad=True)
    w1, w2 = (torch.randn(8, 8, requires_grad=True) for _ in range(2))
    b1, b2 = (torch.randn(8, requires_grad=True) for _ in range(2))
    y = torch.randn(6, 8, requires_grad=True)
    gamma = torch.rand(8, requires_grad=True)
    if onednn.select_backend(x, stochastic=True) == 'onednn':
        onednn.mlp(x, w1, b1, w2, b2, backend='onednn').sum().backward()
        assert calls['_reference_mlp'] == 0
        assert x.grad is not None and b2.grad is not None
    out = residual.scaled_residual(torch.zeros(6, 8), gamma, y)
    grad = torch.randn(6, 8)
    out.backward(grad)
    torch.testing.assert_close(y.grad, grad * gamma, rtol=0, atol=0)
    torch.testing.assert_close(gamma.grad, (grad * y).sum(0))


def test_double_backward_of_the_scaled_residual_and_gram_in_fp64():
    """``gradgradcheck`` (finite differences of the gradients) of the
    two functions whose recorded backward is their own."""
    x, y = (torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    gamma = torch.rand(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(residual.scaled_residual,
                                        (x, gamma, y))
    z = torch.randn(2, 7, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(second_moments.gram, (z,))


def test_syncbn_across_processes_says_it_has_no_second_derivatives():
    """LPI's kernels with a SyncBatchNorm that synchronises: a recorded
    backward (whose recomputation would see one process's batch) stops
    with one paragraph naming what to use instead."""
    ctx = SimpleNamespace(
        saved_tensors=[torch.zeros(1)] * 10, grid=(1, 1, True, False),
        sync=(object(), None), norm=(1e-5, None), needs_input_grad=[True] * 18)
    with pytest.raises(RuntimeError, match='fast_path=False'):
        lpi_kernels._recorded_backward(ctx, torch.zeros(1))
