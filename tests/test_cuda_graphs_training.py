"""Training steps replayed from CUDA graphs (``XCiT(cuda_graphs='train')``,
xcit_dense/models/execution/cuda_graphs/training.py): when a step is
captured, that its gradients and BatchNorm statistics are an eager step's,
and when it runs eagerly instead. On the CPU with a stand-in for
``torch.cuda.make_graphed_callables`` (its warm-up iterations, then one
autograd node whose forward and backward run the step as it was captured,
between the graph's static input, outputs and gradient buffers:
tests/conftest.py, ``training_replays``); a real capture needs CUDA:
tests/test_cuda.py."""
import copy
import logging
import queue
from functools import partial

import pytest
import torch

from xcit_dense import XCiT
from xcit_dense.models import policy
from xcit_dense.models.execution import cuda_graphs
from xcit_dense.models.execution.cuda_graphs import capture, keys

from conftest import BROKEN_CAPTURE, STAND_IN_REPLAYS, broken_capture, logged
from tool_runs import run_tool_here

X = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def replays(training_replays):
    return training_replays


def model(cuda_graphs='train', **kwargs):
    """XCiT-N12's first 4 blocks, 64 channels wide in two heads of its
    width (what the graphs capture and replay does not depend on it)."""
    torch.manual_seed(0)
    return XCiT('nano_12_p16', depth=4, out_indices=(0, 1, 2, 3),
                embed_dim=64, num_heads=2, cuda_graphs=cuda_graphs,
                **kwargs).train()


def step(net, optimizer, x=X):
    """A training step: outputs, the parameters' gradients."""
    optimizer.zero_grad(set_to_none=True)
    outs = net(x)
    sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).mean()
        for o in outs).backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters()
             if p.grad is not None}
    optimizer.step()
    return outs, grads


def same_buffers(net, eager):
    for (name, a), b in zip(net.named_buffers(), eager.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def same_steps(net, eager, opts, x=X):
    """A step of each model (``opts``: their optimizers): the same outputs,
    gradients and BatchNorm statistics; ``net``'s outputs."""
    outs, grads = step(net, opts[0], x)
    ref_outs, ref_grads = step(eager, opts[1], x)
    for out, ref in zip(outs, ref_outs):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4,
                                   atol=1e-6, msg=name)
    same_buffers(net, eager)
    return outs


def test_steps_that_repeat_are_replayed_as_eager_steps(replays,
                                                       monkeypatch):
    """The third step of an input is captured and replayed from then on,
    the graph launched before the model is looked at (on a GPU, the CPU's
    walk over the modules runs while the GPU replays); outputs, gradients,
    parameters after the optimizer and BatchNorm's running statistics are
    the eager steps' (the capture's warm-up iterations leave no trace), for
    other images of the size too, and each step's outputs stay the
    caller's (the next replay writes the graph's own)."""
    order = []
    fingerprint = keys.fingerprint
    monkeypatch.setattr(keys, 'fingerprint', lambda net: order.append(
        len(replays)) or fingerprint(net))  # replays launched before a look
    net, eager = model(), model(cuda_graphs=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (net, eager)]
    held = []
    for i in range(5):
        outs = same_steps(net, eager, opts, X.roll(i, -1))
        held.append((outs, [o.detach().clone() for o in outs]))
        assert net.training_graphs.captures == (i >= 2)
    for outs, copies in held:
        for out, copied in zip(outs, copies):
            torch.testing.assert_close(out, copied, rtol=0, atol=0)
    # not looked at before an input's second step
    assert len(replays) == 3 and order == [0, 0, 2, 3]
    opt = opts[0]
    # a new size is seen anew; inference is not a training step
    step(net, opt, X[:1])
    with torch.no_grad():
        net.eval()(X)
    assert len(replays) == 3 and net.training_graphs.captures == 1


def test_a_second_forward_before_the_backward_runs_eagerly(replays):
    """Two forwards before one backward (the replay would overwrite what
    the first one's backward needs): the second runs eagerly, and both
    backwards give the eager gradients; after that, replays again."""
    net, eager = model(), model(cuda_graphs=False)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    for _ in range(3):
        step(net, opt)
    assert len(replays) == 1

    def two_forwards(m):
        m.zero_grad(set_to_none=True)
        a, b = m(X), m(X * 0.5)
        (sum(o.sum() for o in a) + sum((o ** 2).sum() for o in b)
         ).backward()
        return {n: p.grad for n, p in m.named_parameters()
                if p.grad is not None}
    grads, ref = two_forwards(net), two_forwards(eager)
    for _ in range(2):  # eager's BatchNorm statistics caught up
        step(eager, torch.optim.SGD(eager.parameters(), lr=0.0))
    assert len(replays) == 2  # the first of the two forwards only
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref[name], rtol=1e-4, atol=1e-6,
                                   msg=name)
    step(net, opt)
    assert len(replays) == 3
    # outputs dropped without a backward free the graph for the next step
    net(X)
    step(net, opt)
    assert len(replays) == 5


def same_gradients(net, eager):
    grads = {n: p.grad for n, p in net.named_parameters()
             if p.grad is not None}
    ref = {n: p.grad for n, p in eager.named_parameters()
           if p.grad is not None}
    assert grads.keys() == ref.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref[name], rtol=1e-4, atol=1e-6,
                                   msg=name)


def test_gradients_accumulate_as_eager_ones(replays):
    """Two replayed backwards into ``.grad`` zeroed in place (gradient
    accumulation, ``zero_grad(set_to_none=False)``): the sum of the two
    steps' gradients, as eagerly, although the graph computes each into the
    same buffers."""
    net, eager = model(), model(cuda_graphs=False)
    for _ in range(3):
        for m in (net, eager):
            step(m, torch.optim.SGD(m.parameters(), lr=0.0))
    assert len(replays) == 1
    for m in (net, eager):
        m.zero_grad(set_to_none=False)
        for scale in (1.0, 0.5):
            sum(o.sum() for o in m(X * scale)).backward()
    assert len(replays) == 3
    same_gradients(net, eager)


def test_a_parameter_unfrozen_after_the_capture_gets_its_gradient(
        replays):
    """A graph computes the gradients of the parameters that required them
    at its capture: one unfrozen later is a new model, captured anew, and
    gets its gradient meanwhile; the old graph, launched before the model
    was looked at, is dropped with its BatchNorm update undone."""
    net, eager = model(), model(cuda_graphs=False)
    for m in (net, eager):
        m.blocks[0].requires_grad_(False)
    for _ in range(3):
        for m in (net, eager):
            step(m, torch.optim.SGD(m.parameters(), lr=0.0))
    assert len(replays) == 1
    for m in (net, eager):
        m.blocks[0].requires_grad_(True)
        step(m, torch.optim.SGD(m.parameters(), lr=0.0))
    assert len(replays) == 2  # launched, dropped: the step ran eagerly
    assert net.blocks[0].attn.qkv.weight.grad is not None
    same_gradients(net, eager)
    same_buffers(net, eager)
    # the next step looks first (no graph launched until one is the
    # model's) and, the model unchanged since the step before, captures it
    step(net, torch.optim.SGD(net.parameters(), lr=0.0))
    assert len(replays) == 3 and net.training_graphs.captures == 2


def test_what_cannot_be_captured_runs_eagerly_and_says_so_once(
        replays, monkeypatch):
    net = model(with_cp=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with logged() as messages:
        for _ in range(4):
            step(net, opt)
    assert replays == [] and net.training_graphs.captures == 0
    assert len(messages) == 1 and 'with_cp' in messages[0]
    assert "cuda_graphs=True to graph inference only" in messages[0]

    monkeypatch.setattr(cuda_graphs.GraphedTraining, 'capture',
                        staticmethod(broken_capture))
    net, eager = model(), model(cuda_graphs=False)
    with logged() as messages:
        for _ in range(4):
            outs, _ = step(net, torch.optim.SGD(net.parameters(), lr=0.0))
    ref, _ = step(eager, torch.optim.SGD(eager.parameters(), lr=0.0))
    assert len(messages) == 1
    assert 'capturing a training step ' in messages[0]
    assert BROKEN_CAPTURE.search(messages[0]), messages[0]
    for (name, a), b in zip(net.named_buffers(), eager.buffers()):
        if name.endswith('num_batches_tracked'):
            assert a == 4 and b == 1
    assert net.training_graphs.failure is not None


def test_only_train_graphs_training_steps(replays):
    net = model(cuda_graphs=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for _ in range(4):
        step(net, opt)
    assert replays == [] and net.training_graphs.captures == 0
    copied = copy.deepcopy(model())
    assert copied.training_graphs.captures == 0
    with pytest.raises(ValueError, match="'train' \\(training steps too\\)"):
        XCiT('nano_12_p16', cuda_graphs='training')


def captured_and_eager():
    """A model whose training step was captured after 3 steps, an eager
    one that took the same steps, and their optimizers."""
    net, eager = model(), model(cuda_graphs=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (net, eager)]
    for _ in range(3):
        for m, opt in zip((net, eager), opts):
            step(m, opt)
    assert net.training_graphs.captures == 1
    return net, eager, opts


def test_a_replaced_module_runs_as_written(replays):
    """A branch replaced after its step was captured runs through its own
    forward: the steps after the replacement are an eager model's with the
    same replacement (eager until the new model's step is seen 3 times,
    then captured anew)."""
    class Scaled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return 2 * self.inner(*args)

    net, eager, opts = captured_and_eager()
    for m in (net, eager):
        m.blocks[1].mlp = Scaled(m.blocks[1].mlp)
    for i in range(3):
        same_steps(net, eager, opts)
    assert net.training_graphs.captures == 2


def test_a_hook_below_runs_the_steps_eagerly(replays):
    """A forward and a backward hook registered after the step was
    captured (an activation and a gradient recorder, as Grad-CAM's) are
    called on every step, which runs eagerly as an eager model's with the
    same hooks, until they are removed; then the graph replays again."""
    net, eager, opts = captured_and_eager()
    seen = {net: [], eager: []}
    handles = []
    for m in (net, eager):
        def record(*args, m=m, kind):
            if not STAND_IN_REPLAYS:  # a GPU's replay calls no Python
                seen[m].append(kind)
        conv = m.blocks[2].local_mp.conv1
        handles += [
            conv.register_forward_hook(partial(record, kind='forward')),
            conv.register_full_backward_hook(
                partial(record, kind='backward'))]
    launched = len(replays)
    for _ in range(3):
        same_steps(net, eager, opts)
    assert seen[net] == seen[eager] == ['forward', 'backward'] * 3
    assert net.training_graphs.captures == 1
    assert len(replays) - launched == 1  # before the first look, dropped
    for handle in handles:
        handle.remove()
    launched = len(replays)
    for _ in range(4):  # captured anew (a full backward hook leaves a flag)
        same_steps(net, eager, opts)
    assert len(replays) > launched


def penalty_step(net, optimizer, of='input'):
    """A gradient penalty's step: the gradient of a loss ``of`` the input
    or the weights recorded (``create_graph=True``), its squared norm
    differentiated; the parameters' gradients."""
    optimizer.zero_grad(set_to_none=True)
    x = X.clone().requires_grad_(of == 'input')
    loss = sum((o ** 2).mean() for o in net(x))
    wrt = [x] if of == 'input' else [p for n, p in net.named_parameters()
                                     if n.endswith('fc2.weight')]
    grads = torch.autograd.grad(loss, wrt, create_graph=True)
    (loss + sum(g.pow(2).sum() for g in grads)).backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters()
             if p.grad is not None}
    optimizer.step()
    return grads


@pytest.mark.parametrize('cuda_graphs', ['train', 'auto'])
def test_second_derivatives_keep_the_steps_eager(replays, monkeypatch,
                                                  cuda_graphs):
    """A gradient penalty from the first step (a replay's backward, once
    differentiable as PyTorch's, could not give its second derivatives):
    no step is captured, each is an eager model's, and the graphs' stop
    is said once (a warning when asked for by name, an INFO line under
    'auto')."""
    monkeypatch.setitem(policy.GRAPHS, 'cpu', frozenset({'infer', 'train'}))
    net, eager = model(cuda_graphs), model(cuda_graphs=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (net, eager)]
    level = logging.WARNING if cuda_graphs == 'train' else logging.INFO
    with logged(level=level) as messages:
        for i in range(5):  # a weights' penalty 4 times in a row
            of = 'weights' if i else 'input'
            grads, ref = (penalty_step(m, o, of)
                          for m, o in zip((net, eager), opts))
            assert grads.keys() == ref.keys()
            for name, grad in grads.items():
                torch.testing.assert_close(grad, ref[name], rtol=1e-4,
                                           atol=1e-6, msg=name)
    assert replays == [] and net.training_graphs.captures == 0
    assert len(messages) == 1 and 'create_graph=True' in messages[0]


def test_second_derivatives_after_a_capture_stop_the_replays(replays):
    """A penalty of the weights' gradient first taken after the steps were
    captured (the input as in the captured steps, so the step replays):
    the replay's backward is computed once (PyTorch's), so that step
    stops with a message that says so; the steps after it run eagerly, as
    an eager model's."""
    net, eager, opts = captured_and_eager()
    launched = len(replays)
    with pytest.raises(RuntimeError, match='cuda_graphs=True'):
        penalty_step(net, opts[0], of='weights')
    assert len(replays) == launched + 1
    eager(X)  # the forward that ran (its BatchNorm statistics), no step
    launched = len(replays)
    with logged(level=logging.WARNING) as messages:
        for _ in range(4):
            same_steps(net, eager, opts)
    assert len(replays) == launched and len(messages) == 1


def test_auto_captures_steps_that_repeat_in_a_row(replays, monkeypatch):
    """``cuda_graphs='auto'`` where the policy lists training: sizes that
    alternate run eagerly (multi-scale training) and the model is not
    looked at for them; a size's third step in a row is captured and
    replayed as an eager step; a second size captured drops the first
    graph (one kept); a model that changes between steps is not
    captured."""
    monkeypatch.setitem(policy.GRAPHS, 'cpu', frozenset({'infer', 'train'}))
    looks = []
    fingerprint = keys.fingerprint
    monkeypatch.setattr(keys, 'fingerprint',
                        lambda net: looks.append(1) or fingerprint(net))
    net, eager = model('auto'), model(cuda_graphs=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (net, eager)]
    small = X[..., :32, :48]
    for x in (X, small) * 3:
        for m, opt in zip((net, eager), opts):
            step(m, opt, x)
    assert net.training_graphs.captures == 0 and not looks
    for i in range(4):
        same_steps(net, eager, opts)
        assert net.training_graphs.captures == (i >= 2)
    assert len(replays) == 2
    for _ in range(3):
        step(net, opts[0], small)
    assert net.training_graphs.captures == 2
    assert len(net.training_graphs.graphs) == 1

    class Counting(torch.nn.Module):  # sets an attribute on every call
        def __init__(self, inner):
            super().__init__()
            self.inner, self.calls = inner, 0

        def forward(self, *args):
            self.calls += 1
            return self.inner(*args)

    net.blocks[0].mlp = Counting(net.blocks[0].mlp)
    for _ in range(4):
        step(net, opts[0], small)
    # the graph launched on the first of them only, and dropped
    assert net.training_graphs.captures == 2 and len(replays) == 4


def test_auto_runs_what_cannot_be_captured_eagerly_with_a_note(
        replays, monkeypatch):
    """Under ``'auto'`` a model that cannot be captured (gradient
    checkpointing, SyncBN between processes) says so once at INFO level,
    without a warning: the user did not ask for graphs by name."""
    monkeypatch.setitem(policy.GRAPHS, 'cpu', frozenset({'infer', 'train'}))
    net = model('auto', with_cp=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with logged(level=logging.WARNING) as warnings, \
            logged(level=logging.INFO) as notes:
        for _ in range(4):
            step(net, opt)
    assert replays == [] and net.training_graphs.captures == 0
    assert warnings == [] and len(notes) == 1
    assert 'with_cp' in notes[0] and 'Set ' not in notes[0]


@pytest.fixture
def pinning_loader(monkeypatch):
    """A torch DataLoader with ``pin_memory=True`` and a worker, iterated:
    its pinning thread started by the DataLoader itself, as on a GPU
    machine (the accelerator's presence faked, the thread's loop a
    stand-in that passes the batches on unpinned); stopped at the end."""
    from torch.utils.data import DataLoader
    from torch.utils.data._utils import pin_memory

    def _pin_memory_loop(in_queue, out_queue, device_id, done, device):
        while not done.is_set():
            try:
                out_queue.put(in_queue.get(timeout=0.1))
            except queue.Empty:
                pass

    monkeypatch.setattr(pin_memory, '_pin_memory_loop', _pin_memory_loop)
    monkeypatch.setattr(torch.accelerator, 'is_available', lambda: True)
    monkeypatch.setattr(torch.accelerator, 'current_accelerator',
                        lambda: torch.device('cuda'))
    monkeypatch.setattr(torch.accelerator, 'current_device_index', lambda: 0)
    batches = iter(DataLoader(range(8), num_workers=1, pin_memory=True))
    next(batches)
    yield batches
    list(batches)  # at its end the iterator stops its worker and thread
    assert not cuda_graphs.pinning_threads()


def test_a_pinning_data_loader_keeps_training_steps_eager(
        replays, pinning_loader, monkeypatch):
    """While a data loader pins memory in a thread of its own, a capture in
    CUDA's global mode (``make_graphed_callables`` without
    ``capture_error_mode``) would be broken by the thread's allocations,
    which would fail too and end the run at the loader's next batch: the
    training steps run eagerly, said once; a thread-local capture is taken
    beside it."""
    assert cuda_graphs.pinning_threads(), 'the DataLoader named it anew'
    monkeypatch.setattr(capture, 'TRAINING_CAPTURE_THREAD_LOCAL', False)
    net, eager = model(), model(cuda_graphs=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (net, eager)]
    with logged(level=logging.WARNING) as messages:
        for _ in range(4):
            same_steps(net, eager, opts)
    assert replays == [] and net.training_graphs.captures == 0
    assert len(messages) == 1 and 'pin_memory=True' in messages[0], messages
    assert '_pin_memory_loop' in messages[0]

    monkeypatch.setattr(capture, 'TRAINING_CAPTURE_THREAD_LOCAL', True)
    net = model()
    with logged(level=logging.WARNING) as messages:
        for _ in range(4):
            step(net, opts[0])
    assert messages == [] and net.training_graphs.captures == 1
    assert len(replays) == 2


def test_a_capture_runs_the_step_on_leaves_of_its_own():
    """What a capture records: the step as a function of its input and of
    new leaves on the parameters' memory (in-place updates of a parameter
    are read through them), not of the parameters, whose gradient
    accumulators the last step's outputs may still hold on another stream
    (the H200 failed such captures): the same outputs, gradients of the
    leaves equal to the parameters', no hook of the parameters on them,
    and the parameters themselves untouched."""
    net = model(cuda_graphs=False)
    net.blocks[0].mlp.fc1.weight.requires_grad_(False)
    x = X.clone()
    outs = net(x)  # held: its graph holds the parameters' accumulators
    held = {n: p for n, p in net.named_parameters()}
    step = cuda_graphs.Step(net, net._forward_pyramid)
    run, leaves, params = cuda_graphs.on_leaves_of_its_own(step)
    assert all(a is b for a, b in zip(params, net.parameters()))
    assert all(leaf.is_leaf and leaf is not p and
               leaf.data_ptr() == p.data_ptr() and
               leaf.requires_grad == p.requires_grad and
               leaf._backward_hooks is None
               for leaf, p in zip(leaves, params))
    with torch.no_grad():
        net.blocks[1].attn.qkv.weight.mul_(-1)  # read through the leaves
    got = run(x, *leaves)
    ref = net._forward_pyramid(x)
    weights = [torch.linspace(-1, 1, o.numel()).view_as(o) for o in ref]
    trained = [(leaf, p) for leaf, p in zip(leaves, params)
               if p.requires_grad]
    grads = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(got, weights)),
        [leaf for leaf, _ in trained])
    ref_grads = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(ref, weights)),
        [p for _, p in trained])
    for o, r in zip(got, ref):
        torch.testing.assert_close(o, r, rtol=0, atol=0)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-7)
    assert all(p is held[n] for n, p in net.named_parameters())
    assert all(p.grad is None for p in net.parameters())
    del outs


def test_gradients_handed_on_as_copies_in_their_strides():
    """The replay's gradients leave as copies: a backward that returns its
    graph's own buffer (``make_graphed_callables``' returns
    ``buffer.detach()``) makes that buffer a parameter's ``.grad`` as it
    is, which the next replay would overwrite. Copied together: equal
    values, own memory, each tensor's strides (a transposed one's too),
    None kept."""
    buffer, weight = torch.zeros(3), torch.nn.Parameter(torch.ones(3))

    class Replayed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return w * 1

        @staticmethod
        def backward(ctx, grad):
            return buffer.copy_(grad).detach()
    Replayed.apply(weight).sum().backward()
    assert weight.grad.data_ptr() == buffer.data_ptr()
    grads = (torch.randn(3, 4), None, torch.randn(4, 5).t(),
             torch.randn(2, dtype=torch.float64), torch.randn(6, 1, 1, 1))
    out = cuda_graphs.copies(grads)
    assert out[1] is None and len(out) == len(grads)
    for got, given in zip(out, grads):
        if given is not None:
            assert torch.equal(got, given) and got.dtype == given.dtype
            assert got.stride() == given.stride()
            assert got.data_ptr() != given.data_ptr()
    assert cuda_graphs.copies((None, )) == (None, )


def test_graphs_of_two_sizes_share_one_pool(replays):
    """Two sizes captured (``'train'`` keeps 2 graphs) share one memory
    pool: steps alternating between them are the eager steps (each
    replay's gradients copied out before the other graph writes its
    buffers), and a forward of one size while the other's backward is
    still to come runs eagerly."""
    net, eager = model(), model(cuda_graphs=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (net, eager)]
    small = X[..., :32, :48]
    for x in (X, small) * 4:
        same_steps(net, eager, opts, x)
    assert net.training_graphs.captures == 2 and len(replays) == 4
    assert net.training_graphs.pool is not None

    def two_sizes(m):
        m.zero_grad(set_to_none=True)
        a, b = m(X), m(small)
        (sum(o.sum() for o in a) + sum((o ** 2).sum() for o in b)
         ).backward()
        return {n: p.grad for n, p in m.named_parameters()
                if p.grad is not None}
    grads, ref = two_sizes(net), two_sizes(eager)
    assert len(replays) == 5  # the first forward only
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref[name], rtol=1e-4, atol=1e-6,
                                   msg=name)


def test_train_keeps_the_graphs_of_the_inputs_that_come_most(replays):
    """``cuda_graphs='train'`` with three sizes recurring as often and two
    graphs kept: the third runs eagerly rather than each capture evicting
    a graph captured again soon after (a capture costs about four steps);
    every step is an eager step."""
    net, eager = model(), model(cuda_graphs=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (net, eager)]
    a, b, c = X[..., :32, :32], X[..., :32, :48], X[..., :48, :32]
    for x in (a, b, c) * 4:
        same_steps(net, eager, opts, x)
    assert net.training_graphs.captures == 2
    assert [key[0] for key in net.training_graphs.graphs] == \
        [tuple(a.shape), tuple(b.shape)]


def test_launch_delay_tool_times_a_replayed_step():
    """``benchmarks/probes/launch_delay.py`` (docs/performance.md quotes it)
    captures the third step and times the steps' calls to their launch;
    its stand-in capture is undone after it."""
    import re
    capture = cuda_graphs.GraphedTraining.__dict__['capture']
    proc = run_tool_here('benchmarks/probes/launch_delay.py', '--arch',
                         'nano_12_p16', '--steps', '14')
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'call to launch ([\d.]+) ms \(median of 4 steps\), '
                      r'fingerprint ([\d.]+) ms, nano_12_p16, captures 1',
                      proc.stdout)
    assert found and float(found[1]) > 0 and float(found[2]) > 0, \
        proc.stdout
    assert keys.DEVICES == ('cuda', )
    assert cuda_graphs.GraphedTraining.__dict__['capture'] is capture
