"""Where the fast paths run: the measured policy, its switches and its
branches, and ``compile_cfg='auto'``.

Every branch is decided by ``xcit_dense.models.policy`` from the input's
device and whether ``torch.compile`` traces. The CPU runs here; the CUDA
column is checked as a table here and on a GPU by ``tests/test_cuda.py``.
Modules are observed through the method each fast path calls.
"""
import copy

import pytest
import torch

from xcit_dense import XCiT, fast_path
from xcit_dense.models import policy
from xcit_dense.models.block import XCABlock
from xcit_dense.models.execution import compile_options, graphed
from xcit_dense.models.lpi import LPI
from xcit_dense.models.mlp import Mlp
from xcit_dense.models.ops import lpi_kernels, xca_kernels
from xcit_dense.models.positional_encoding import CachedFourierEncoding
from xcit_dense.models.pyramid import TransposedConvUpsampler
from xcit_dense.models.stem import ConvPatchEmbed
from xcit_dense.models.xca import XCA

from test_fast_path import assert_outputs_close, randomized, reference

pytestmark = pytest.mark.usefixtures('fast_paths_at_any_size')

#: each part and the method only its fast path calls
FAST_METHODS = {
    ConvPatchEmbed: '_channels_last',
    CachedFourierEncoding: 'cached_features',
    XCA: '_from_second_moments',  # on CUDA eagerly: xca_kernels.attention
    LPI: '_channels_last',  # on CUDA eagerly: lpi_kernels.local_interaction
    Mlp: '_fused',
    XCABlock: None,  # its fast path calls the branches' residual_forward
    TransposedConvUpsampler: '_token_gemms',
}
X = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(2))


@pytest.fixture
def taken(monkeypatch):
    """Which parts took their fast path: a set filled by spies."""
    seen = set()
    for cls, method in FAST_METHODS.items():
        if method is None:
            continue
        original = getattr(cls, method)

        def spy(self, *args, _cls=cls, _original=original, **kwargs):
            seen.add(_cls.__name__)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(cls, method, spy)
    original_residual = XCA.residual_forward

    def block_spy(self, x, norm, *args):
        # the block's fast path hands its norm to the branch
        seen.add('XCABlock')
        return original_residual(self, x, norm, *args)
    monkeypatch.setattr(XCA, 'residual_forward', block_spy)
    # XCA's and LPI's fast paths on CUDA, eagerly: their Triton kernels
    for part, kernels, name in ((XCA, xca_kernels, 'attention'),
                                (LPI, lpi_kernels, 'local_interaction')):
        def kernels_spy(*args, _part=part.__name__,
                        _original=getattr(kernels, name), **kwargs):
            seen.add(_part)
            return _original(*args, **kwargs)
        monkeypatch.setattr(kernels, name, kernels_spy)
    return seen


def test_policy_names_every_part_with_a_fast_path():
    assert set(policy.POLICY) == {cls.__name__ for cls in FAST_METHODS}
    for cls in FAST_METHODS:
        assert cls.use_fast_path is True, cls


def test_cpu_takes_every_fast_path_eager_and_compiled():
    for part in policy.POLICY:
        assert policy.pays(part, 'cpu', compiling=False)
        assert policy.pays(part, 'cpu', compiling=True)


def test_cuda_column():
    """CUDA: every fast path compiled, and eagerly (XCA and LPI on their
    Triton kernels: 1.41x in an AMP training step on an H200) all but the
    up-sampler's token GEMMs, which launch more kernels there than
    ``nn.ConvTranspose2d`` (tests/test_launches.py)."""
    assert all(policy.pays(p, 'cuda', True) for p in policy.POLICY)
    assert {p for p in policy.POLICY if not policy.pays(p, 'cuda', False)} \
        == {'TransposedConvUpsampler'}


def test_unmeasured_device_takes_no_fast_path():
    assert not any(policy.pays(p, 'mps', c) for p in policy.POLICY
                   for c in (False, True))
    assert not policy.pays('Unknown', 'cpu', False)


def test_every_part_follows_its_own_row(taken, monkeypatch):
    """Each module asks the policy under its own name: with one part's CPU
    entry emptied, exactly that part runs its straightforward computation,
    and the outputs stay the reference's."""
    model = randomized().eval()
    with torch.no_grad():
        ref = reference(model, X)
        model(X)
    assert taken == set(policy.POLICY)
    for part in policy.POLICY:
        taken.clear()
        with monkeypatch.context() as patch, torch.no_grad():
            patch.setitem(policy.POLICY, part,
                          dict(policy.POLICY[part], cpu=frozenset()))
            out = model(X)
        assert taken == set(policy.POLICY) - {part}, part
        assert_outputs_close(out, ref)


@pytest.mark.sizes_matter
def test_second_moments_only_for_enough_tokens(taken):
    """On the CPU XCA computes from the second moments of its input only
    where they take less time than its four token GEMMs
    (``second_moments.MIN_TOKENS_PER_CHANNEL``, measured): from 1.5 tokens
    per channel in fp32 inference, 2 in training; under bf16 autocast from
    4 in inference, 2 in training; below, the straightforward computation,
    as for the demos' 128x128 images and the tiny inputs of a smoke test;
    ``'always'`` takes them at any size. Either gives the straightforward
    outputs."""
    attn = randomized().blocks[0].attn.eval()
    channels = attn.qkv.in_features

    def second_moments(tokens, setting=True, autocast=False, grad=False):
        x = torch.randn(2, tokens, channels,
                        generator=torch.Generator().manual_seed(tokens))
        taken.clear()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast), \
                torch.set_grad_enabled(grad):
            attn.use_fast_path = setting
            out = attn(x)
            attn.use_fast_path = False
            ref = attn(x)
        attn.use_fast_path = True
        if not autocast:
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        return 'XCA' in taken

    least = int(1.5 * channels)
    assert not second_moments(least - 1) and second_moments(least)
    assert not second_moments(2 * channels - 1, grad=True)
    assert second_moments(2 * channels, grad=True)
    assert second_moments(16, 'always') and not second_moments(16)
    assert not second_moments(4 * channels - 1, autocast=True)
    assert second_moments(4 * channels, autocast=True)
    assert not second_moments(2 * channels - 1, autocast=True, grad=True)
    assert second_moments(2 * channels, autocast=True, grad=True)


@pytest.mark.sizes_matter
def test_onednn_only_for_enough_tokens(monkeypatch):
    """On the CPU the MLP's and LPI's fast paths call oneDNN only for
    large enough inputs (``onednn.MIN_VALUES``, measured: 12288 values in
    fp32 inference, 96 tokens of 128 channels, 32768 in training), where
    its fixed cost per call is repaid; below, the same fast paths on
    standard operators; ``'always'`` calls it for any. Either gives the
    straightforward outputs."""
    from xcit_dense.models.ops import onednn
    chosen = []
    select = onednn.select_backend

    def recorded(*args, **kwargs):
        chosen.append(select(*args, **kwargs))
        return chosen[-1]

    monkeypatch.setattr(onednn, 'select_backend', recorded)
    block = randomized().blocks[0]
    channels = block.mlp.fc1.in_features

    def backends(tokens, grad=False, setting=True):
        x = torch.randn(1, tokens, channels,
                        generator=torch.Generator().manual_seed(tokens))
        chosen.clear()
        block.train(grad)
        with torch.set_grad_enabled(grad):
            for part in (block.mlp, block.local_mp):
                part.use_fast_path = setting
                out = part(x) if part is block.mlp else part(x, 1, tokens)
                part.use_fast_path = False
                ref = part(x) if part is block.mlp else part(x, 1, tokens)
                part.use_fast_path = True
                torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        assert len(chosen) == 2
        return set(chosen)

    assert channels == 128
    assert backends(95) == {'torch'} and backends(96) == {'fused'}
    assert backends(255, grad=True) == {'torch'}
    assert backends(256, grad=True) == {'onednn'}
    assert backends(16, setting='always') == {'fused'}
    assert backends(16, grad=True, setting='always') == {'onednn'}


@pytest.mark.sizes_matter
def test_size_tools_print_each_route_and_the_one_taken(capsys):
    """``benchmarks/probes/onednn_size.py`` and ``xca_route.py``, which
    measured the size rules (docs/performance.md quotes them), time both
    routes and print the one the package takes at each size."""
    import runpy

    from conftest import REPO
    threads = torch.get_num_threads()
    tools = {name: runpy.run_path(str(REPO / 'benchmarks/probes' / name))
             for name in ('onednn_size.py', 'xca_route.py')}
    try:
        tools['onednn_size.py']['main']([
            '--grids', '4', '8', '--repeat', '1', '--rounds', '1',
            '--threads', '1'])
        onednn_rows = capsys.readouterr().out.splitlines()
        tools['xca_route.py']['main']([
            '--arch', 'nano_12_p16', '--tokens', '16', '256', '--repeat',
            '1', '--rounds', '1', '--threads', '1'])
        xca_rows = capsys.readouterr().out.splitlines()
    finally:
        torch.set_num_threads(threads)
    # batch 2 of 128 channels: 4096 and 16384 values
    taken = [row.split()[-1] for row in onednn_rows if 'x' in row[:7]]
    assert taken == ['standard', 'oneDNN', 'standard', 'standard']
    assert all(float(row.split()[-2]) > 0 for row in onednn_rows
               if 'x' in row[:7])
    # 16 and 256 tokens of 128 channels: 0.125 C and 2 C
    taken = [row.split()[-1] for row in xca_rows if 'C)' in row]
    assert taken == ['straightforward', 'moments'] * 2 + \
        ['straightforward'] * 2 + ['straightforward', 'moments']


def test_setting_always_runs_where_the_policy_says_no(taken, monkeypatch):
    monkeypatch.setattr(policy, 'POLICY', {
        part: dict(row, cpu=frozenset()) for part, row in
        policy.POLICY.items()})
    model = randomized().eval()
    with torch.no_grad():
        ref = model(X)  # True: the policy's CPU column is empty now
        assert taken == set()
        with fast_path('always'):
            out = model(X)
    assert taken == set(policy.POLICY)
    assert_outputs_close(out, ref)
    taken.clear()
    model.set_fast_path('always')
    with torch.no_grad():
        model(X)
        assert taken == set(policy.POLICY)
        taken.clear()
        with fast_path(False):  # False wins over 'always'
            model(X)
    assert taken == set()


@pytest.mark.parametrize('setting', [True, 'always'])
def test_a_trace_records_the_straightforward_computation(taken, setting):
    """``torch.jit.trace``, which mmengine's FLOP counter (and mmdet's and
    mmseg's get_flops.py) runs, takes no fast path whatever the switches
    (their oneDNN calls cannot be traced, their choices by size would be
    frozen): the trace holds the straightforward computation's operators,
    counts its FLOPs and computes its outputs; a compile_cfg is not
    compiled under a trace."""
    from mmengine.analysis import FlopAnalyzer
    model = randomized(compile_cfg=True).eval()
    ref = copy.deepcopy(model)
    ref.set_fast_path(False)
    ref.compile_cfg = None
    with torch.no_grad(), fast_path(setting):
        traced = torch.jit.trace(model, X, check_trace=False)
        counted = FlopAnalyzer(model, X).total()
        assert taken == set()
        assert model.compile_failure is None
        assert model.__dict__.get('_compiled_forward') is None
        model.compile_cfg = None
        model(X)  # eagerly, the same switches take every fast path
    assert taken == set(policy.POLICY)

    def operators(module):
        return sorted(node.kind() for node in module.inlined_graph.nodes())
    with torch.no_grad():
        assert operators(traced) == operators(
            torch.jit.trace(ref, X, check_trace=False))
        assert counted == FlopAnalyzer(ref, X).total() > 0
        assert_outputs_close(traced(X), ref(X))


@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_a_dispatch_mode_sees_what_executes(mode):
    """Under a Python dispatch mode (PyTorch's FLOP counter) the fast paths
    run in standard operators, which it sees: no oneDNN custom operator
    (counted as nothing: the default model counted about 13x too few
    FLOPs), the fast paths' own arithmetic counted (fewer products than the
    straightforward computation's: folded weights, second moments), the
    outputs those of the fast paths."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class Operators(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.namespace)
            return func(*args, **(kwargs or {}))

    model = randomized().train(mode == 'train')
    # one image: the ratios of FLOPs below are per image
    x = torch.randn(1, 3, 256, 256, generator=torch.Generator().manual_seed(0))

    def count(**switches):
        with fast_path(**switches), FlopCounterMode(display=False) as c, \
                torch.set_grad_enabled(mode == 'train'):
            outs = model(x)
            if mode == 'train':
                sum(o.sum() for o in outs).backward()
        return c.get_total_flops()

    seen = Operators()
    with seen, torch.set_grad_enabled(mode == 'train'):
        model(x)
    assert seen.names == {'aten'}
    fast, standard = count(), count(fused_kernels=False)
    straightforward = count(enabled=False)
    assert fast == standard
    assert 0.8 * straightforward < fast < straightforward
    with torch.no_grad(), FlopCounterMode(display=False):
        outs = model.eval()(x)
    assert_outputs_close(outs, reference(model, x), atol=1e-4)


def test_torchscript_onnx_export_of_the_default_model(tmp_path):
    """PyTorch's TorchScript-based ONNX exporter (``dynamo=False``, the
    route of mmdeploy and of older tools) traces the default model: the
    straightforward computation, which onnxruntime runs to PyTorch's
    outputs."""
    import onnxruntime
    model = randomized().eval()
    path = tmp_path / 'xcit.onnx'
    with torch.no_grad():
        torch.onnx.export(model, (X, ), str(path), dynamo=False,
                          opset_version=17, input_names=['input'])
        refs = model(X)
    outs = onnxruntime.InferenceSession(str(path)).run(
        None, dict(input=X.numpy()))
    assert_outputs_close(tuple(map(torch.from_numpy, outs)), refs)


def test_settings_combine():
    assert policy.combined(True, True) is True
    assert policy.combined(True, 'always') == 'always'
    assert policy.combined('always', False) is False
    assert policy.combined(False, True) is False


@pytest.mark.parametrize('value', ['yes', 1, None, 'auto'])
def test_bad_settings_are_refused(value):
    with pytest.raises(ValueError, match="fast_path must be True .*'always'"):
        XCiT('nano_12_p16', fast_path=value)
    with pytest.raises(ValueError, match='fast_path must be True'):
        policy.set_fast_path(value)


def test_one_api_for_the_three_switches():
    """fast_path / set_fast_path set the fast paths, the CPU's fused
    kernels and the token pieces; a switch not given stays; the block
    restores all three; bad values get one paragraph each."""
    from xcit_dense.models.ops import onednn, pieces
    x = torch.randn(1, 40, 8)
    assert policy.SWITCHES == policy.Switches()  # the defaults
    with fast_path(fused_kernels=False, piece_tokens=7):
        assert policy.SWITCHES.fast_path is True
        with torch.no_grad():
            assert onednn.select_backend(x, False) == 'torch'
            assert pieces.piece_tokens(40, 8, x) == 7
        with fast_path(False):
            assert policy.SWITCHES == policy.Switches(False, False, 7)
        assert policy.SWITCHES == policy.Switches(True, False, 7)
    assert policy.SWITCHES == policy.Switches()
    for kwargs, message in [(dict(fused_kernels='no'), 'fused_kernels must'),
                            (dict(piece_tokens=0), 'piece_tokens must')]:
        with pytest.raises(ValueError, match=message):
            policy.set_fast_path(**kwargs)
    assert policy.SWITCHES == policy.Switches()


def test_compile_auto_is_eager_where_compiling_was_not_measured_faster():
    """'auto' follows policy.COMPILE: empty since compiling was measured
    slower than eager on an H100 (and failed on the Mask R-CNN recipe);
    an explicit ``compile_cfg`` compiles on every device."""
    model = randomized(compile_cfg='auto').eval()
    for device in ('cpu', 'cuda', 'mps'):
        assert compile_options(model, device) is None, device
    with torch.no_grad():
        assert_outputs_close(model(X), reference(model, X))
    assert '_compiled_forward' not in model.__dict__  # eager
    explicit = randomized(compile_cfg=dict(mode='max-autotune'))
    assert compile_options(explicit, 'cpu') == dict(mode='max-autotune')


def test_recipes_compile_and_graph_where_the_policy_says():
    """The recipes leave compiling and CUDA graphs to the policy: eager on
    the CPU, CUDA graphs for inference and training steps on CUDA."""
    from mmengine.config import Config
    for path in ('configs/coco/mask_rcnn_xcit_s12_p16_3x_coco.py',
                 'configs/ade20k/upernet_xcit_s12_p16_160k_ade20k.py',
                 'configs/ade20k/sem_fpn_xcit_s12_p16_80k_ade20k.py'):
        cfg = Config.fromfile(path)
        assert cfg.model.backbone.compile_cfg == 'auto', path
        assert cfg.model.backbone.cuda_graphs == 'auto', path
    model = randomized(cuda_graphs='auto')
    assert graphed(model, 'cpu') == frozenset()
    assert graphed(model, 'cuda') == {'infer', 'train'}


def test_dynamic_compile_traces_once_for_several_sizes():
    """``dynamic=True``: multi-scale training's changing sizes reuse one
    graph instead of one compile per size. Traced
    by dynamo alone (a backend that runs the traced graph as it is): its
    guards decide this, not the code generator."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    model = randomized(compile_cfg=dict(dynamic=True, fullgraph=True,
                                        backend=backend)).train()
    # token grids of even sides, as mmdet's padding to 32 gives: the
    # pyramid's max-pooling specialises a graph to the parity of the grid
    # (at most four graphs for odd sizes)
    for h, w in ((64, 96), (96, 128), (128, 64)):
        sum(o.sum() for o in model(torch.randn(2, 3, h, w))).backward()
    assert len(graphs) == 1, f'{len(graphs)} compilations for 3 sizes'


@pytest.mark.parametrize('compile_cfg, passed', [
    (dict(dynamic=True), dict(dynamic=True, options={
        'triton.coalesce_tiling_analysis': False})),
    (True, dict(options={'triton.coalesce_tiling_analysis': False})),
    (dict(dynamic=False), dict(dynamic=False)),
    (dict(mode='max-autotune'), dict(mode='max-autotune')),
    (dict(backend='aot_eager'), dict(backend='aot_eager')),
])
def test_inductor_compiles_dynamic_shapes_without_its_failing_analysis(
        monkeypatch, compile_cfg, passed):
    """PyTorch 2.11's Inductor asserts in its memory-coalescing analysis
    on the training graph with dynamic shapes (on an H200): Inductor
    compiles without it where shapes may become dynamic, unless a ``mode``
    or ``options`` were given (``torch.compile`` takes one of them); other
    backends get the arguments as they are."""
    calls = []

    def compile(fn, **kwargs):
        calls.append(kwargs)
        return fn
    monkeypatch.setattr(torch, 'compile', compile)
    assert hasattr(torch._inductor.config.triton,
                   'coalesce_tiling_analysis')
    model = randomized(compile_cfg=compile_cfg).eval()
    with torch.no_grad():
        model(X)
    assert calls == [passed]
    assert model.compile_failure is None


def test_second_derivatives_through_the_compiled_backbone_stop_it(
        monkeypatch):
    """A recorded backward (``create_graph=True``) through the compiled
    backbone, whose backward AOTAutograd computes once (PyTorch 2.12 on the
    CPU raised its donated-buffers error there): that step stops with a
    message naming ``compile_cfg=None`` and the backbone runs eagerly from
    the next; a plain backward, and Dynamo's ``'eager'`` backend (no
    AOTAutograd), are left alone. ``torch.compile`` is stood in for by the
    function itself."""
    monkeypatch.setattr(torch, 'compile', lambda fn, **kwargs: fn)

    def penalty(model):
        x = X.clone().requires_grad_()
        loss = sum((o ** 2).mean() for o in model(x))
        grad, = torch.autograd.grad(loss, x, create_graph=True)
        grad.pow(2).sum().backward()

    model = randomized(compile_cfg=True).train()
    sum(o.sum() for o in model(X)).backward()
    assert model.compile_failure is None
    with pytest.raises(RuntimeError, match='compile_cfg=None'):
        penalty(model)
    assert 'create_graph=True' in model.compile_failure
    penalty(model)
    model = randomized(compile_cfg=dict(backend='eager')).train()
    penalty(model)
    assert model.compile_failure is None


@pytest.mark.parametrize('setting', ['always', False])
def test_gradients_in_the_parameters_strides(setting):
    """Every gradient reaches its parameter in the parameter's own strides,
    as DistributedDataParallel's buckets expect (else it copies them every
    step and warns 'Grad strides do not match bucket view strides'): the
    depth-wise and 1x1 convolutions on channels-last maps return theirs in
    other strides (ops/grad_layout.py), on either path, and in a copy of
    the model too."""
    model = copy.deepcopy(randomized().train())
    with fast_path(setting):
        sum(o.sum() for o in model(X)).backward()
    for name, p in model.named_parameters():
        assert p.grad.stride() == p.stride(), (name, p.grad.stride(),
                                               p.stride())


def test_gradients_of_a_module_swapped_in_keep_their_strides():
    """The parameters are looked at once per training mode, not on every
    forward: a branch replaced afterwards gets its hooks when the model is
    next put in training mode (as a training loop does when it starts)."""
    model = randomized().train()
    model(X)
    block = model.blocks[0]
    block.local_mp = type(block.local_mp)(block.local_mp.conv1.in_channels)
    model.train()
    sum(o.sum() for o in model(X)).backward()
    for name, p in model.named_parameters():
        assert p.grad.stride() == p.stride(), name


def test_gpu_policy_probe_runs(tmp_path, monkeypatch, inference_replays,
                               training_replays):
    """The probe behind the CUDA column (make gpu-report) on the CPU at a
    tiny size: the parts asked for forced on and off alone in the scenarios
    asked for, eagerly, then each configuration replayed from the
    backbone's graphs (stand-in captures here), timing replays only; its
    ``+xca-moments`` rows take XCA's second-moments route where the Triton
    kernels would run; the rounds' orders."""
    import gc
    import json
    import runpy
    import sys

    from xcit_dense.models import xca

    from conftest import REPO
    probe = str(REPO / 'benchmarks/gpu/policy_probe.py')
    out = tmp_path / 'probe.json'
    monkeypatch.setattr(sys, 'argv', [
        'policy_probe.py', '--out', str(out), '--device', 'cpu', '--arch',
        'nano_12_p16', '--depth', '4', '--size', '32x48', '--warmup', '0',
        '--repeat', '2', '--rounds', '1', '--parts', 'xca', '--scenarios',
        '1', '2', '--graphs'])
    # the probe collects garbage after each graphed configuration: the
    # objects of the test process made before it are left out of that walk
    gc.freeze()
    try:
        runpy.run_path(probe, run_name='__main__')
    finally:
        gc.unfreeze()
    rows = json.loads(out.read_text())
    eager = [(r['mode'], r['config']) for r in rows if not r['graphed']]
    configs = ['reference', 'all', 'all-xca', 'ref+xca']
    assert eager == [(m, c) for m in ('infer', 'train') for c in configs]
    graphed = [r for r in rows if r['graphed']]
    configs = ['reference', 'default', 'all', 'all-xca', 'all+xca-moments']
    assert [(r['mode'], r['config']) for r in graphed] == \
        [(m, c) for m in ('infer', 'train') for c in configs]
    assert all(r['ms'] > 0 and len(r['ms_rounds']) == 1
               for r in rows if not r['graphed'])
    assert all(r['replayed'] and r['ms'] > 0 for r in graphed)
    # each configuration's 4 warm-up calls and 2 timed ones replayed
    # (inference: captured on the first call; a training step on the
    # third)
    assert len(inference_replays) == 6 * len(configs)
    assert len(training_replays) == 4 * len(configs)

    ns = runpy.run_path(probe)
    # --depth: the preset's first blocks, its last four tapped
    from types import SimpleNamespace
    quick = ns['backbone'](SimpleNamespace(arch='nano_12_p16', depth=5))
    assert (len(quick.blocks), list(quick.out_indices)) == (5, [1, 2, 3, 4])
    monkeypatch.setattr(policy, 'KERNEL_DEVICES', ('cpu', 'cuda'))
    attention = xca.XCA(64, num_heads=8)
    tokens = torch.randn(1, 6, 64)
    assert attention._fast_path(tokens) == xca.KERNELS
    with ns['xca_from_second_moments']():
        assert attention._fast_path(tokens) == xca.SECOND_MOMENTS
    assert attention._fast_path(tokens) == xca.KERNELS
    orders = ns['rotations'](list('abcdefg'), 3)
    assert [''.join(o) for o in orders] == ['abcdefg', 'cdefgab', 'efgabcd']
