"""The GPU path: fast paths, policy, AMP training, mmcv's CUDA ops, NCCL and
resume, on CUDA. Collected always; skipped on a machine without a CUDA
device (``make test`` there reports them as skipped), run by ``make test``
and ``make gpu-report`` on a GPU machine.
"""
import copy
import logging
import re
import signal
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from xcit_dense import fast_path
from xcit_dense.models import policy
from xcit_dense.models.execution import compile_options

from conftest import REPO, logged
from interruption_runs import interrupt, launched
from test_ade20k import _sample as seg_sample
from test_coco_configs import _sample as det_sample
from test_fast_path import randomized
from test_fast_path_policy import X, taken  # noqa: F401  (fixture)
from test_interruptions import _config as interruption_config
from tool_runs import run_tool

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='no CUDA device')


@pytest.fixture
def no_tf32():
    """Full fp32 convolutions and matmuls (PyTorch's default convolutions
    use TF32, whose rounding is ~1e-3)."""
    saved = (torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, \
        torch.backends.cuda.matmul.allow_tf32 = saved


def _relative(out, ref):
    """The largest difference as a fraction of the reference's largest
    value, or of 1 where that is smaller (as the CPU tests compare,
    tests/test_fast_path.py): a quantity that is zero in exact arithmetic
    (the bias before a training-mode BatchNorm, whose gradient cancels;
    BatchNorm's ``num_batches_tracked`` in eval mode) is rounding noise on
    both sides."""
    return ((out.float() - ref.float()).abs().max() /
            max(ref.float().abs().max().item(), 1.0)).item()


def _cancelled_biases(model):
    """Names of the biases whose gradient is zero in exact arithmetic: a
    convolution's or linear layer's right before a training-mode BatchNorm
    (in an ``nn.Sequential``), whose batch mean cancels any shift; each
    path's gradient there is its own rounding noise (``fpn1.0.bias``)."""
    from torch.nn.modules.batchnorm import _BatchNorm
    names = set()
    for prefix, seq in model.named_modules():
        if not isinstance(seq, torch.nn.Sequential):
            continue
        for (i, layer), norm in zip(seq.named_children(), list(seq)[1:]):
            if isinstance(norm, _BatchNorm) and norm.training and \
                    getattr(layer, 'bias', None) is not None:
                names.add(f'{prefix}.{i}.bias' if prefix else f'{i}.bias')
    return names


def _assert_gradients_match(model, grads, ref_grads, tol, noise=1e-5):
    """Every gradient within ``tol`` of its reference (:func:`_relative`);
    the biases a BatchNorm cancels near zero on both sides, under ``noise``
    times the model's largest gradient (rounding: 1e-5 in fp32; under
    autocast bf16's rounding measured 1.6e-5 on an H200)."""
    assert grads.keys() == ref_grads.keys()
    cancelled = _cancelled_biases(model)
    largest = max(g.float().abs().max().item() for g in ref_grads.values())
    for name, grad in grads.items():
        ref = ref_grads[name]
        if name in cancelled:
            size = max(grad.float().abs().max().item(),
                       ref.float().abs().max().item())
            assert size < noise * largest, (name, size, largest)
        else:
            assert _relative(grad, ref) < tol, name


def _step(model, x):
    """Outputs and parameter gradients of a weighted sum of the outputs."""
    model.zero_grad(set_to_none=True)
    outs = model(x)
    loss = sum((o.float() * torch.linspace(-1, 1, o.numel(),
                                           device=o.device).view_as(o)).sum()
               for o in outs)
    loss.backward()
    return [o.detach() for o in outs], {
        n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _assert_step_matches_reference(model, x, setting):
    """A step of ``model`` on ``x`` under the fast-path ``setting`` against
    one of a copy on the straightforward computation: outputs and gradients
    within 1e-4 of their largest value (fp32). Returns the gradients and
    the copy."""
    ref_model = copy.deepcopy(model)
    with fast_path(setting):
        outs, grads = _step(model, x)
    with fast_path(False):
        refs, ref_grads = _step(ref_model, x)
    for out, ref in zip(outs, refs):
        assert _relative(out, ref) < 1e-4
    _assert_gradients_match(model, grads, ref_grads, 1e-4)
    return grads, ref_model


@pytest.mark.parametrize('mode, device', [
    ('eval', 'cuda'), ('train', 'cuda'),
    pytest.param('train', 'cuda:1', marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason='needs 2 GPUs'))])
def test_fast_paths_match_reference_in_fp32(no_tf32, mode, device):
    """Every fast path ('always') against the straightforward computation:
    outputs and gradients within 1e-4 of their largest value; also on a
    second GPU while the first is the current device (Triton launches on
    the current one)."""
    model = randomized().to(device).train(mode == 'train')
    grads, _ = _assert_step_matches_reference(
        model, torch.randn(2, 3, 80, 112, device=device), 'always')
    for name, grad in grads.items():
        assert grad.stride() == dict(model.named_parameters())[
            name].stride(), name  # DDP's bucket layout


def test_with_cp_on_the_kernels_matches_reference(no_tf32, monkeypatch):
    """``with_cp=True`` (gradient checkpointing) on the default path, whose
    kernels are first probed inside a checkpointed block (the probe runs in
    a thread of its own): outputs and gradients as the straightforward
    computation's, BatchNorm's statistics too."""
    from xcit_dense.models.ops import triton_support
    monkeypatch.setattr(triton_support, '_VERDICTS', {})
    model = randomized(with_cp=True).cuda().train()
    _, ref_model = _assert_step_matches_reference(
        model, torch.randn(2, 3, 80, 112, device='cuda'), True)
    for (name, a), b in zip(model.named_buffers(), ref_model.buffers()):
        assert _relative(a, b) < 1e-4, name
    verdicts = triton_support._VERDICTS  # probed inside the checkpoint, ran
    assert verdicts and all(verdicts.values()), verdicts


@pytest.mark.parametrize('dtype', [None, torch.bfloat16])
@pytest.mark.parametrize('setting', ['always', True, False])
def test_every_gradient_in_its_parameters_strides(setting, dtype):
    """DistributedDataParallel copies a gradient whose strides differ from
    its bucket's (the parameter's) on every step, and warns: none may,
    whichever path computed it."""
    model = randomized().cuda().train()
    x = torch.randn(2, 3, 64, 96, device='cuda')
    with fast_path(setting), torch.autocast('cuda', dtype=dtype or
                                            torch.float32,
                                            enabled=dtype is not None):
        outs = model(x)
    sum(o.float().sum() for o in outs).backward()
    wrong = {n: (p.grad.stride(), p.stride())
             for n, p in model.named_parameters()
             if p.grad is not None and p.grad.stride() != p.stride()}
    assert not wrong, wrong


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('setting', ['always', True, False])
def test_autocast_finite_and_close(no_tf32, dtype, setting):
    model = randomized().cuda().train()
    x = torch.randn(2, 3, 80, 112, device='cuda')
    with fast_path(False):
        refs, _ = _step(copy.deepcopy(model), x)
        with torch.autocast('cuda', dtype=dtype):
            amp_refs, _ = _step(copy.deepcopy(model), x)
    with fast_path(setting), torch.autocast('cuda', dtype=dtype):
        outs, grads = _step(model, x)
    # every level in the dtype the straightforward computation gives it
    # under the same autocast (the up-sampled ones in autocast's)
    assert [o.dtype for o in outs] == [r.dtype for r in amp_refs]
    for out, ref in zip(outs, refs):
        assert torch.isfinite(out).all()
        assert _relative(out, ref) < (0.01 if dtype == torch.float16
                                      else 0.05)
    assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.usefixtures('fast_paths_at_any_size')  # XCA's second moments
def test_policy_on_cuda(taken):  # noqa: F811
    """Eager: every fast path but the up-sampler's (XCA and LPI on their
    Triton kernels), and with 'always' that one too; compiled (traced by
    dynamo and AOTAutograd): everything (XCA from second moments)."""
    model = randomized().cuda().eval()
    x = X.cuda()
    with torch.no_grad():
        for setting, parts in (
                (True, set(policy.POLICY) - {'TransposedConvUpsampler'}),
                ('always', set(policy.POLICY))):
            with fast_path(setting):
                model(x)  # the kernels' probes run (and call them) first
                taken.clear()
                model(x)
            assert taken == parts, setting
            taken.clear()
        with fast_path(False):
            model(x)
        assert taken == set()
    torch._dynamo.reset()
    compiled = randomized(compile_cfg=dict(backend='aot_eager')).cuda()
    with torch.no_grad():
        compiled.eval()(x)
    # the cache is not used while dynamo traces (the features are computed
    # in the graph)
    assert taken == set(policy.POLICY) - {'CachedFourierEncoding'}


def test_a_trace_on_cuda_takes_no_kernel_nor_graph(no_tf32, taken):  # noqa: F811
    """A ``torch.jit`` trace on CUDA (what FLOP counters and
    tools/get_flops.py run on a GPU) takes neither the Triton kernels nor
    the CUDA graphs of a model that replays them: it counts the
    straightforward computation's FLOPs, as on the CPU, and its graph
    computes the straightforward outputs."""
    from mmengine.analysis import FlopAnalyzer
    model = randomized(cuda_graphs=True).cuda().eval()
    x = X.cuda()
    with torch.no_grad():
        model(x)
        assert len(model.graphs.graphs) == 1  # replayed from now on
        taken.clear()
        counted = FlopAnalyzer(model, x).total()
        traced = torch.jit.trace(model, x, check_trace=False)
        assert taken == set()
        assert len(model.graphs.graphs) == 1
        assert counted == FlopAnalyzer(randomized(fast_path=False).eval(),
                                       X).total()
        with fast_path(False):
            refs = model(x)
        for out, ref in zip(traced(x), refs):
            assert _relative(out, ref) < 1e-5


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16,
                                   torch.bfloat16])
def test_xca_kernels_match_the_straightforward_attention(no_tf32, dtype):
    """XCA's attention core compiled for the GPU, at XCiT-S12's width (8
    heads of 48 channels) and a token count of several programs and a
    ragged tile: outputs and gradients against the straightforward
    computation in fp32 on the same inputs (the CPU tests run the same
    kernels interpreted, tests/test_xca_kernels.py)."""
    from test_xca_kernels import (
        assert_close,
        outputs_and_gradients,
        straightforward,
    )

    from xcit_dense.models.ops import xca_kernels
    torch.manual_seed(0)
    qkv = torch.randn(2, 2101, 3 * 384, device='cuda').to(dtype)
    temperature = torch.rand(8, 1, 1, device='cuda') + 0.5
    grad = torch.randn(2, 2101, 384, device='cuda').to(dtype)
    got = outputs_and_gradients(xca_kernels.attention, qkv, temperature, 8,
                                grad)
    ref = outputs_and_gradients(straightforward, qkv.float(), temperature, 8,
                                grad.float())
    assert [t.dtype for t in got] == [dtype, dtype, torch.float32]
    # output, dq, dk, dv and the temperature's gradient, each on its scale
    assert_close(got, ref, {torch.float32: 1e-4, torch.float16: 2e-3,
                            torch.bfloat16: 1.5e-2}[dtype])


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16,
                                   torch.bfloat16])
@pytest.mark.parametrize('training', [True, False])
def test_lpi_kernels_match_the_straightforward_branch(no_tf32, dtype,
                                                      training):
    """LPI's kernels compiled for the GPU, at XCiT-S12's width and the grid
    of a 800x1344 image at stride 16 (ragged tiles): output, gradients and
    BatchNorm's buffers against the straightforward computation in fp32 on
    the same inputs (the CPU tests run the same kernels interpreted,
    tests/test_lpi_kernels.py)."""
    from test_lpi_kernels import branch, run, straightforward

    from xcit_dense.models.ops import lpi_kernels
    torch.manual_seed(0)
    H, W = 50, 84
    y = (torch.randn(2, H * W, 384, device='cuda') + 1).to(dtype)
    layers = [m.cuda().train(training) for m in branch(384)]
    ref_layers = copy.deepcopy(layers)
    gamma = torch.rand(384, device='cuda') + 0.5
    residual = torch.randn(2, H * W, 384, device='cuda')
    grad = torch.randn_like(residual)
    got = run(lpi_kernels.local_interaction, y, H, W, layers, gamma,
              residual, grad)
    ref = run(straightforward, y.float(), H, W, ref_layers, gamma, residual,
              grad)
    tol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
    assert got[1][0].dtype == dtype
    for i, (g, r) in enumerate(zip([got[0], *got[1], *got[2]],
                                   [ref[0], *ref[1], *ref[2]])):
        assert _relative(g, r) < tol[dtype], i


@pytest.mark.parametrize('training', [True, False])
def test_lpi_kernels_on_a_model_cast_to_fp16(no_tf32, training):
    """A model cast to fp16 (``model.half()``) runs LPI's kernels with an
    fp16 residual, layer scale, layers and BatchNorm statistics, in a
    training step and in inference: within fp16's rounding of the
    straightforward computation of the same model (as
    tests/test_lpi_kernels.py checks it in bf16 on the CPU)."""
    from test_lpi_kernels import assert_same, cast_model_branch
    got, ref = cast_model_branch('cuda', torch.float16, training)
    assert_same(got, ref, 4e-3)


@pytest.mark.parametrize('out_dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('in_dtype', [torch.float32, torch.float16])
def test_layer_norm_kernels_match_the_norm_and_its_cast(in_dtype, out_dtype):
    """The pre-norms' kernels compiled for the GPU at XCiT-S12's width and
    the tokens of two 800x1344 images (ragged programs): the output against
    ``nn.LayerNorm``'s (in fp32, as autocast computes it) cast to
    ``out_dtype``, the gradients against its in fp32 (the CPU tests run the
    same kernels interpreted, tests/test_layer_norm_kernels.py)."""
    from xcit_dense.models.ops import layer_norm_kernels
    torch.manual_seed(0)
    norm = nn.LayerNorm(384).cuda()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_(0, 0.3)
    x = (torch.randn(2, 4201, 384, device='cuda') * 3 + 1).to(in_dtype)
    grad = torch.randn(2, 4201, 384, device='cuda').to(out_dtype)

    def outputs_and_gradients(fn, x):
        x = x.detach().requires_grad_()
        y = fn(x)
        return (y, *torch.autograd.grad(y, (x, norm.weight, norm.bias),
                                        grad.to(y.dtype)))
    got = outputs_and_gradients(
        lambda t: layer_norm_kernels.layer_norm(t, norm, out_dtype), x)
    ref = outputs_and_gradients(lambda t: norm(t), x.float())
    assert got[0].dtype == out_dtype and got[1].dtype == in_dtype
    assert _relative(got[0], ref[0]) < 1e-2
    tol = 1e-5 if in_dtype == torch.float32 else 2e-3
    for name, g, r in zip(('x', 'weight', 'bias'), got[1:], ref[1:]):
        assert _relative(g, r) < tol, name


@pytest.mark.parametrize('setting, amp, device', [
    (True, False, 'cuda'), ('always', False, 'cuda'),
    ('always', True, 'cuda'),
    pytest.param('always', False, 'cuda:1', marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason='needs 2 GPUs'))])
def test_cuda_graphs_replay_the_eager_forward(no_tf32, setting, amp, device):
    """``XCiT(cuda_graphs=True)``: one capture per size, replayed after;
    the outputs are the eager forward's (the same kernels; fp16 autocast
    to its rounding), an in-place update of a parameter or statistic is
    read by the replay, as by an eager call, a write through ``.data`` too
    (mmengine's EMAHook, mmdet's MeanTeacherHook), a replaced module is
    captured anew, and the positional encoding's cache
    is not read by a graph; also on a second GPU while the first is the
    current device."""
    from contextlib import nullcontext
    net = randomized(cuda_graphs=True, fast_path=setting).to(device).eval()
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    ctx = torch.autocast('cuda', dtype=torch.float16) if amp \
        else nullcontext()
    tol = 2e-3 if amp else 1e-5

    def compare(size, captures):
        x = torch.randn(2, 3, *size, device=device)
        with torch.no_grad(), ctx:
            outs, refs = net(x), eager(x)
        for out, ref in zip(outs, refs):
            assert out.dtype == ref.dtype and _relative(out, ref) < tol
        assert net.graphs.captures == captures
        assert net.graphs.failure is None

    for size, captures in (((64, 96), 1), ((96, 64), 2), ((64, 96), 2)):
        compare(size, captures)
    net.pos_embed._features.clear()  # a graph that read it would see junk
    torch.randn(64, 2 ** 20, device=device)  # reuses the freed memory
    with torch.no_grad():
        for model in (net, eager):
            model.blocks[0].gamma1.mul_(2)
            model.patch_embed.proj[0][1].running_var.mul_(2)
            model.blocks[1].attn.qkv.weight.mul_(-1)
            model.blocks[1].mlp.fc1.bias.add_(1)
    compare((64, 96), 2)
    for model in (net, eager):
        model.blocks[2].local_mp.bn.running_mean.data.add_(0.5)
        model.blocks[2].attn.proj.weight.data.mul_(-1)
    compare((64, 96), 2)
    net.blocks[1].mlp = copy.deepcopy(net.blocks[1].mlp)
    compare((64, 96), 3)


def test_cuda_graphs_serve_several_threads(no_tf32):
    """Four threads calling one graphed model at once (a server's pool, on
    the default stream): each gets its own input's outputs, from one
    capture."""
    import threading
    net = randomized(cuda_graphs=True).cuda().eval()
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    inputs = [torch.randn(1, 3, 64, 96, device='cuda') for _ in range(4)]
    with torch.no_grad():
        wanted = [eager(x) for x in inputs]
        net(inputs[0])
    wrong = []

    def serve(i):
        with torch.no_grad():
            for _ in range(20):
                got = net(inputs[i])
                if not all(_relative(g, w) < 1e-5
                           for g, w in zip(got, wanted[i])):
                    wrong.append(i)
    threads = [threading.Thread(target=serve, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == [] and net.graphs.captures == 1


@pytest.mark.parametrize('setting, amp', [(True, None),
                                          ('always', torch.bfloat16)])
def test_cuda_graphs_replay_eager_training_steps(no_tf32, setting, amp):
    """``XCiT(cuda_graphs='train')``: the third step of a size is captured
    with ``make_graphed_callables`` and replayed after; outputs, gradients
    (in the parameters' strides), the parameters after AdamW and
    BatchNorm's statistics are the eager steps' (the same kernels; autocast
    to its rounding); a new size runs eagerly."""
    from contextlib import nullcontext
    net = randomized(cuda_graphs='train', fast_path=setting).cuda().train()
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (net, eager)]
    tol = 1e-5 if amp is None else 2e-2
    x = torch.randn(2, 3, 64, 96, device='cuda')
    for i in range(5):
        results = []
        for model, opt in zip((net, eager), opts):
            opt.zero_grad(set_to_none=True)
            with torch.autocast('cuda', dtype=amp) if amp else nullcontext():
                outs = model(x)
            sum((o.float() * torch.linspace(-1, 1, o.numel(), device='cuda')
                 .view_as(o)).mean() for o in outs).backward()
            results.append(([o.detach() for o in outs], {
                n: p.grad.clone() for n, p in model.named_parameters()
                if p.grad is not None}))
            for p in model.parameters():
                if p.grad is not None:
                    assert p.grad.stride() == p.stride()
            opt.step()
        (outs, grads), (ref_outs, ref_grads) = results
        for out, ref in zip(outs, ref_outs):
            assert out.dtype == ref.dtype and _relative(out, ref) < tol
        _assert_gradients_match(net, grads, ref_grads, 10 * tol,
                                noise=1e-5 if amp is None else 1e-3)
        for (name, a), b in zip(net.named_buffers(), eager.buffers()):
            assert _relative(a, b) < 10 * tol, name
        assert net.training_graphs.captures == (i >= 2)
    net(torch.randn(2, 3, 96, 64, device='cuda'))
    assert net.training_graphs.captures == 1
    assert net.training_graphs.failure is None


@pytest.mark.parametrize('training', [True, False])
def test_second_derivatives_on_the_kernels(no_tf32, training):
    """A gradient-penalty step on CUDA's default path (XCA's and LPI's
    kernels, the scaled residuals: their recorded backwards differentiate
    the straightforward computation) against the straightforward
    computation's, every gradient within 1e-4."""
    from test_second_derivatives import assert_penalty_step_matches_reference
    assert_penalty_step_matches_reference(
        randomized().cuda().train(training),
        torch.randn(2, 3, 80, 112, device='cuda'))


def test_second_derivatives_through_a_replay_say_so(no_tf32):
    """A weights' gradient recorded through a replayed training step
    (``make_graphed_callables``' backward is computed once) stops with
    the message naming ``cuda_graphs=True``; the steps after it run
    eagerly."""
    net = randomized(cuda_graphs='train').cuda().train()
    x = torch.randn(2, 3, 64, 96, device='cuda')
    for _ in range(3):
        sum(o.mean() for o in net(x)).backward()
    assert net.training_graphs.captures == 1
    loss = sum((o ** 2).mean() for o in net(x))
    weights = [p for n, p in net.named_parameters()
               if n.endswith('fc2.weight')]
    with pytest.raises(RuntimeError, match='cuda_graphs=True'):
        torch.autograd.grad(loss, weights, create_graph=True)
    sum(o.mean() for o in net(x)).backward()
    assert net.training_graphs.failure is not None
    assert net.training_graphs.captures == 1


def test_compile_auto_is_eager_on_cuda():
    """``compile_cfg='auto'`` (the recipes') compiles where it was measured
    faster: nowhere today (xcit_dense/models/policy.py, COMPILE)."""
    model = randomized(compile_cfg='auto').cuda()
    model(torch.randn(1, 3, 64, 64, device='cuda'))
    assert compile_options(model, 'cuda') is None
    assert model.__dict__.get('_compiled_forward') is None


def _same_steps(net, eager, inputs):
    """A training step of each model on each input: the same outputs,
    gradients and BatchNorm statistics. Each step's outputs are held into
    the next, as mmengine's log values are: their graph holds the
    parameters' gradient accumulators, made on the default stream, while
    the next steps are captured (on the H200 such captures failed until
    they ran on leaves of their own)."""
    for x in inputs:
        results = []
        for model in (net, eager):
            model.zero_grad(set_to_none=True)
            outs = model(x)
            sum((o * o).sum() for o in outs).backward()
            results.append((outs, [p.grad for p in model.parameters()]))
        (outs, grads), (ref_outs, ref_grads) = results
        for out, ref in zip(outs, ref_outs):
            assert _relative(out, ref) < 1e-5
        for grad, ref in zip(grads, ref_grads):
            assert (grad is None) == (ref is None)
            assert grad is None or _relative(grad, ref) < 1e-4
        for (name, a), b in zip(net.named_buffers(), eager.buffers()):
            assert _relative(a, b) < 1e-5, name


def test_cuda_graphs_auto_replays_what_recurs(no_tf32):
    """``cuda_graphs='auto'`` (the recipes'): on CUDA a training step's
    third call in a row at one size is captured and replayed, its outputs,
    gradients and BatchNorm statistics the eager steps', also after the
    model changed, and eagerly while a hook below is registered;
    inference's third call too."""
    net = randomized(cuda_graphs='auto').cuda().train()
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    x = torch.randn(2, 3, 64, 96, device='cuda')
    _same_steps(net, eager, [x] * 4)
    assert net.training_graphs.captures == 1
    # a module replaced: the graph launched before the look is dropped and
    # its BatchNorm update undone; the new model is captured in its turn
    for model in (net, eager):
        model.blocks[0].drop_path1 = nn.Identity()
    _same_steps(net, eager, [x] * 4)
    assert net.training_graphs.captures == 2
    # a hook below: called on every step, which runs eagerly
    calls = []
    handles = [model.blocks[0].mlp.register_forward_hook(
        lambda module, *args: calls.append(module)) for model in (net, eager)]
    _same_steps(net, eager, [x] * 4)
    for handle in handles:
        handle.remove()
    assert calls.count(net.blocks[0].mlp) == 4
    assert net.training_graphs.captures == 2
    with torch.no_grad():
        for _ in range(4):
            outs = net.eval()(x)
        for out, ref in zip(outs, eager.eval()(x)):
            assert _relative(out, ref) < 1e-5
    assert net.graphs.captures == 1


def test_training_graphs_of_two_sizes_share_one_pool(no_tf32):
    """``cuda_graphs='train'``: two sizes captured into one memory pool,
    steps alternating between them equal to eager steps (each replay
    writes where the other graph's activations were; its outputs and
    gradients are copied out first)."""
    net = randomized(cuda_graphs='train').cuda().train()
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    sizes = [torch.randn(2, 3, 64, 96, device='cuda'),
             torch.randn(2, 3, 96, 64, device='cuda')]
    _same_steps(net, eager, sizes * 4)
    assert net.training_graphs.captures == 2
    assert len(net.training_graphs.graphs) == 2


class _Synchronising(nn.Module):
    """A module with a debugging line that reads a value to the CPU, which
    a CUDA graph's capture cannot take."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if not torch.isfinite(x).all():
            raise FloatingPointError('not finite')
        return self.inner(x)


def test_a_failed_capture_leaves_training_as_it_was(no_tf32):
    """A training step whose capture the model's forward breaks: one
    warning naming that forward's error and line (not the capture's own),
    and that step and the next ones run eagerly on the stream they ran on
    before, their random draws (DropPath) from the generator as it was: the
    same outputs as a model never captured from the same random state."""
    net = randomized(cuda_graphs='train', drop_path_rate=0.2).cuda().train()
    net.blocks[1].mlp = _Synchronising(net.blocks[1].mlp)
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    x = torch.randn(2, 3, 64, 96, device='cuda')
    with logged(level=logging.WARNING) as messages:
        for _ in range(5):
            state = torch.cuda.get_rng_state()
            outs = net(x)
            sum(o.sum() for o in outs).backward()
            assert torch.cuda.current_stream() == torch.cuda.default_stream()
            after = torch.cuda.get_rng_state()
            torch.cuda.set_rng_state(state)
            for out, ref in zip(outs, eager(x)):
                assert _relative(out, ref) < 1e-5
            assert torch.equal(torch.cuda.get_rng_state(), after)
    assert net.training_graphs.captures == 0
    assert len(messages) == 1, messages
    assert re.search(r'capturing a training step failed \(\w+Error: .*'
                     r'stream is capturing.*, at tests/test_cuda\.py:\d+ in '
                     r'forward\)', messages[0]), messages[0]


def _pin_memory_loop(done, errors, pinned):
    """What a data loader's pinning thread does (named, as PyTorch's
    DataLoader's is, after its target): page-locked buffers allocated and
    copied to the GPU without blocking on a stream of its own, so that
    their reuse queries the copies' events, every millisecond."""
    stream = torch.cuda.Stream()
    try:
        while not done.wait(0.001):
            host = torch.empty(1 << (16 + len(pinned) % 4), dtype=torch.uint8,
                               pin_memory=True)
            with torch.cuda.stream(stream):
                host.to('cuda', non_blocking=True)
            pinned.append(1)
    except Exception as error:  # asserted to be none
        errors.append(error)


def test_captures_beside_a_thread_that_pins_memory(no_tf32):
    """A data loader with ``pin_memory=True`` pins its batches in a thread
    of its own; in CUDA's default global capture mode that thread's calls
    during a capture break the capture and fail themselves (the loader
    raises at its next batch). Inference captures in thread-local mode:
    captured and replayed beside the thread, whose calls all succeed;
    training steps are captured in that mode where
    ``make_graphed_callables`` can, else run eagerly, said once."""
    import threading

    from xcit_dense.models.execution import cuda_graphs
    from xcit_dense.models.execution.cuda_graphs import capture
    done, errors, pinned = threading.Event(), [], []
    thread = threading.Thread(target=_pin_memory_loop,
                              args=(done, errors, pinned), daemon=True)
    thread.start()
    try:
        assert cuda_graphs.pinning_threads()
        net = randomized(cuda_graphs=True).cuda().eval()
        x = torch.randn(2, 3, 64, 96, device='cuda')
        with torch.no_grad():
            refs = randomized().cuda().eval()(x)
            for _ in range(3):
                outs = net(x)
        assert net.graphs.captures == 1 and net.graphs.failure is None
        for out, ref in zip(outs, refs):
            assert _relative(out, ref) < 1e-5
        net = randomized(cuda_graphs='train').cuda().train()
        with logged(level=logging.WARNING) as messages:
            for _ in range(4):
                sum(o.sum() for o in net(x)).backward()
        torch.cuda.synchronize()
        if capture.TRAINING_CAPTURE_THREAD_LOCAL:
            assert net.training_graphs.captures == 1 and messages == []
        else:
            assert net.training_graphs.captures == 0
            assert len(messages) == 1 and 'pin_memory=True' in messages[0]
    finally:
        done.set()
        thread.join()
    assert errors == [] and len(pinned) > 10


def test_benchmark_rows_on_cuda(tmp_path):
    """``tools/benchmark.py --device cuda`` as ``make gpu-report`` runs it,
    at a tiny size: AMP training steps of the backbone, straightforward and
    default, timed with their host part (until the step returned to the
    CPU: at most the whole), the GPU's peak memory, the Triton kernels
    run, and the ratio between them."""
    import json
    proc = run_tool('tools/benchmark.py', '--device', 'cuda', '--models',
                    'xcit_nano_12_p16@reference+amp', 'xcit_nano_12_p16@amp',
                    '--sizes', '64x96', '--batch', '2', '--modes', 'train',
                    '--repeat', '3', '--warmup', '2', '--matmul-size', '1024',
                    '--out-dir', tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / 'results.json').read_text())
    reference, default = results['results']
    for row in (reference, default):
        assert 'error' not in row, row
        assert 0 < row['host_seconds'] <= row['seconds'], row
        assert row['peak_mem_gib'] > 0 and row['achieved_gflops_per_s'] > 0
    assert set(default['triton_kernels'].values()) == {'ran'}, default
    assert '| xcit_nano_12_p16@amp | 64x96 | 2 | train |' in \
        (tmp_path / 'results.md').read_text()


def test_mmcv_ops_run_on_cuda():
    from mmcv.ops import RoIAlign, nms
    torch.manual_seed(0)
    feats = torch.randn(2, 8, 32, 32)
    rois = torch.tensor([[0, 1., 1., 20., 25.], [1, 4., 2., 30., 31.]])
    align = RoIAlign((7, 7), 1.0, 2, aligned=True)
    torch.testing.assert_close(align(feats.cuda(), rois.cuda()).cpu(),
                               align(feats, rois), rtol=1e-4, atol=1e-5)
    boxes = torch.rand(200, 4) * 50
    boxes[:, 2:] += boxes[:, :2] + 1
    scores = torch.rand(200)
    _, keep = nms(boxes.cuda(), scores.cuda(), 0.5)
    _, keep_cpu = nms(boxes, scores, 0.5)
    assert keep.is_cuda and torch.equal(keep.cpu(), keep_cpu)


def _amp_wrapper(model, dtype):
    from mmengine.optim import AmpOptimWrapper
    return AmpOptimWrapper(
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4),
        dtype=dtype)


def _assert_trains(model, wrapper, data, steps=3, skips=10):
    """``steps`` training steps through mmengine's ``train_step``: finite
    losses, and finite parameters that moved (the optimizer wrapper clears
    the gradients after each step). The loss scaler skips a step whose
    gradients overflowed and halves its scale: from mmengine's 2**16 a
    fresh model's first fp16 steps overflow in the straightforward
    computation too (the stem's convolution weights' gradients, a sum over
    every pixel), so up to ``skips`` skipped steps are allowed besides."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stepped = skipped = 0
    while stepped < steps:
        scale = wrapper.loss_scaler.get_scale()
        logs = model.train_step(copy.deepcopy(data), wrapper)
        assert all(torch.isfinite(v).all() for v in logs.values()), logs
        if wrapper.loss_scaler.get_scale() < scale:
            skipped += 1
            assert skipped <= skips, f'{skipped} steps skipped'
        else:
            stepped += 1
    after = dict(model.named_parameters())
    assert all(torch.isfinite(p).all() for p in after.values())
    moved = [n for n, p in after.items() if not torch.equal(p, before[n])]
    assert any(n.startswith('backbone.') for n in moved), moved


def _demo_model(scope, path):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(path)
    init_default_scope(scope)
    torch.manual_seed(0)
    if scope == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model.cuda().train()


def _detection_batch(h=96, w=128):
    """Two random images of the demo detector's 3 classes, as its data
    loader gives them."""
    return dict(inputs=[torch.randint(0, 255, (3, h, w), dtype=torch.uint8)
                        for _ in range(2)],
                data_samples=[det_sample(h, w, 3) for _ in range(2)])


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_mask_rcnn_trains_under_amp(dtype):
    model = _demo_model('mmdet', 'configs/coco/'
                        'demo_mask_rcnn_xcit_nano_synthetic.py')
    wrapper = _amp_wrapper(model, dtype)
    data = _detection_batch()
    _assert_trains(model, wrapper, data)


def test_mmcvs_roi_align_trains_under_bf16_amp_in_fp32():
    """The recipes' RoI heads use mmcv's RoIAlign (the demo torchvision's),
    whose CUDA kernel takes no bf16 (mmcv 2.1): under bf16 AMP the first
    step stops there, and with ``tools/train.py``'s hook for bf16
    (``Float32PartsHook(types=WITHOUT_BF16_KERNELS)``) it trains."""
    from types import SimpleNamespace

    from xcit_dense import Float32PartsHook
    from xcit_dense.precision import WITHOUT_BF16_KERNELS
    model = _demo_model('mmdet', 'configs/coco/'
                        'demo_mask_rcnn_xcit_nano_synthetic.py')
    for extractor in (model.roi_head.bbox_roi_extractor,
                      model.roi_head.mask_roi_extractor):
        for layer in extractor.roi_layers:
            layer.use_torchvision = False
    wrapper = _amp_wrapper(model, 'bfloat16')
    data = _detection_batch()
    with pytest.raises(NotImplementedError, match='BFloat16'):
        model.train_step(copy.deepcopy(data), wrapper)
    wrapper.zero_grad()
    log = []
    runner = SimpleNamespace(model=model,
                             logger=SimpleNamespace(info=log.append))
    Float32PartsHook(types=WITHOUT_BF16_KERNELS).before_run(runner)
    assert log == ['8 RoIAlign run in float32 (autocast off inside them)']
    _assert_trains(model, wrapper, data)


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_upernet_trains_under_amp(dtype):
    model = _demo_model('mmseg', 'configs/ade20k/'
                        'demo_upernet_xcit_nano_synthetic.py')
    wrapper = _amp_wrapper(model, dtype)
    h, w = model.data_preprocessor.size or (128, 128)
    classes = model.decode_head.num_classes
    data = dict(inputs=[torch.randint(0, 255, (3, h, w), dtype=torch.uint8)
                        for _ in range(2)],
                data_samples=[seg_sample(h, w, classes) for _ in range(2)])
    _assert_trains(model, wrapper, data)


def _gpu_config(tmp_path, data_root):
    """The interruption tests' demo (6 iterations, checkpoints every 2) with
    the GPU recipe's AMP and SyncBN kept."""
    config = interruption_config(tmp_path, data_root, 'iter', workers=0)
    with open(config, 'a') as f:
        f.write("optim_wrapper = dict(type='AmpOptimWrapper')\n"
                "sync_bn = 'torch'\n")
    return config


def test_one_gpu_launch_with_nccl_and_syncbn(tiny_coco, tmp_path):
    config = _gpu_config(tmp_path, tiny_coco)
    proc = run_tool('tools/dist_train.sh', config, 1, '--work-dir',
                    tmp_path / 'work', env=dict(PORT='29541'))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert 'No GPU' not in out
    assert 'Distributed launcher: pytorch' in out
    assert re.search(r'Distributed training: True', out)
    assert 'BatchNorm instead of SyncBN' not in out  # SyncBN kept
    assert 'Grad strides do not match bucket view strides' not in out
    assert (tmp_path / 'work' / 'iter_6.pth').is_file()


def test_resume_on_one_gpu(tiny_coco, tmp_path):
    """Killed after the checkpoint of iteration 4 and resumed: the state
    after iteration 6 is as close to the uninterrupted run's as a second
    uninterrupted run is. On CUDA two runs of one seed differ (atomic
    additions in RoIAlign's and the convolutions' backward, which AdamW
    turns into whole steps of its learning rate where a gradient is near
    zero), not bit for bit equal as on the CPU; so the uninterrupted run is
    trained twice, beside the run that is killed, and the resumed run's
    distance to the first is held to the second's. A resume that lost the
    optimizer's or the loss scaler's state, or the data order, lands far
    outside that noise: near what iterations 5 and 6 moved."""
    config = _gpu_config(tmp_path, tiny_coco)
    runs = {name: tmp_path / name for name in ('reference', 'rerun', 'work')}

    def command(name, *args):
        return [sys.executable, 'tools/train.py', str(config), '--work-dir',
                str(runs[name]), *args]

    def train(name, *args):
        with open(tmp_path / f'{name}.log', 'w') as log:
            return subprocess.Popen(command(name, *args), cwd=REPO,
                                    stdout=log, stderr=subprocess.STDOUT)

    procs = {name: train(name) for name in ('reference', 'rerun')}
    code, _ = interrupt(launched(command('work')), tmp_path / 'killed.log',
                        r'Iter\(train\) \[5/6\]', signal.SIGKILL)
    assert code == -signal.SIGKILL
    procs['work'] = train('work', '--resume')
    for name, proc in procs.items():
        assert proc.wait(timeout=300) == 0, \
            (tmp_path / f'{name}.log').read_text()[-3000:]
    assert 'resumed epoch: 0, iter: 4' in \
        (tmp_path / 'work.log').read_text()

    def state(name, it):
        return torch.load(runs[name] / f'iter_{it}.pth', map_location='cpu',
                          weights_only=False)['state_dict']

    after, rerun, resumed = (state(name, 6) for name in runs)
    assert after.keys() == resumed.keys()
    for name, value in after.items():
        if not value.is_floating_point():
            assert torch.equal(value, resumed[name]), name

    def distance(a, b):
        return sum(((a[n].double() - b[n].double()) ** 2).sum().item()
                   for n in a if a[n].is_floating_point()) ** 0.5

    steps = distance(after, state('reference', 4))
    noise, off = distance(after, rerun), distance(after, resumed)
    print(f'iterations 5-6 moved the state by {steps:.3g}; a second run '
          f'lands {noise:.3g} from the first ({noise / steps:.3g} of it), '
          f'the resumed run {off:.3g} ({off / steps:.3g})')
    assert off <= 2 * noise + 0.02 * steps and off <= 0.5 * steps, \
        (off, noise, steps)


def test_launch_probe_runs(tmp_path):
    """make gpu-report's probe of launches against GPU time, at a tiny
    size: every eager row (no part, and XCA and LPI together, on their
    Triton kernels), its kernels and its CUDA graph replay, training steps
    included."""
    import json
    proc = run_tool(sys.executable, '-m', 'benchmarks.gpu.launch_probe',
                    '--out', tmp_path,
                    '--arch', 'nano_12_p16', '--size', '64x96',
                    '--no-compile', '--triton', 'none', 'xca+lpi')
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in
            (tmp_path / 'launch_probe.jsonl').read_text().splitlines()]
    assert len(rows) == 13
    assert all(r['kernels'] > 0 and r['eager_ms'] > 0 for r in rows)
    # the Triton kernels launch fewer kernels than the straightforward
    # computation, in every precision and mode
    launched = {(r['what'], r['precision'], r['triton']): r['kernels']
                for r in rows if 'triton' in r}
    for (what, precision, triton), count in launched.items():
        if triton != 'none':
            assert count < launched[what, precision, 'none'], triton
    assert all(r.get('cuda_graph_ms', 0) > 0 for r in rows), [
        r.get('cuda_graph_error') for r in rows]


def test_graphs_probe_runs(tmp_path):
    """make gpu-report's split of a graphed training step, at a tiny size:
    a graphed row (one capture) and an eager one, every phase timed."""
    import json
    proc = run_tool(sys.executable, '-m', 'benchmarks.gpu.graphs_probe',
                    '--out', tmp_path,
                    '--arch', 'nano_12_p16', '--size', '64x96',
                    '--repeat', '3')
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in
            (tmp_path / 'graphs_probe.jsonl').read_text().splitlines()]
    assert [(r['cuda_graphs'], r['captures']) for r in rows] == \
        [('train', 1), (False, 0)]
    assert all(r['wall_ms'] > 0 and r['fingerprint_ms'] > 0 and
               r['cpu_forward_ms'] > 0 and r['gpu_backward_ms'] > 0
               for r in rows)


def test_iteration_probe_runs(tmp_path):
    """make gpu-report's split of a whole training iteration by part, at
    a tiny size: the backbone's step replayed (one capture), every part of
    Mask R-CNN (its data preprocessor too) and the optimizer's step timed
    on the CPU and the GPU, and one more step under PyTorch's profiler."""
    import json
    proc = run_tool(sys.executable, '-m', 'benchmarks.gpu.iteration_probe',
                    '--out',
                    tmp_path, '--models', 'mask_rcnn_xcit_s12@amp+iter',
                    '--size', '64x96', '--repeat', '3', '--profile')
    assert proc.returncode == 0, proc.stderr[-3000:]
    row, = [json.loads(line) for line in
            (tmp_path / 'iteration_probe.jsonl').read_text().splitlines()]
    assert row['training_graphs_captures'] == 1 and row['param_groups'] == 2
    for part in ('data_preprocessor', 'backbone', 'neck',
                 'rpn_head.loss_and_predict', 'roi_head.loss',
                 'optim_wrapper.backward',
                 'optim_wrapper.step'):
        assert row[f'cpu_{part}_ms'] > 0 and row[f'gpu_{part}_ms'] > 0
    # one more step under the profiler, the parts as its ranges
    profile = (tmp_path / 'mask_rcnn_xcit_s12_amp_iter_profile.txt'
               ).read_text()
    assert '# self CPU time' in profile and '# self GPU time' in profile
    assert 'optim_wrapper.backward' in profile


def test_host_time_runs_on_cuda(tmp_path):
    """make gpu-report's host time of tiny eager calls, and of one Triton
    launch against one PyTorch operator's, on the GPU."""
    import json
    proc = run_tool(sys.executable, '-m', 'benchmarks.probes.host_time',
                    '--device', 'cuda',
                    '--arch', 'nano_12_p16', '--rounds', '1', '--steps',
                    '2', '--out', tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in
            (tmp_path / 'host_time.jsonl').read_text().splitlines()]
    assert [(r['mode'], r.get('config')) for r in rows] == [
        ('train', 'default'), ('train', 'straightforward'),
        ('infer', 'default'), ('infer', 'straightforward'),
        ('launch', None)]
    assert all(r['ms'] > 0 for r in rows[:4])
    assert rows[4]['triton_us'] > 0 and rows[4]['pytorch_us'] > 0


@pytest.mark.usefixtures('fast_paths_at_any_size')
@pytest.mark.parametrize('dynamic', [False, True])
def test_compiled_backbone_matches_eager(no_tf32, dynamic):
    """Compilation, opt-in on CUDA: Inductor compiles the training graph
    (forward and backward) without falling back, its outputs and gradients
    are the eager ones to 1e-4, and with the images' height and width
    dynamic (what multi-scale training varies) one graph serves several
    sizes. (Last in the file: Inductor's compilations take longest, and the
    other tests need not wait for them. ``dynamic=True``, every dimension
    symbolic, took over 130 s on the H200 for this model, the batch's
    symbols included; on the CPU dynamo and AOTAutograd trace it in 40 s,
    with only H and W symbolic in 19 s.)"""
    torch._dynamo.reset()
    model = randomized(compile_cfg=dict(dynamic=None if dynamic else False)
                       ).cuda().train()
    ref_model = copy.deepcopy(model)
    ref_model.compile_cfg = None
    frames = torch._dynamo.utils.counters['frames']
    before = frames['ok']
    sizes = ((64, 96), (128, 64), (96, 160)) if dynamic else ((64, 96), )
    steps = []
    for h, w in sizes:
        x = torch.randn(2, 3, h, w, device='cuda')
        if dynamic:
            torch._dynamo.mark_dynamic(x, 2)
            torch._dynamo.mark_dynamic(x, 3)
        outs, grads = _step(model, x)
        assert model.compile_failure is None
        refs, ref_grads = _step(ref_model, x)
        steps.append((h, w, outs, refs, grads, ref_grads))
    # every size's and level's difference in the message, where one fails
    levels = {(h, w): [f'{_relative(out, ref):.1e}'
                       for out, ref in zip(outs, refs)]
              for h, w, outs, refs, *_ in steps}
    for h, w, outs, refs, grads, ref_grads in steps:
        for out, ref in zip(outs, refs):
            assert _relative(out, ref) < 1e-4, levels
        _assert_gradients_match(model, grads, ref_grads, 1e-4)
    assert model.__dict__.get('_compiled_forward') is not None
    assert frames['ok'] - before == 1, dict(frames)


def test_mask2former_matcher_in_fp32_under_cuda_autocast():
    """On CUDA as on the CPU (tests/test_matching.py): under fp16 autocast
    mmdet's Hungarian matcher sums the mask costs of the recipes' 12,544
    points in fp16 and stops ("cost matrix is infeasible"); the recipes'
    ``Float32HungarianAssigner`` assigns as in fp32."""
    from test_matching import assigned, build, instances
    mmdets = build('HungarianAssigner')
    ours = build('xcit_dense.Float32HungarianAssigner')
    pred, gt = (data.to('cuda') for data in instances(0))
    expected = assigned(mmdets.assign(pred, gt))
    with torch.autocast('cuda', dtype=torch.float16):
        with pytest.raises(ValueError, match='cost matrix is infeasible'):
            mmdets.assign(pred, gt)
        assert assigned(ours.assign(pred, gt)) == expected


def test_mask2former_pixel_decoder_in_fp32_under_cuda_autocast(no_tf32):
    """On CUDA as on the CPU (tests/test_pixel_decoder.py): under fp16
    autocast mmdet's pixel decoder computes in fp16, mmcv's CUDA deformable
    attention kernel among it; the recipes' ``Float32MSDeformAttnPixelDecoder``
    computes what fp32 computes on the features it is given."""
    from test_pixel_decoder import build, features, under_autocast
    mmdets = build('MSDeformAttnPixelDecoder').cuda()
    ours = build('xcit_dense.Float32MSDeformAttnPixelDecoder').cuda()
    ours.load_state_dict(mmdets.state_dict(), strict=True)
    low, outs, reference = under_autocast(
        mmdets, ours, [f.cuda() for f in features(0)], torch.float16)
    assert {o.dtype for o in low} == {torch.float16}
    for out, ref in zip(outs, reference):
        assert out.dtype == torch.float32
        assert _relative(out, ref) < 1e-5
