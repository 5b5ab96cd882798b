"""Kernel launches of CUDA's eager path, counted on the CPU.

On a GPU the eager forward is bound by kernel launches (docs/performance.md,
"GPU"), so what each block launches is part of its speed there. The CPU runs
the same code with XCA's, LPI's and the pre-norms' Triton kernels
interpreted (``TRITON_INTERPRET=1``, the devices the kernels run on widened
to the CPU, the policy's CUDA column taken for the CPU's, its oneDNN
kernels off): every operator that computes (views and allocations apart)
and every Triton kernel is counted, per block, in a fresh autocast region
as a call of the model makes one (the weights' casts included), and for a
whole training step; and the path counted computes what the
straightforward computation does.
"""
import copy
import os
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from xcit_dense import fast_path
from xcit_dense.models import policy
from xcit_dense.models.ops import (
    casts,
    lpi_kernels,
    triton_support,
    xca_kernels,
)

from test_fast_path import assert_outputs_close, narrow, randomized, reference
from tool_runs import run_tool_here

pytestmark = pytest.mark.skipif(
    not (xca_kernels.available() and lpi_kernels.available())
    or os.environ.get('TRITON_INTERPRET') != '1',
    reason='needs Triton with TRITON_INTERPRET=1 (set by conftest)')

#: operators that launch no kernel: views, metadata, allocations
NO_LAUNCH = frozenset({
    'view', 'expand', 'permute', 't', '_unsafe_view', 'slice', 'select',
    'alias', 'transpose', 'unbind', 'new_empty', 'empty', 'empty_like',
    'empty_strided', 'detach', 'as_strided', 'split', 'unsqueeze',
    'squeeze', 'reshape', 'lift_fresh', 'split_with_sizes'})


@pytest.fixture
def cudas_path(monkeypatch):
    """CUDA's eager path on the CPU: the Triton kernels (interpreted) and
    the policy's CUDA column (where it differs from the CPU's: the
    up-sampler's straightforward computation). The counting below is a
    dispatch mode, for which the fast paths step aside
    (``policy.operators_observed``); here it stands for CUDA's launches,
    which watch nothing. PyTorch's own convolutions run without oneDNN,
    which CUDA does not have and whose launches depend on the host: on a
    CPU with AMX its fp16 convolutions added a new tensor and a copy for 9
    of a training step's 16 convolutions (359 and 701 below where a CPU
    without AMX counts 357 and 683; as autograd launches when a gradient's
    layout is not its parameter's). The kernels' verdicts are the test's
    own (a count may probe them without running them)."""
    monkeypatch.setattr(triton_support, '_VERDICTS', {})
    monkeypatch.setattr(policy, 'KERNEL_DEVICES', ('cpu', 'cuda'))
    monkeypatch.setattr(policy, 'operators_observed', lambda: False)
    for part, devices in policy.POLICY.items():
        monkeypatch.setitem(policy.POLICY, part,
                            dict(devices, cpu=devices['cuda']))
    with torch.backends.mkldnn.flags(enabled=False):
        yield


@pytest.fixture
def running_kernels(cudas_path, monkeypatch):
    """:func:`cudas_path` for a test that interprets the kernels, without
    their probes (passed as a count passes them): the test runs every
    kernel a probe would try on its own inputs, and interpreted each
    probe costs about as much as a block's."""
    monkeypatch.setattr(triton_support, '_apart', lambda *_, **__: None)


class Launches(TorchDispatchMode):
    """The kernels launched by the blocks of a model while in this context,
    by block ('stem and pyramid' outside them): operators that compute, and
    Triton kernels (the interpreter's own operators apart; with
    ``interpret=False`` the Triton kernels are counted and not run, their
    outputs left as allocated)."""

    def __init__(self, model, interpret: bool = True):
        super().__init__()
        self.model, self.interpret = model, interpret
        self.counts, self.block, self.interpreting = Counter(), None, 0

    def __enter__(self):
        self.hooks = []
        for i, block in enumerate(self.model.blocks):
            self.hooks += [
                block.register_forward_pre_hook(
                    lambda *_, i=i: setattr(self, 'block', i)),
                block.register_forward_hook(
                    lambda *_: setattr(self, 'block', None))]
        from triton.runtime.interpreter import InterpretedFunction
        self.interpreter = InterpretedFunction
        run = self.run = InterpretedFunction.run

        def counted(function, *args, **kwargs):
            self.count()
            if not self.interpret:
                return None  # counted, not run: what it writes is not read
            self.interpreting += 1
            try:
                return run(function, *args, **kwargs)
            finally:
                self.interpreting -= 1
        InterpretedFunction.run = counted
        return super().__enter__()

    def __exit__(self, *exc):
        self.interpreter.run = self.run
        for hook in self.hooks:
            hook.remove()
        return super().__exit__(*exc)

    def count(self):
        if not self.interpreting:
            self.counts[self.block if self.block is not None
                        else 'stem and pyramid'] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in NO_LAUNCH:
            self.count()
        return func(*args, **(kwargs or {}))


def launches(model, x, setting, dtype):
    """The most a block launches in a call of ``model`` on ``x``, and what
    the call launches outside the blocks, under the fast-path ``setting``
    and autocast to ``dtype`` (None: fp32), on PyTorch's operators as on
    CUDA (not the CPU's fused oneDNN kernels). The Triton kernels are
    counted, not interpreted (slow; what the path computes is tested
    below), nor are the probes' (a call before the counted one probes
    them)."""
    def autocast():
        return torch.autocast('cpu', dtype=dtype or torch.float32,
                              enabled=dtype is not None)
    with torch.no_grad(), fast_path(setting, fused_kernels=False):
        with Launches(model, interpret=False), autocast():
            model(x)  # the kernels' probes, once
        with Launches(model, interpret=False) as counter, autocast():
            model(x)
    outside = counter.counts.pop('stem and pyramid')
    assert len(counter.counts) == len(model.blocks), counter.counts
    return max(counter.counts.values()), outside


@pytest.mark.parametrize('dtype, most', [(None, (15, 24)),
                                         (torch.float16, (19, 40))])
def test_each_block_launches_fewer_kernels_on_cudas_path(cudas_path, dtype,
                                                         most):
    """Inference: XCA's attention core in 3 Triton kernels, LPI's branch
    with its layer scale and residual in 2 (the second convolution
    computing the norm's scale and shift from the running statistics),
    each layer scale with its residual
    in one pass (addcmul), under autocast the linear layers' weights cast
    together (two launches a module) and the pre-norms written in its dtype
    (no casts after them), eval-mode BatchNorm run as modules in the stem
    (a fold on every call launches more); everything derived from the
    weights is derived on every call, from the weights as they are. No
    more launches than were counted when these were written, per block
    (fp32: 15 against 29 for the straightforward computation; fp16
    autocast: 19 against 45; 15 and 15 while the casts and the stem's
    folds were kept across calls, which missed weights written through
    ``.data``) and in the stem, positional
    encoding and pyramid (fp32: 24, fp16 autocast: 40; 42 and 58
    straightforward)."""
    model = randomized().eval()
    x = torch.randn(1, 3, 64, 96)
    fast = launches(model, x, True, dtype)
    straightforward = launches(model, x, False, dtype)
    print(f'launches per block, and outside the blocks: {fast} '
          f'(straightforward: {straightforward})')
    assert fast[0] <= most[0] and fast[0] < straightforward[0]
    assert fast[1] <= most[1]


@pytest.mark.usefixtures('fast_paths_at_any_size')  # oneDNN at 64x96 too
@pytest.mark.parametrize('fused', [False, True])
def test_cudas_inference_path_matches_the_straightforward_one(
        running_kernels, fused):
    """The path counted above, in fp32 to 1e-4 and under fp16 autocast in
    the straightforward computation's dtypes, level by level; and beside
    the CPU's oneDNN kernels (the MLP's fused residual GEMM takes the
    folded layer scale)."""
    model = narrow().eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad(), fast_path(fused_kernels=fused):
        assert_outputs_close(model(x), reference(model, x))
        with torch.autocast('cpu', dtype=torch.float16):
            outs, refs = model(x), reference(model, x)
    assert [o.dtype for o in outs] == [r.dtype for r in refs]
    for out, ref in zip(outs, refs):
        err = (out.float() - ref.float()).abs().max() / ref.float().abs().max()
        assert err < 5e-3, err


def test_weights_cast_on_every_call_follow_every_change(running_kernels):
    """Under autocast the linear layers' weights are cast, and LPI's norm's
    running scale and shift derived, on every call from the weights as
    they are: a weight or statistic updated in place, written through
    ``.data`` (as mmengine's EMAHook and mmdet's MeanTeacherHook write
    theirs, unseen by version counters), a layer replaced and a hook added
    are each seen on the next call, as the straightforward computation
    sees them. The blocks up to the one changed (levels 0 and 1): the
    interpreted kernels' time grows with the blocks."""
    model = narrow(out_levels=(0, 1)).eval()
    x = torch.randn(1, 3, 64, 96)
    block = model.blocks[1]

    def assert_as_straightforward():
        with torch.no_grad(), fast_path(fused_kernels=False), \
                torch.autocast('cpu', dtype=torch.float16):
            for out, ref in zip(model(x), reference(model, x)):
                err = (out - ref).float().abs().max() / ref.abs().max()
                assert err < 5e-3, err
    assert_as_straightforward()
    with torch.no_grad():
        block.attn.qkv.weight.mul_(-1)
        block.mlp.fc2.bias.add_(1)
        block.local_mp.bn.running_var.mul_(3)
    assert_as_straightforward()
    block.attn.proj.weight.data.mul_(-1)
    block.mlp.fc1.bias.data.add_(1)
    block.local_mp.bn.running_mean.data.add_(0.5)
    block.local_mp.bn.weight.data.mul_(2)
    assert_as_straightforward()
    block.mlp.fc1 = torch.nn.Linear(block.mlp.fc1.in_features,
                                    block.mlp.fc1.out_features)
    assert_as_straightforward()
    calls = []
    block.attn.proj.register_forward_hook(lambda *_: calls.append(1))
    assert_as_straightforward()
    assert len(calls) == 2  # the fast path's call and the reference's


def training_launches(model, x, setting, dtype):
    """What a training step of ``model`` on ``x`` launches, forward and
    backward (gradients set to None before it, as the optimizer wrappers
    do), under the fast-path ``setting`` and autocast to ``dtype``; the
    Triton kernels are not interpreted (slow, and what they compute is
    tested elsewhere), nor are the probes' (a step before the counted one
    probes them)."""
    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast('cpu', dtype=dtype or torch.float32,
                            enabled=dtype is not None):
            outs = model(x)
        sum(o.float().sum() for o in outs).backward()
    with fast_path(setting, fused_kernels=False):
        with Launches(model, interpret=False):
            step()  # the kernels' probes, once
        with Launches(model, interpret=False) as counter:
            step()
    return sum(counter.counts.values())


def test_training_steps_launch_fewer_kernels_on_cudas_path(cudas_path):
    """A training step of XCiT-N12 (4 blocks, 32x48, batch 2) under fp16
    autocast, as the recipes train on GPUs, on CUDA's path launches no
    more than was counted when these were written: 357 against 683 for the
    straightforward computation. The pyramid's levels that have their size
    already are not cropped (a crop's backward copies into zeros), the
    MLP's layer scale goes with the residual in one pass (folded into fc2
    it had launched two products, their backward and a sum more), and XCA's
    and the MLP's weights and biases are cast together, the pre-norms
    write autocast's dtype, and XCA's and the MLP's layer-scaled residuals
    take their gradients in three launches where addcmul's backward takes
    six, and the up-sampler is nn.ConvTranspose2d (465 launches before
    these; 278 against 522 in fp32)."""
    model = randomized().train()
    x = torch.randn(2, 3, 32, 48)
    fast = training_launches(model, x, True, torch.float16)
    straightforward = training_launches(model, x, False, torch.float16)
    print(f'launches per training step: {fast} (straightforward: '
          f'{straightforward})')
    assert fast <= 357 and fast < straightforward


def test_host_time_tool_times_cudas_path_with_its_kernels(monkeypatch,
                                                         tmp_path):
    """benchmarks/probes/host_time.py, the host's time of CUDA's eager path
    measured on the CPU: it takes the policy's CUDA column itself, its
    default rows go through the Triton kernels (counted, not run), a
    training step through more of them than an inference call, and its
    straightforward rows through none; every row timed, printed and
    written."""
    import json
    # what the tool sets in this process, put back afterwards
    monkeypatch.setattr(policy, 'KERNEL_DEVICES', policy.KERNEL_DEVICES)
    for part, devices in policy.POLICY.items():
        monkeypatch.setitem(policy.POLICY, part, devices)
    threads = torch.get_num_threads()
    try:
        proc = run_tool_here('benchmarks/probes/host_time.py', '--arch',
                             'nano_12_p16', '--width', '32', '--rounds',
                             '1', '--steps', '1', '--out', tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in
            (tmp_path / 'host_time.jsonl').read_text().splitlines()]
    kernels = {(r['mode'], r['config']): r['triton_kernels'] for r in rows}
    assert kernels.keys() == {(m, c) for m in ('train', 'infer')
                              for c in ('default', 'straightforward')}
    assert kernels['train', 'default'] > kernels['infer', 'default'] > 0
    assert kernels['train', 'straightforward'] == \
        kernels['infer', 'straightforward'] == 0
    assert all(r['ms'] > 0 for r in rows)
    assert proc.stdout.count(' Triton kernels') == 4


def test_weights_cast_together_are_each_cast(running_kernels, monkeypatch):
    """In training under autocast the linear layers' weights and biases are
    cast together (two launches each way for a module's four, where
    autocast launches one per tensor): a block's training step computes
    bit for bit what it computes with each tensor cast by itself, its
    output, every gradient (in its parameter's dtype and layout) and
    BatchNorm's running statistics."""
    block = narrow().blocks[1].train()
    ref_block = copy.deepcopy(block)
    H, W = 3, 4
    x = torch.randn(1, H * W, block.norm1.normalized_shape[0])

    def step(m):
        with fast_path(fused_kernels=False), \
                torch.autocast('cpu', dtype=torch.float16):
            out = m(x, H, W)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() \
            .backward()
        return out, {n: p.grad for n, p in m.named_parameters()}

    together = casts._CastTogether.apply
    calls = []
    monkeypatch.setattr(casts._CastTogether, 'apply', lambda *a: (
        calls.append(len(a) - 1) or together(*a)))
    out, grads = step(block)
    assert calls == [4, 4]  # XCA's and the MLP's
    monkeypatch.setattr(casts._CastTogether, 'apply', lambda dtype, *ts: (
        tuple(t.to(dtype) for t in ts)))
    ref, ref_grads = step(ref_block)
    assert torch.equal(out, ref)
    assert grads.keys() == ref_grads.keys()
    params = dict(block.named_parameters())
    for name, ref in ref_grads.items():
        assert torch.equal(grads[name], ref), name
        assert grads[name].stride() == params[name].stride(), name
    for (name, buf), ref in zip(block.named_buffers(), ref_block.buffers()):
        assert torch.equal(buf, ref), name


def test_autocast_weights_of_layers_with_and_without_bias():
    """Each layer's (weight, bias) in autocast's dtype, a missing bias
    None, in training as in inference; values and gradients those of a cast
    per tensor; in inference cast anew on every call."""
    layers = (torch.nn.Linear(4, 6), torch.nn.Linear(6, 3, bias=False))
    cast = casts.autocast_weights(layers, torch.float16)
    (w1, b1), (w2, b2) = cast
    assert b2 is None and w1.requires_grad and w2.requires_grad
    for got, layer_tensor in ((w1, layers[0].weight), (b1, layers[0].bias),
                              (w2, layers[1].weight)):
        assert got.dtype == torch.float16 and \
            torch.equal(got, layer_tensor.half())
    (w1.float().sum() * 2 + b1.float().sum() * 3 + w2.float().sum()) \
        .backward()
    assert torch.equal(layers[0].weight.grad, torch.full((6, 4), 2.))
    assert torch.equal(layers[0].bias.grad, torch.full((6,), 3.))
    assert torch.equal(layers[1].weight.grad, torch.ones(3, 6))
    with torch.no_grad():
        first = casts.autocast_weights(layers, torch.float16)
        assert first[1][1] is None and not first[0][0].requires_grad
        layers[0].weight.data.mul_(2)
        again = casts.autocast_weights(layers, torch.float16)
    assert torch.equal(again[0][0], layers[0].weight.half())
    assert torch.equal(again[0][0], first[0][0] * 2)


@pytest.mark.parametrize('branch_dtype', [torch.float32, torch.float16])
@pytest.mark.parametrize('needs', [(True, True, True), (False, True, False),
                                   (True, False, True)])
def test_scaled_residual_is_addcmul_with_a_shorter_backward(branch_dtype,
                                                            needs):
    """``x + gamma * y`` in one pass: ``torch.addcmul``'s output and, bit
    for bit, its gradients (``y``'s in ``y``'s dtype) for whichever of the
    three record them; without autograd, ``addcmul`` itself."""
    from xcit_dense.models.ops.residual import scaled_residual
    torch.manual_seed(0)
    x, gamma, y = torch.randn(2, 7, 16), torch.rand(16) + 0.5, \
        torch.randn(2, 7, 16).to(branch_dtype)
    grad = torch.randn(2, 7, 16)

    def run(fn):
        inputs = [t.detach().requires_grad_(need)
                  for t, need in zip((x, gamma, y), needs)]
        out = fn(*inputs)
        recorded = [t for t in inputs if t.requires_grad]
        return (out, *torch.autograd.grad(out, recorded, grad))
    got, ref = run(scaled_residual), run(torch.addcmul)
    assert got[0].grad_fn.name() == '_ScaledResidualBackward'
    assert all(g.dtype == r.dtype and torch.equal(g, r)
               for g, r in zip(got, ref))
    with torch.no_grad():
        assert torch.equal(scaled_residual(x, gamma, y),
                           torch.addcmul(x, gamma, y))
