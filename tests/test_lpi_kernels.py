"""LPI in Triton kernels (xcit_dense/models/ops/lpi_kernels.py) against the
straightforward computation, forward and backward, on the CPU through
Triton's interpreter (which conftest.py selects on a machine without a GPU;
with one, tests/test_cuda.py checks the compiled kernels). Grids whose
tokens and channels are not multiples of a tile, BatchNorm on batch and on
running statistics (their updates and momentum=None's cumulative average
included), without affine parameters or running statistics, SyncBN over two
processes, fp32, fp16 and bf16; then the whole backbone with LPI on the
kernels, what is not written for them, and kernels that fail."""
import copy
import functools
import logging
import multiprocessing
import os
from datetime import timedelta
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from xcit_dense import fast_path
from xcit_dense.models import lpi, policy
from xcit_dense.models.ops import lpi_kernels

from conftest import logged
from test_fast_path import (
    assert_training_matches_reference,
    narrow,
    randomized,
)

pytestmark = pytest.mark.skipif(
    not lpi_kernels.available() or os.environ.get('TRITON_INTERPRET') != '1',
    reason='needs Triton, interpreted on the CPU (a machine without a GPU)')


def branch(channels, **bn_args):
    """LPI's three layers with parameters and statistics away from their
    initial values."""
    conv1, conv2 = (nn.Conv2d(channels, channels, 3, padding=1,
                              groups=channels) for _ in range(2))
    bn = nn.BatchNorm2d(channels, **bn_args)
    with torch.no_grad():
        if bn.affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
        if bn.track_running_stats:
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.)
    return conv1, bn, conv2


def straightforward(y, H, W, conv1, bn, conv2, gamma, residual):
    """timm's LPI on (B, N, C) tokens, times gamma, plus the residual."""
    B, N, C = y.shape
    x = y.permute(0, 2, 1).reshape(B, C, H, W)
    x = conv2(bn(F.gelu(conv1(x)))).reshape(B, C, N).permute(0, 2, 1)
    return residual + gamma * x


def run(fn, y, H, W, layers, gamma, residual, grad):
    """Output, the gradients of the tokens, residual, layers' parameters
    and gamma, and BatchNorm's buffers afterwards."""
    inputs = [t.detach().clone().requires_grad_() for t in (y, residual,
                                                            gamma)]
    params = [p for m in layers for p in m.parameters()]
    out = fn(inputs[0], H, W, *layers, inputs[2], inputs[1])
    grads = torch.autograd.grad(out, inputs + params, grad)
    return out, grads, [b.clone() for b in layers[1].buffers()]


def assert_same(got, ref, tol):
    """Output, every gradient and buffer within ``tol`` of the largest
    value of the reference's."""
    (out, grads, buffers), (ref_out, ref_grads, ref_buffers) = got, ref
    pairs = [('output', out, ref_out)] + \
        [(f'gradient {i}', g, r) for i, (g, r) in enumerate(
            zip(grads, ref_grads))] + \
        [(f'buffer {i}', g, r) for i, (g, r) in enumerate(
            zip(buffers, ref_buffers))]
    for name, g, r in pairs:
        assert g.shape == r.shape and g.dtype == r.dtype, name
        scale = max(r.float().abs().max().item(), 1e-6)
        err = (g.float() - r.float()).abs().max().item() / scale
        assert err < tol, f'{name}: {err:.2e}'


def compare(y, H, W, layers, training, tol=1e-5, steps=1):
    """Kernels and straightforward computation on copies of ``layers``,
    ``steps`` times."""
    torch.manual_seed(1)
    C = y.shape[-1]
    gamma = torch.rand(C) + 0.5
    residual = torch.randn_like(y, dtype=torch.float32)
    grad = torch.randn_like(residual)
    ours, theirs = layers, copy.deepcopy(layers)
    for m in ours + theirs:
        m.train(training)
    for _ in range(steps):
        got = run(lpi_kernels.local_interaction, y, H, W, ours, gamma,
                  residual, grad)
        ref = run(straightforward, y, H, W, theirs, gamma, residual, grad)
        assert_same(got, ref, tol)


@pytest.mark.parametrize('training', [True, False])
@pytest.mark.parametrize('batch, H, W, C', [
    (2, 5, 9, 72),  # 2 tiles of tokens, the last ragged; 2 of channels
    (1, 1, 5, 36),  # one row: every vertical neighbour off the grid
])
def test_kernels_match_the_straightforward_branch(training, batch, H, W, C):
    torch.manual_seed(0)
    y = torch.randn(batch, H * W, C) + 2  # a mean the variance must survive
    compare(y, H, W, list(branch(C)), training)


@pytest.mark.parametrize('bn_args', [{}, dict(affine=False)])
def test_inference_normalises_inside_the_second_convolution(bn_args,
                                                            monkeypatch):
    """In eval mode without gradients the second convolution computes the
    norm's scale and shift from the running statistics itself (no
    statistics kernel), bit for bit what the path with that kernel gives,
    and the straightforward computation's output; with gradients recorded
    the statistics kernel runs, as the backward reads its rows."""
    statistics_of = lpi_kernels._statistics_of
    launched = []
    monkeypatch.setattr(lpi_kernels, '_statistics_of',
                        lambda *a: launched.append(1) or statistics_of(*a))
    torch.manual_seed(0)
    # one image (two images in eval mode: the branch test above)
    y, residual = torch.randn(1, 45, 72) + 2, torch.randn(1, 45, 72)
    conv1, bn, conv2 = branch(72, **bn_args)
    bn.eval()
    gamma = torch.rand(72) + 0.5
    with torch.no_grad():
        read = lpi_kernels.local_interaction(y, 5, 9, conv1, bn, conv2,
                                             gamma, residual)
        ref = straightforward(y, 5, 9, conv1, bn, conv2, gamma, residual)
    assert not launched
    recorded = lpi_kernels.local_interaction(y, 5, 9, conv1, bn, conv2,
                                             gamma, residual)
    assert launched and recorded.requires_grad
    assert torch.equal(read, recorded.detach())
    torch.testing.assert_close(read, ref, rtol=1e-5, atol=1e-5)


def test_tiles_sums_added_in_several_steps(monkeypatch):
    """The statistics and the parameters' gradients add the tiles' sums
    a few tiles per step (32 on a GPU): 2 here, so 3 tiles take a full and
    a ragged step."""
    monkeypatch.setattr(lpi_kernels, '_CHUNK', 2)
    torch.manual_seed(0)
    compare(torch.randn(1, 90, 24) + 2, 9, 10, list(branch(24)), True)


@pytest.mark.parametrize('bn_args', [
    dict(momentum=None),  # the cumulative average of the batches' statistics
    dict(affine=False),
    dict(track_running_stats=False),  # batch statistics in eval mode too
])
def test_kernels_keep_batchnorm_as_its_forward_does(bn_args):
    torch.manual_seed(0)
    y = torch.randn(1, 20, 24)  # one image: one program per tile kernel
    for training in (True, False):
        # twice: the running averages move from where the first left them
        compare(y, 4, 5, list(branch(24, **bn_args)), training, steps=2)


def test_kernels_keep_mmengines_batchnorm_in_place_of_syncbn():
    """mmengine's runner, not distributed, reverts SyncBN to its
    ``_BatchNormXd``: the kernels normalise and update it as its forward
    does."""
    from mmengine.model import revert_sync_batchnorm
    torch.manual_seed(0)
    y = torch.randn(1, 20, 24)
    conv1, bn, conv2 = branch(24)
    synced = nn.SyncBatchNorm(24)
    synced.load_state_dict(bn.state_dict())
    wrapper = revert_sync_batchnorm(nn.Sequential(synced))
    for training in (True, False):
        compare(y, 4, 5, [conv1, wrapper[0], conv2], training, steps=2)


def sync_batch(seed=3):
    """Tokens, residual and output gradient of a batch of 4 on a 4 x 5
    grid of 24 channels."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 20, 24, generator=g) + i for i in range(3)]


def sync_layers():
    torch.manual_seed(2)
    conv1, bn, conv2 = branch(24)
    gamma = torch.rand(24) + 0.5
    return [conv1, bn, conv2], gamma


def _sync_rank(rank, store, out):
    """One of two processes: LPI's kernels with SyncBN on its half of the
    batch; saves what :func:`run` returns."""
    dist.init_process_group('gloo', init_method=f'file://{store}', rank=rank,
                            world_size=2, timeout=timedelta(seconds=300))
    try:
        (conv1, bn, conv2), gamma = sync_layers()
        synced = nn.SyncBatchNorm(24)
        synced.load_state_dict(bn.state_dict())
        y, residual, grad = (t[2 * rank:2 * rank + 2] for t in sync_batch())
        torch.save(run(lpi_kernels.local_interaction, y, 4, 5,
                       [conv1, synced.train(), conv2], gamma, residual,
                       grad), f'{out}/{rank}.pt')
    finally:
        dist.destroy_process_group()


def test_kernels_synchronise_syncbn_across_processes(tmp_path):
    """SyncBN in training over two processes (gloo), each with half of a
    batch: the outputs and token gradients are the halves of BatchNorm's
    over the whole batch, the parameters' gradients add up to its, and the
    running averages of both are its (the variance unbiased over the whole
    batch)."""
    # rank 1 in a fresh interpreter: a process forked after autograd or
    # OpenMP has started threads (another test in this worker may have) can
    # hang; it forks from a server that has imported this module. Rank 0 is
    # this process (one interpreter and one warm-up of the kernels fewer).
    ctx = multiprocessing.get_context('forkserver')
    ctx.set_forkserver_preload([__name__])
    other = ctx.Process(target=_sync_rank,
                        args=(1, tmp_path / 'store', tmp_path))
    other.start()
    try:
        _sync_rank(0, tmp_path / 'store', tmp_path)
    finally:
        other.join(timeout=300)
        if other.exitcode is None:
            other.kill()
    assert other.exitcode == 0
    ranks = [torch.load(tmp_path / f'{r}.pt') for r in range(2)]
    layers, gamma = sync_layers()
    y, residual, grad = sync_batch()
    ref = run(straightforward, y, 4, 5, [m.train() for m in layers], gamma,
              residual, grad)
    (out0, grads0, buffers0), (out1, grads1, buffers1) = ranks
    got = (torch.cat([out0, out1]),
           [torch.cat([a, b]) for a, b in zip(grads0[:2], grads1[:2])] +
           [a + b for a, b in zip(grads0[2:], grads1[2:])], buffers0)
    assert_same(got, ref, 1e-5)
    for a, b in zip(buffers0, buffers1):
        assert torch.equal(a, b)


@pytest.mark.parametrize('dtype, tol', [(torch.float16, 4e-3)])
def test_kernels_in_half_precision_accumulate_in_fp32(dtype, tol):
    """fp16 tokens (what the module gives the kernels under autocast): the
    tokens' gradient in their dtype, the output in the residual's; within
    that dtype's rounding of the fp32 computation (bf16 tokens: below, a
    model cast to bf16; on CUDA, tests/test_cuda.py, under autocast)."""
    torch.manual_seed(0)
    y = torch.randn(2, 42, 40).to(dtype)
    layers = list(branch(40))  # in training mode
    ref_layers = copy.deepcopy(layers)
    gamma = torch.rand(40) + 0.5
    residual = torch.randn(2, 42, 40)
    grad = torch.randn(2, 42, 40)
    got = run(lpi_kernels.local_interaction, y, 6, 7, layers, gamma,
              residual, grad)
    ref = run(straightforward, y.float(), 6, 7, ref_layers, gamma, residual,
              grad)
    assert got[1][0].dtype == dtype
    assert_same(got, (ref[0], [r.to(g.dtype) for g, r in zip(got[1], ref[1])],
                      ref[2]), tol)


def cast_model_branch(device, dtype, training, size=(2, 6, 7)):
    """LPI's branch of a block of a model cast to ``dtype`` (``.half()``,
    ``.to(torch.bfloat16)``: tokens, residual, layer scale, convolutions
    and BatchNorm's parameters and statistics all in it), on the fast path
    and on the straightforward computation: what :func:`run` returns for
    each; a training step (gradients of the tokens, the layer scale and the
    layers' parameters; BatchNorm on the batch, updating its statistics) or
    inference (in eval mode without gradients: BatchNorm on its running
    statistics); ``size``: the tokens' batch, H and W."""
    torch.manual_seed(0)
    (B, H, W), C = size, 40
    module = lpi.LPI(C)
    module.conv1, module.bn, module.conv2 = branch(C)
    module = module.to(device, dtype).train(training)
    gamma = (torch.rand(C, device=device) + 0.5).to(dtype)
    x = (torch.randn(B, H * W, C, device=device) + 1).to(dtype)
    grad = torch.randn_like(x)
    taken = []
    kernels = lpi_kernels.local_interaction

    def step(m, setting):
        inputs = [t.clone().requires_grad_(training) for t in (x, gamma)]
        with fast_path(setting), torch.set_grad_enabled(training), \
                mock.patch.object(lpi_kernels, 'local_interaction',
                                  lambda y, *a, **kw: taken.append(y.shape)
                                  or kernels(y, *a, **kw)):
            out = m.residual_forward(inputs[0], H, W, nn.Identity(),
                                     inputs[1], nn.Identity())
        grads = torch.autograd.grad(out, [*inputs, *m.parameters()],
                                    grad) if training else []
        return out, grads, [b.clone() for b in m.bn.buffers()]
    got = step(copy.deepcopy(module), 'always')
    assert x.shape in taken  # the kernels computed it (and not only probes)
    taken.clear()
    ref = step(module, False)
    assert not taken and got[0].dtype == dtype
    return got, ref


def test_a_model_cast_to_bf16_matches_the_straightforward_one(
        kernels_on_the_cpu):
    """A model cast to bf16 runs LPI's kernels with a bf16 residual, layer
    scale, layers and BatchNorm statistics (which they read in fp32):
    output, gradients and statistics within bf16's rounding of the
    straightforward computation of the same model, in a training step and
    in inference. (One image of one tile: few interpreted programs.)"""
    for training in (True, False):
        got, ref = cast_model_branch('cpu', torch.bfloat16, training,
                                     size=(1, 4, 8))
        assert_same(got, ref, 3e-2)


@pytest.fixture
def kernels_on_the_cpu(monkeypatch):
    """LPI takes its kernel path on the CPU too (probed before the tests
    count the kernels' calls)."""
    monkeypatch.setattr(policy, 'KERNEL_DEVICES', ('cpu', 'cuda'))
    # the narrow backbone's LPI in training: 64 channels, BatchNorm on the
    # batch
    assert lpi_kernels.works(torch.device('cpu'), torch.float32,
                             nn.BatchNorm2d(64), torch.float32)


def test_backbone_on_the_kernels_matches_the_straightforward_one(
        kernels_on_the_cpu, monkeypatch):
    """The whole backbone in training mode with LPI on the kernels (the
    other parts on their CPU fast paths): outputs, every parameter's
    gradient (in the parameter's strides) and BatchNorm's running
    statistics as the straightforward computation's."""
    calls = []
    kernels = lpi_kernels.local_interaction
    monkeypatch.setattr(lpi_kernels, 'local_interaction',
                        lambda *a: calls.append(1) or kernels(*a))
    model = narrow().train()
    grads, ref_model = assert_training_matches_reference(
        model, torch.randn(1, 3, 48, 80))  # one image: half the programs
    assert len(calls) == 4  # every block's LPI
    assert any(name.endswith('local_mp.bn.weight') for name in grads)
    params = dict(model.named_parameters())
    for name, g in grads.items():  # as DDP's buckets expect them
        assert g.stride() == params[name].stride(), name
    for buf, ref_buf in zip(model.buffers(), ref_model.buffers()):
        torch.testing.assert_close(buf, ref_buf, rtol=0, atol=1e-5)


def test_kernels_first_probed_inside_a_checkpoint(kernels_on_the_cpu,
                                                 monkeypatch):
    """``with_cp``: the kernels' probe first runs inside a checkpointed
    block (in a thread of its own: ``triton_support._apart``), so the
    checkpoint's recomputation saves what its forward saved, and the
    output, gradients and BatchNorm statistics are the straightforward
    computation's. (Recording its tensors with the checkpoint's, the probe
    stopped the backward with a CheckpointError.)"""
    from torch.utils.checkpoint import checkpoint

    from xcit_dense.models.ops import triton_support
    monkeypatch.setattr(triton_support, '_VERDICTS', {})
    calls = []
    kernels = lpi_kernels._LocalInteraction.apply
    monkeypatch.setattr(lpi_kernels._LocalInteraction, 'apply',
                        lambda *a: calls.append(1) or kernels(*a))
    torch.manual_seed(0)
    module = lpi.LPI(24).train()
    ref = copy.deepcopy(module)
    x = torch.randn(2, 12, 24)
    outs = []
    for m, setting in ((module, True), (ref, False)):
        xi = x.clone().requires_grad_()
        with fast_path(setting):
            out = checkpoint(m, xi, 3, 4, use_reentrant=False)
            out.pow(2).sum().backward()
        outs.append((out, xi.grad, *[p.grad for p in m.parameters()],
                     *m.buffers()))
    assert len(calls) == 2 + 2  # the probe's two, the forward's two
    for a, b in zip(*outs):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-5,
                                   atol=1e-5)


def test_kernels_run_only_for_what_they_are_written_for(kernels_on_the_cpu,
                                                        monkeypatch):
    """Another norm, another activation, a convolution of another shape,
    fp64, a subclass and ``fast_path=False`` take the straightforward
    computation; SyncBN takes the kernels, and so does the BatchNorm that
    mmengine's runner puts in its place in one process."""
    calls = []
    monkeypatch.setattr(lpi.lpi_kernels, 'local_interaction',
                        lambda y, H, W, c1, bn, c2, *_, **__:
                        calls.append(1) or
                        straightforward(y, H, W, c1, bn, c2, 1, 0))
    x = torch.randn(1, 12, 32)

    def runs_kernels(module, x=x, setting='always', grid=(3, 4)):
        calls.clear()
        with fast_path(setting):
            module(x, *grid)
        return bool(calls)

    module = lpi.LPI(32)
    assert runs_kernels(module)
    assert not runs_kernels(module, setting=False)
    assert not runs_kernels(copy.deepcopy(module).double(), x.double())
    edits = [
        ('act', nn.GELU(approximate='tanh')),
            ('bn', nn.GroupNorm(4, 32)),
        ('conv2', nn.Conv2d(32, 32, 3, padding=1, groups=16)),
        ('conv1', nn.Conv2d(32, 32, 5, padding=2, groups=32)),
    ]
    for name, layer in edits:
        edited = copy.deepcopy(module)
        setattr(edited, name, layer)
        assert not runs_kernels(edited.eval()), name

    synced = copy.deepcopy(module)
    synced.bn = nn.SyncBatchNorm(32)
    assert runs_kernels(synced.eval())
    # what mmengine's runner makes of SyncBN in one process
    from mmengine.model import revert_sync_batchnorm
    reverted = revert_sync_batchnorm(copy.deepcopy(synced))
    assert type(reverted.bn).__name__ == '_BatchNormXd'
    assert runs_kernels(reverted.eval()) and runs_kernels(reverted.train())

    class Edited(lpi.LPI):
        pass
    assert not runs_kernels(Edited(32))
    # one token to normalise per channel in training: BatchNorm's own error
    with pytest.raises(ValueError, match='more than 1 value'):
        runs_kernels(module.train(), torch.randn(1, 1, 32), grid=(1, 1))

    model = narrow()
    calls.clear()
    with fast_path('always'):
        model(torch.randn(1, 3, 32, 32))
    assert calls  # the block's fast path reaches LPI's kernels


def test_kernels_are_probed_for_what_they_will_run(monkeypatch):
    """Each variant Triton compiles is probed before it first runs, once:
    under ``torch.inference_mode`` (whose tensors cannot be recorded for
    backward) the forward, with gradients recorded also the backward;
    BatchNorm on the running statistics and on the batch's, the residual's
    dtype and the channels (LPI), the head width (XCA)."""
    from xcit_dense.models.ops import triton_support, xca_kernels
    monkeypatch.setattr(triton_support, '_VERDICTS', {})
    probed = []
    for module in (lpi_kernels, xca_kernels):
        monkeypatch.setattr(module, 'probe', functools.partial(
            lambda probe, *a, **variant: probed.append(variant) or
            probe(*a, **variant), module.probe))
    cpu, fp32 = torch.device('cpu'), torch.float32
    bn = nn.BatchNorm2d(8)

    def lpi_works(bn=bn, residual=fp32):
        return lpi_kernels.works(cpu, fp32, bn, residual)
    with torch.inference_mode():
        assert lpi_works(bn.eval()) and xca_kernels.works(cpu, fp32, 8)
    assert [v['backward'] for v in probed] == [False, False]
    assert lpi_works() and xca_kernels.works(cpu, fp32, 8)
    assert len(probed) == 4 and probed[2]['backward'] and \
        probed[3] == dict(head_dim=8, backward=True)
    assert lpi_works() and xca_kernels.works(cpu, fp32, 8)
    assert len(probed) == 4  # probed already
    assert lpi_works(bn.train()) and lpi_works(bn, torch.bfloat16) and \
        lpi_works(nn.BatchNorm2d(16)) and xca_kernels.works(cpu, fp32, 16)
    assert [(v.get('channels'), v.get('batch'), v.get('update'),
             v.get('residual_dtype'), v.get('head_dim'))
            for v in probed[4:]] == [
        (8, True, True, fp32, None), (8, True, True, torch.bfloat16, None),
        (16, True, True, fp32, None), (None, None, None, None, 16)]


def test_syncbn_over_processes_is_probed_for_its_statistics(monkeypatch):
    """SyncBN that synchronises (training, several processes) computes its
    statistics in two more variants of the statistics kernel (the
    process's batch statistics without an update, then the combined
    ones): its probe runs them too, so that they never first compile in
    the middle of a run; a BatchNorm2d's probe does not."""
    from xcit_dense.models.ops import triton_support
    monkeypatch.setattr(triton_support, '_VERDICTS', {})
    seen = []
    statistics_of = lpi_kernels._statistics_of

    def recorded(moments, B, N, C, weight, bias, mean, var, eps, batch,
                 factor, group):
        seen.append((batch, factor is not None))
        return statistics_of(moments, B, N, C, weight, bias, mean, var, eps,
                             batch, factor, group)
    monkeypatch.setattr(lpi_kernels, '_statistics_of', recorded)
    cpu, fp32 = torch.device('cpu'), torch.float32
    assert lpi_kernels.works(cpu, fp32, nn.BatchNorm2d(8).train(), fp32)
    assert set(seen) == {(True, True)}
    seen.clear()
    sync = nn.SyncBatchNorm(8).train()
    assert lpi_kernels.works(cpu, fp32, sync, fp32)  # no process group
    assert seen == []  # the same variant as BatchNorm2d's: probed already
    monkeypatch.setattr(lpi_kernels, 'synchronising_group',
                        lambda bn: 'group' if bn is sync else None)
    assert lpi_kernels.works(cpu, fp32, sync, fp32)
    assert set(seen) == {(True, True), (True, False), (False, False)}


def test_kernels_that_fail_on_a_device_leave_the_straightforward_one(
        kernels_on_the_cpu, monkeypatch):
    """Where Triton cannot compile or run XCA's or LPI's kernels (their
    probes raise here, as for a GPU Triton does not support), a training
    step runs and equals the straightforward computation, one warning per
    kernel set names the error and the switch, and the kernels are not
    tried again."""
    from xcit_dense.models.ops import triton_support, xca_kernels
    monkeypatch.setattr(triton_support, '_VERDICTS', {})
    monkeypatch.setattr(triton_support, '_FAILURES', {})
    probes = []

    def failing(device, dtype, **variant):
        probes.append(dtype)
        raise RuntimeError('no kernel image is available for execution')
    called = []
    for module, name in ((xca_kernels, 'attention'),
                         (lpi_kernels, 'local_interaction')):
        monkeypatch.setattr(module, 'probe', failing)
        monkeypatch.setattr(module, name, lambda *a: called.append(1))
    model = randomized().train()
    with logged('test_failing_kernels', logging.WARNING) as warned, \
            fast_path('always'):
        for _ in range(2):
            assert_training_matches_reference(model,
                                              torch.randn(2, 3, 48, 80))
    assert not called and len(probes) == 2  # once per kernel set
    messages = sorted(warned)
    assert len(messages) == 2, messages
    assert messages[0].startswith("XCiT: the Triton kernels of LPI failed")
    assert messages[1].startswith(
        "XCiT: the Triton kernels of XCA's attention failed")
    assert all('RuntimeError: no kernel image' in m and 'fast_path=False' in m
               for m in messages)
    # tools/benchmark.py's row says what ran instead
    from benchmarks.harness.measure import fallbacks
    error = 'RuntimeError: no kernel image is available for execution'
    assert fallbacks(model) == dict(triton_kernels={
        "LPI, cpu, float32": error, "XCA's attention, cpu, float32": error})
