import contextlib
import copy
import functools
import importlib
import importlib.util
import logging
import os
import re
import sys

import pytest
import torch

# the repository's root, for the tests; imported first, the tools' runners
# take the warning filters of a process started with the packages above
from tool_runs import REPO  # noqa: F401

# Without a GPU, Triton's interpreter runs the package's Triton kernels on
# CPU tensors (tests/test_xca_kernels.py): it must be chosen before anything
# imports Triton. With one, they are compiled (tests/test_cuda.py).
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')


def _config_work_done_once():
    """Two pure, slow steps of mmengine's config handling, done once per
    input in the test processes (together about a third of the time of the
    test files that load configs and run trainings):

    * each ``mmdet::`` / ``mmseg::`` base of a config is resolved by parsing
      every metafile of that package (about a hundred YAML files) before
      mmengine falls back to the base's own path: 0.2 s per base on a slow
      CPU, most of the time of loading one of our configs; the installed
      packages do not change during the tests;
    * before that, whether the base's package is installed, which mmengine
      answers by reloading ``pkg_resources`` (its whole working set) each
      time: the answer does not change during the tests either;
    * a run formats its config's text with yapf each time it logs, dumps or
      checkpoints it (four times per run, 0.3 to 0.5 s each): the same text
      gives the same formatted text.

    The tools' own processes do both as users' do."""
    import mmengine.config.config as config_module
    import mmengine.config.utils as config_utils
    config_utils.load = functools.lru_cache(maxsize=None)(config_utils.load)
    config_module.is_installed = functools.lru_cache(maxsize=None)(
        config_module.is_installed)
    format_code = config_module.FormatCode

    @functools.lru_cache(maxsize=64)
    def format_text(text, style):
        return format_code(text, style_config=dict(style))

    def cached_format_code(text, style_config=None, **kwargs):
        if kwargs or not isinstance(style_config, dict):
            return format_code(text, style_config=style_config, **kwargs)
        return format_text(text, tuple(sorted(style_config.items())))
    config_module.FormatCode = cached_format_code


_config_work_done_once()

@contextlib.contextmanager
def logged(name=None, level=None):
    """The messages mmengine's logger receives inside the block (what
    ``print_log(..., logger='current')`` writes): ``name``'s instance,
    made the current one, or the current one; only ``level``'s where
    given."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance() if name is None \
        else MMLogger.get_instance(name)
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage()) \
        if level is None or record.levelno == level else None
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def _forward_that_synchronises():
    raise RuntimeError('CUDA error: operation not permitted when stream is '
                       'capturing')


def broken_capture(*args):
    """A stand-in for a CUDA graph's capture that its forward broke: the
    forward's error, then the capture's own, raised while the first is
    handled (as ``torch.cuda.graph``'s exit raises it)."""
    try:
        _forward_that_synchronises()
    except RuntimeError:
        raise RuntimeError('CUDA error: operation failed due to a previous '
                           'error during capture')


#: what a warning says of :func:`broken_capture`'s failure: the forward's
#: error and the line that raised it, not the capture's own
BROKEN_CAPTURE = re.compile(
    r'failed \(RuntimeError: CUDA error: operation not permitted when '
    r'stream is capturing, at tests/conftest\.py:\d+ in '
    r'_forward_that_synchronises\)')


#: the test files that take longest, longest first (the time of each
#: file's tests on a 2-core AMD EPYC, the suite on two workers;
#: test_compile_kernels.py's with Triton's cache empty). They run first:
#: `make test` hands files to its workers in this order
#: (``--no-loadscope-reorder``), the shorter files after them in the order
#: collected, so that the workers finish together.
LONGEST_FILES = (
    'test_export_onnx.py', 'test_interruptions.py', 'test_export_detector.py',
    'test_lpi_kernels.py', 'test_fast_path.py', 'test_export_rpn_ranking.py',
    'test_benchmark_tool.py', 'test_fast_path_policy.py',
    'test_heads_learn.py', 'test_ade20k.py', 'test_coco_tools.py',
    'test_gpu_report.py', 'test_integration.py', 'test_backbone.py',
    'test_coco_configs.py', 'test_changing_the_model.py',
    'test_model_index.py', 'test_cuda_graphs_training.py',
    'test_launches.py', 'test_second_derivatives.py', 'test_get_flops.py',
    'test_checkpoint.py', 'test_recipe_hyperparameters.py',
    'test_published_models.py', 'test_xca_kernels.py',
    'test_compile_kernels.py')


def pytest_configure(config):
    config.addinivalue_line(
        'markers', 'sizes_matter: the fast paths that pay only for large '
        'enough inputs take them only where the package does (see '
        'fast_paths_at_any_size)')
    if hasattr(config, 'workerinput'):  # a pytest-xdist worker
        # its tests' objects left uncollected at its exit, as a tool's are
        from xcit_dense.cli import skip_collections_at_exit
        skip_collections_at_exit()


@pytest.fixture(autouse=True)
def native_bf16(monkeypatch):
    """bf16 asked for on the CPU runs in bf16 on every machine, as on a CPU
    with native bf16 (:func:`xcit_dense.precision.cpu_has_native_bf16`),
    so that the tests of bf16 check bf16 whatever CPU runs them; the tests
    of the fp32 fallback patch it to False."""
    from xcit_dense import precision
    monkeypatch.setattr(precision, 'cpu_has_native_bf16', lambda: True)


@pytest.fixture
def fast_paths_at_any_size(request, monkeypatch):
    """The fast paths that pay only for large enough inputs take them for
    any (where the switches and the policy let them), as the package does
    for the inputs on which they are faster: XCA's second moments
    (:func:`xcit_dense.models.ops.second_moments.pays`) and the CPU's
    oneDNN calls on tokens (:func:`xcit_dense.models.ops.onednn.pays`).
    The tests' inputs are tiny, and what the test files of the fast paths
    check (their arithmetic, switches, dtypes, what they save) would
    otherwise see the straightforward computation and standard operators.
    Those files use it (``pytestmark``); not where a tool trains in the
    test's process beside one in a subprocess, which would compute
    otherwise. A test marked ``sizes_matter`` keeps the package's rules."""
    if request.node.get_closest_marker('sizes_matter') is None:
        from xcit_dense.models.ops import onednn, second_moments
        monkeypatch.setattr(second_moments, 'pays', lambda x: True)
        monkeypatch.setattr(onednn, 'pays', lambda backend, x: True)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """The test files' imports (mmdet, mmseg, onnx, onnxruntime) without
    the collector walking them as they come, as the package's own import
    (``xcit_dense.startup``)."""
    from xcit_dense.startup import collections_paused
    with collections_paused():
        yield


def pytest_collection_modifyitems(config, items):
    """The files of :data:`LONGEST_FILES` first, in its order; each file's
    tests in their own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


#: a matplotlib backend whose windows are a list of the titles shown
_WINDOW_BACKEND = """
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

SHOWN = []


class FigureManager(FigureManagerBase):
    def set_window_title(self, title):
        self.title = title

    def show(self):
        SHOWN.append(self.title)


class FigureCanvas(FigureCanvasAgg):
    manager_class = FigureManager
"""


@pytest.fixture
def windows(tmp_path_factory):
    """matplotlib opening windows as with a display: the titles of the
    windows shown during the test, in order (a backend of this fixture's,
    one module per process: mmengine's visualizers outlive a tool run in
    the test's process and keep the figure manager they opened; the
    backend before is put back after the test)."""
    import matplotlib.pyplot as plt
    if 'window_backend' not in sys.modules:
        folder = tmp_path_factory.mktemp('window_backend')
        (folder / 'window_backend.py').write_text(_WINDOW_BACKEND)
        sys.path.insert(0, str(folder))
        try:
            importlib.import_module('window_backend')
        finally:
            sys.path.remove(str(folder))
    shown = sys.modules['window_backend'].SHOWN
    shown.clear()
    before = plt.get_backend()
    plt.switch_backend('module://window_backend')
    try:
        yield shown
    finally:
        plt.close('all')
        plt.switch_backend(before)


@pytest.fixture(scope='session')
def tiny_coco(tmp_path_factory):
    """A small synthetic COCO dataset, made once per test session."""
    from xcit_dense.datasets.synthetic_coco import make_synthetic_coco
    root = tmp_path_factory.mktemp('synthetic_coco')
    make_synthetic_coco(str(root), num_train=8, num_val=4, seed=3)
    return root


@pytest.fixture(scope='session')
def tiny_ade20k(tmp_path_factory):
    """A small synthetic ADE20K-format dataset, made once per test session."""
    from xcit_dense.datasets.synthetic_ade20k import make_synthetic_ade20k
    root = tmp_path_factory.mktemp('synthetic_ade20k')
    make_synthetic_ade20k(str(root), num_train=8, num_val=4, seed=3)
    return root


#: non-empty while a stand-in replay runs the model's forward in Python
#: (a GPU's replay runs none of it: a hook can tell such calls apart)
STAND_IN_REPLAYS = []


@contextlib.contextmanager
def stand_in_replay():
    STAND_IN_REPLAYS.append(1)
    try:
        yield
    finally:
        STAND_IN_REPLAYS.pop()


def as_captured(forward, leaves=None):
    """What a CUDA graph holds of ``forward`` (a module's bound method, or a
    module) once captured, as a copy: the modules, their attributes and
    hooks as they are now (a module, attribute or tensor set afterwards is
    not in it), computing on the memory the parameters and buffers have now
    (in-place updates are read, as a replay reads them); ``leaves`` maps
    parameters to the tensors that stand for them in the capture."""
    owner = getattr(forward, '__self__', forward)
    memo = {id(p): leaf for p, leaf in (leaves or {}).items()}
    for t in (*owner.parameters(), *owner.buffers()):
        memo.setdefault(id(t), t.detach())
    return copy.deepcopy(forward, memo)


@pytest.fixture
def inference_replays(monkeypatch):
    """Inference graphs on the CPU (tests/test_cuda_graphs.py): a capture
    that copies the forward as it is (:func:`as_captured`) and a replay
    that runs that copy on the capture's static input into its static
    outputs, as a graph replays the computation it recorded: a replay
    whose input was not copied in, whose outputs are stale, or that is
    another model's, gives other outputs than the model's forward;
    returns the list of replays."""
    from xcit_dense.models.execution import cuda_graphs
    monkeypatch.setattr(cuda_graphs.keys, 'DEVICES', ('cpu', 'cuda'))
    done = []

    def capture(forward, x, pool):
        static, captured = x.clone(), as_captured(forward)
        # replayed in the autocast state of its capture, as its kernels are
        autocast = torch.autocast(
            'cpu', dtype=torch.get_autocast_dtype('cpu'),
            enabled=torch.is_autocast_enabled('cpu'))
        # the capture runs the model's forward (its Python: a module that
        # sets an attribute sets it), but no kernel: nothing in its outputs
        with autocast:
            outs = tuple(torch.full_like(o, float('nan'))
                         for o in forward(static))

        def replay():
            done.append(static.shape)
            with stand_in_replay(), autocast:
                for out, new in zip(outs, captured(static)):
                    out.copy_(new)
        return static, outs, replay, pool
    monkeypatch.setattr(cuda_graphs.GraphedInference, 'capture',
                        staticmethod(capture))
    return done


@pytest.fixture
def training_replays(monkeypatch):
    """Training graphs on the CPU (tests/test_cuda_graphs_training.py): a
    capture that runs the warm-up iterations ``make_graphed_callables``
    runs (forward and gradients, BatchNorm statistics updated) and returns
    its graphed forward's stand-in, which, as the real one, copies the
    input into its static input and runs the step as captured
    (:func:`as_captured`, on the capture's leaves) into its static outputs,
    which it returns, and computes the gradients of the parameters that
    required them at the capture into buffers in the memory pool it was
    given (the graphs of one pool write the same buffers, as a real pool's
    graphs may write where another's outputs were), which it hands on;
    returns the list of replays."""
    from xcit_dense.models.execution import cuda_graphs
    monkeypatch.setattr(cuda_graphs.keys, 'DEVICES', ('cpu', 'cuda'))
    done, pools = [], {}

    def capture(step, x, pool):
        pool = object() if pool is None else pool
        # the warm-up on leaves of its own, as the real capture's; the
        # replay takes the parameters and hands its gradients to them
        run, leaves, params = cuda_graphs.on_leaves_of_its_own(step)
        trained = [i for i, p in enumerate(params) if p.requires_grad]
        buffers = pools.setdefault(
            (pool, tuple(id(params[i]) for i in trained)),
            [torch.zeros_like(params[i]) for i in trained])
        for _ in range(3):
            outs = run(x, *leaves)
            torch.autograd.grad(outs, [leaves[i] for i in trained],
                                [torch.ones_like(o) for o in outs],
                                allow_unused=True)
        captured = as_captured(step, dict(zip(params, leaves)))
        static = x.detach().clone().requires_grad_(x.requires_grad)
        static_outs = [torch.full_like(o, float('nan')) for o in outs]

        class Replay(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, *_):
                done.append(tuple(x.shape))
                static.copy_(x)
                with torch.enable_grad(), stand_in_replay():
                    ctx.outs = captured(static)
                for out, new in zip(static_outs, ctx.outs):
                    out.copy_(new)
                return tuple(o.detach() for o in static_outs)

            @staticmethod
            @torch.autograd.function.once_differentiable  # as a replay's
            def backward(ctx, *grads):
                got = torch.autograd.grad(ctx.outs,
                                          [leaves[i] for i in trained],
                                          grads, allow_unused=True)
                handed = [None] * len(params)
                for i, buffer, grad in zip(trained, buffers, got):
                    if grad is not None:
                        buffer.copy_(grad)
                        handed[i] = buffer.detach()
                return (None, *handed)

        return (lambda x: Replay.apply(x, *params)), pool
    monkeypatch.setattr(cuda_graphs.GraphedTraining, 'capture',
                        staticmethod(capture))
    return done
