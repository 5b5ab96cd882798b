"""Inference replayed from CUDA graphs (``XCiT(cuda_graphs=True)``,
xcit_dense/models/execution/cuda_graphs/inference.py): when a forward is
captured, when it is replayed, and that nothing the model is changed into
is bypassed. On the CPU with a stand-in for the capture that replays the
forward as it was captured, from the graph's static input into its static
outputs (tests/conftest.py, ``inference_replays``; a real capture needs
CUDA: tests/test_cuda.py)."""
import copy
import io
import logging

import pytest
import torch
import torch.nn as nn

from xcit_dense import XCiT, fast_path
from xcit_dense.models import policy
from xcit_dense.models.execution import cuda_graphs, graphed
from xcit_dense.models.execution.cuda_graphs import inference, keys, recurrence

from conftest import BROKEN_CAPTURE, STAND_IN_REPLAYS, broken_capture, logged
from tool_runs import run_tool_here

X = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def replays(inference_replays):
    return inference_replays


def model(cuda_graphs=True):
    torch.manual_seed(0)
    return XCiT('nano_12_p16', depth=4, out_indices=(0, 1, 2, 3),
                cuda_graphs=cuda_graphs).eval()


class Wrapped(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return self.inner(*args)


def infer(net, x=X):
    with torch.no_grad():
        return net(x)


def test_one_capture_per_signature_then_replays(replays):
    """A shape, dtype, autocast state, inference mode, TF32 setting or
    switch seen before is replayed; a new one is captured; the outputs are
    the eager forward's (of each input: other images of a size seen before
    are copied into the graph's input)."""
    net = model()
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    small = torch.randn(2, 3, 32, 48)
    for x, captures in ((X, 1), (X.flip(-1), 1), (small, 2), (X, 2)):
        for out, ref in zip(infer(net, x), infer(eager, x)):
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
        assert net.graphs.captures == captures
    assert len(replays) == 4
    with torch.autocast('cpu', dtype=torch.bfloat16):
        infer(net)
    assert net.graphs.captures == 3
    with fast_path(False):
        infer(net)
    assert net.graphs.captures == 4
    infer(net)
    assert net.graphs.captures == 4
    with torch.inference_mode():
        net(X)
    assert net.graphs.captures == 5
    infer(net)  # writes the no-grad graph's own input
    assert net.graphs.captures == 5
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not tf32
        infer(net)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert net.graphs.captures == 6
    infer(net)
    assert net.graphs.captures == 6


def test_a_changed_model_is_captured_anew(replays, monkeypatch):
    """A module replaced or wrapped, an instance-level forward or other
    method, a plain attribute edited, a parameter given new storage: each
    captures anew. In-place updates of parameters are what a real replay
    reads, so they capture nothing."""
    monkeypatch.setattr(inference, 'MAX_CHANGES', 100)  # a change a call
    net = model()
    infer(net)
    block = net.blocks[0]
    changes = [
        lambda: setattr(block, 'mlp', copy.deepcopy(block.mlp)),
        lambda: setattr(block, 'local_mp', Wrapped(block.local_mp)),
        lambda: setattr(block.mlp, 'forward', block.mlp.forward),
        lambda: setattr(net, '_forward_pyramid', net._forward_pyramid),
        lambda: setattr(block.local_mp.inner.act, 'approximate', 'tanh'),
        lambda: setattr(block.norm1.weight, 'data',
                        block.norm1.weight.data.clone()),
        lambda: setattr(block, 'gamma2',
                        nn.Parameter(block.gamma2.detach().clone())),
        lambda: block.gamma1.data.mul_(2),  # in place: no new capture
    ]
    captures = net.graphs.captures
    for i, change in enumerate(changes):
        old = [p.data_ptr() for p in net.parameters()]
        change()
        out = infer(net)  # the last graph launched first, its outputs dropped
        expected = captures + (i < len(changes) - 1)
        assert net.graphs.captures == expected, i
        captures = expected
        net.cuda_graphs = False
        for o, ref in zip(out, infer(net)):  # the changed model's
            torch.testing.assert_close(o, ref, rtol=0, atol=0)
        net.cuda_graphs = True
        # each graph holds the memory it reads, whatever was freed since
        held = {s.data_ptr() for g in net.graphs.graphs.values()
                for s in g[-1][1]}
        assert set(old) <= held, i


@pytest.mark.parametrize('register,called', [
    (lambda m: m.blocks[0].attn.register_forward_hook, 1),
    (lambda m: m.blocks[1].mlp.fc1.register_forward_pre_hook, 1),
    (lambda m: m.fpn1[0].register_full_backward_hook, 0),  # no gradient
    (lambda m: nn.modules.module.register_module_forward_hook, 100),
], ids=['forward', 'pre', 'backward', 'global'])
def test_hooks_below_the_model_run_it_eagerly(replays, register, called):
    """A hook below the model (a feature extractor's forward hook, a
    module's or a global one, or a backward hook) is called on every
    forward: the model runs eagerly while it is registered (a replay would
    not call it; the graph launched before the first look found it has its
    outputs dropped, and none is launched while it stays), and replays
    again once it is removed; the model's own hooks are called around its
    forward, replayed or not."""
    net = model()
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    for _ in range(3):
        infer(net)
    captures = net.graphs.captures
    calls = []

    def hook(*args):
        if not STAND_IN_REPLAYS:  # a GPU's replay calls no Python
            calls.append(1)
    handle = register(net)(hook)
    try:
        net.cuda_graphs = False
        infer(net)
        per_forward, calls[:] = len(calls), []  # calls of one forward
        net.cuda_graphs = True
        replayed = len(replays)
        for _ in range(4):
            out = infer(net)
    finally:
        handle.remove()
    assert per_forward == called or per_forward > called > 1
    assert len(calls) == 4 * per_forward  # each forward eager
    assert net.graphs.captures == captures
    # a replay launched (and dropped) before the first look found the
    # hook; none after it while the hook stays
    assert len(replays) - replayed == 1
    for o, ref in zip(out, infer(eager)):  # to rounding: the hooked part
        torch.testing.assert_close(o, ref)  # computed the straightforward way
    replayed = len(replays)
    infer(net)
    assert len(replays) > replayed  # (a capture first where registering
    # the hook left an attribute: a full backward hook's flag)
    own = net.register_forward_hook(lambda *args: calls.append(1))
    calls.clear()
    infer(net)
    own.remove()
    assert calls == [1] and len(replays) > replayed + 1


def test_the_model_is_looked_at_while_the_last_graph_replays(
        replays, monkeypatch):
    """The graph last used for an input is launched before the model's
    fingerprint is taken (on a GPU, the CPU's walk over the modules runs
    while the GPU replays)."""
    order = []
    fingerprint = keys.fingerprint

    def logged_fingerprint(model):
        order.append(len(replays))  # replays launched before each look
        return fingerprint(model)
    monkeypatch.setattr(keys, 'fingerprint', logged_fingerprint)
    net = model()
    for _ in range(3):
        infer(net)
    assert order == [0, 2, 3] and len(replays) == 3
    assert net.graphs.captures == 1


def test_only_inference_is_graphed(replays):
    """Training mode and a forward with gradients run as they are; a copy
    or a pickled model starts without graphs."""
    net = model()
    net(X)
    infer(net.train())
    assert net.graphs.captures == 0 and not replays
    net.eval()
    infer(net)
    assert net.graphs.captures == 1
    assert copy.deepcopy(net).graphs.captures == 0
    buffer = io.BytesIO()
    torch.save(net, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=False).graphs.graphs == {}
    assert model(cuda_graphs=False) is not None
    with pytest.raises(ValueError, match='cuda_graphs must be True'):
        XCiT('nano_12_p16', cuda_graphs='yes')


def test_a_trace_is_not_replayed(replays):
    """A ``torch.jit`` trace (FLOP counters, tools/get_flops.py) of a model
    that replays runs the forward itself: no replay, no capture, the
    forward's operators in the trace."""
    net = model()
    infer(net)
    assert net.graphs.captures == 1
    done = len(replays)
    with torch.no_grad():
        traced = torch.jit.trace(net, X, check_trace=False)
    assert len(replays) == done and net.graphs.captures == 1
    assert any(node.kind() == 'aten::softmax'
               for node in traced.inlined_graph.nodes())
    for out, ref in zip(traced(X), infer(net)):
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_outputs_are_the_callers_and_graphs_are_bounded(replays,
                                                       monkeypatch):
    """The outputs are the caller's: the next replay does not write them,
    nor does writing them change the graph's."""
    net = model()
    first = infer(net)
    reference = [o.clone() for o in first]
    infer(net, X.flip(-1))  # replayed into the graph's own outputs
    for out, ref in zip(first, reference):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    first[0].zero_()
    for out, ref in zip(infer(net), reference):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    monkeypatch.setattr(inference, 'MAX_GRAPHS', 2)
    for h in (32, 48, 64):
        infer(net, torch.randn(1, 3, h, 32))
    # full: a new input replaces the least used graph only if it came
    # twice as often (eager until then)
    assert [key[0][2] for key in net.graphs.graphs] == [64, 32]
    assert net.graphs.captures == 2
    infer(net, torch.randn(1, 3, 48, 32))
    assert [key[0][2] for key in net.graphs.graphs] == [64, 48]


def test_a_model_served_from_several_threads(replays):
    """Threads that call one model at once (a server's pool) each get the
    outputs of their own input: a replay writes its graph's static input
    and outputs, which another thread's replay of the same graph would
    overwrite before the first has copied its outputs out."""
    import sys
    import threading
    net = model()
    inputs = [torch.randn(1, 3, 64, 96, generator=torch.Generator()
                          .manual_seed(i)) for i in range(4)]
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    wanted = [infer(eager, x) for x in inputs]
    infer(net, inputs[0])  # captured
    wrong = []

    def serve(i):
        for _ in range(10):
            got = infer(net, inputs[i])
            if not all(torch.allclose(g, w, rtol=1e-5, atol=1e-5)
                       for g, w in zip(got, wanted[i])):
                wrong.append(i)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    try:
        threads = [threading.Thread(target=serve, args=(i,))
                   for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []
    assert net.graphs.captures == 1 and len(replays) == 41


def warnings_of(net, calls):
    """The eager model's outputs against ``net``'s over ``calls`` calls,
    and the warnings logged meanwhile."""
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    with logged('test_cuda_graphs', logging.WARNING) as messages:
        outs = [infer(net) for _ in range(calls)]
    for out in outs:
        for o, r in zip(out, infer(eager)):
            torch.testing.assert_close(o, r, rtol=0, atol=0)
    return messages


def test_a_failed_capture_runs_eagerly_and_says_so_once(monkeypatch):
    monkeypatch.setattr(keys, 'DEVICES', ('cpu', 'cuda'))
    attempts = []

    def failing(forward, x, pool):
        attempts.append(1)
        broken_capture()
    monkeypatch.setattr(cuda_graphs.GraphedInference, 'capture',
                        staticmethod(failing))
    messages = warnings_of(model(), 2)
    assert len(attempts) == 1
    assert len(messages) == 1, messages
    # the error that broke the capture and where, not the capture's own
    assert BROKEN_CAPTURE.search(messages[0]), messages[0]
    assert 'previous error' not in messages[0]
    assert 'cuda_graphs=False' in messages[0]


def test_the_first_error_of_a_chain_as_a_traceback_shows_it():
    """What a failed capture's warning names: the first error of the chain
    (its cause, or the error being handled when it was raised), not one
    that ``raise ... from None`` hid; the error itself without a chain."""
    from xcit_dense.errors import first_cause

    def raised(hide):
        try:
            try:
                raise KeyError('first')
            except KeyError:
                if hide:
                    raise ValueError('second') from None
                raise ValueError('second')
        except ValueError as error:
            return error
    assert isinstance(first_cause(raised(hide=False)), KeyError)
    assert isinstance(first_cause(raised(hide=True)), ValueError)
    alone = RuntimeError('alone')
    assert first_cause(alone) is alone


def test_a_model_that_changes_on_every_call_stops_the_graphs(replays):
    """A module that sets an attribute in its forward would be captured on
    every call: after 3 calls in a row the graphs stop, said once."""
    class Counting(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            self.seen = object()  # a new attribute value every call
            return self.inner(*args)

    net = model()
    net.blocks[0].mlp = Counting(net.blocks[0].mlp)
    messages = warnings_of(net, 6)
    assert net.graphs.captures == 3 and net.graphs.failure is not None
    assert len(messages) == 1, messages
    assert 'the model changed between 4 calls in a row' in messages[0]
    # tools/benchmark.py's row says that a @graphs row ran eagerly
    from benchmarks.harness.measure import fallbacks
    assert fallbacks(net) == dict(graphs_captures=3,
                                  graphs_failure=net.graphs.failure)


@pytest.fixture
def looks(monkeypatch):
    """How many times the model was looked at (``fingerprint``)."""
    calls = []
    fingerprint = keys.fingerprint

    def counted(net):
        calls.append(1)
        return fingerprint(net)
    monkeypatch.setattr(keys, 'fingerprint', counted)
    return calls


def test_auto_graphs_what_the_policy_lists_for_inputs_that_recur(
        replays, looks, monkeypatch):
    """``cuda_graphs='auto'``: eager on a device the policy does not list
    (the CPU); where it lists inference, an input is captured on its third
    call (other inputs between them or not) and replayed after, and until
    an input's second call the model is not looked at."""
    net = model('auto')
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    for _ in range(4):
        infer(net)
    assert graphed(net, 'cpu') == frozenset() and not replays
    assert not looks and net.graphs.captures == 0
    monkeypatch.setitem(policy.GRAPHS, 'cpu', frozenset({'infer'}))
    small = X[..., :32, :48]
    for x, captures, looked in ((X, 0, 0), (small, 0, 0), (X, 0, 1),
                                (small, 0, 2), (X, 1, 3), (X, 1, 4),
                                (small, 2, 5)):
        for out, ref in zip(infer(net, x), infer(eager, x)):
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
        assert (net.graphs.captures, len(looks)) == (captures, looked)
    assert len(replays) == 3
    # back to training (after a validation): the graphs' memory goes; an
    # input that recurred is captured again on its next call
    net.train().eval()
    assert not net.graphs.graphs and net.graphs.pool is None
    infer(net)
    assert net.graphs.captures == 3
    explicit = model(True)
    infer(explicit)
    explicit.train().eval()
    assert len(explicit.graphs.graphs) == 1
    with pytest.raises(ValueError, match="'auto' \\(where the policy"):
        XCiT('nano_12_p16', cuda_graphs='automatic')


def test_auto_keeps_the_graphs_of_the_inputs_that_come_most(
        replays, looks, monkeypatch):
    """``cuda_graphs='auto'`` with more recurring inputs than graphs kept
    (detection's padded sizes): an input that comes about as often as those
    kept runs eagerly, without a look at the model, rather than each
    capture evicting a graph captured again soon after (slower than eager
    calls); one that came twice as often as the least used kept input
    replaces it, not the least recently used."""
    monkeypatch.setitem(policy.GRAPHS, 'cpu', frozenset({'infer'}))
    monkeypatch.setattr(inference, 'MAX_GRAPHS', 2)
    net = model('auto')
    eager = copy.deepcopy(net)
    eager.cuda_graphs = False
    a, b, c = X[..., :32, :32], X[..., :32, :48], X[..., :48, :32]
    for x in (a, b, c) * 4:
        for out, ref in zip(infer(net, x), infer(eager, x)):
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert net.graphs.captures == 2
    for x in (a, a, b):  # a 6 times, b 5 (the least used, not the LRU)
        infer(net, x)
    for i in range(6):  # c 5 to 10 times
        looked = len(looks)
        infer(net, c)
        assert net.graphs.captures == 2 + (i == 5)
        assert len(looks) == looked + (i == 5)
    kept = [key[0] for key in net.graphs.graphs]
    assert kept == [tuple(a.shape), tuple(c.shape)]


def test_graph_admission_tool_prices_both_policies():
    """``benchmarks/probes/graph_admission.py`` (docs/performance.md quotes
    it): with 20 sizes, the admission rule captures a few times where
    dropping the least recently used captures on most calls."""
    proc = run_tool_here('benchmarks/probes/graph_admission.py', '--calls',
                         '300')
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()[2:]
    rows = {tuple(cells[:2]): [float(c) for c in cells[2:]]
            for cells in ([c.strip() for c in line.strip('| ').split('|')]
                          for line in lines)}
    admitted, lru = rows[('20 uniform', 'admission')], \
        rows[('20 uniform', 'lru')]
    assert admitted[0] <= 12 and lru[0] > 100
    assert admitted[3] < 1 < lru[3]
    assert recurrence.ADMISSION == 2  # the patches undone
