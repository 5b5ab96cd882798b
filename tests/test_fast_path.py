"""The modules' fast paths compute what their straightforward paths compute.

The fast paths (channels-last tokens, folded layer scale and BatchNorm, XCA
from second moments folded into one matrix, token-GEMM transposed
convolutions, oneDNN kernels, inference by pieces of tokens) are compared
with the same model under ``fast_path(False)`` (every module's
straightforward computation): outputs within 1e-4 in fp32 and the same
gradients, for every path the forward can take. Speed is measured by
tools/benchmark.py, not here.
"""
import copy
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from xcit_dense import XCiT, fast_path, set_fast_path
from xcit_dense.models.ops import onednn as kernels
from xcit_dense.models.ops import pieces, second_moments
from xcit_dense.models.ops.folding import fold_batchnorm

from conftest import logged

pytestmark = pytest.mark.usefixtures('fast_paths_at_any_size')

ATOL = 1e-4


def randomized(arch='nano_12_p16', seed=0, **kwargs):
    """A 4-block model whose BatchNorm statistics, layer-scale gammas and
    temperatures are not at their initial values (so folding them is
    actually exercised)."""
    torch.manual_seed(seed)
    kwargs.setdefault('depth', 4)
    kwargs.setdefault('out_indices', (0, 1, 2, 3))
    model = XCiT(arch=arch, **kwargs)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, _BatchNorm):
                module.running_mean.normal_(0, 0.2)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.2)
        for name, param in model.named_parameters():
            if name.rsplit('.', 1)[-1] in ('gamma1', 'gamma2', 'gamma3',
                                           'temperature'):
                param.uniform_(0.5, 1.5)
            elif name.endswith('.bias'):
                param.normal_(0, 0.1)
    return model


def narrow(**kwargs):
    """:func:`randomized` at 64 channels in two heads of 32 (XCiT-N12's
    head width): one channel tile of LPI's kernels and half the attention
    programs, for the tests that interpret the Triton kernels (whose time
    grows with the programs launched; what they compute does not depend
    on the width)."""
    return randomized(embed_dim=64, num_heads=2, **kwargs)


def reference(model, x):
    """``model(x)`` computed the straightforward way."""
    with fast_path(False):
        return model(x)


def assert_outputs_close(outs, refs, atol=ATOL):
    assert len(outs) == len(refs) == 4
    for level, (out, ref) in enumerate(zip(outs, refs)):
        assert out.shape == ref.shape, level
        assert out.is_contiguous() == ref.is_contiguous(), level
        torch.testing.assert_close(out, ref, rtol=0, atol=atol,
                                   msg=f'pyramid level {level}')


@pytest.fixture(autouse=True)
def fused_kernels_on():
    yield
    set_fast_path(fused_kernels=True)


@pytest.mark.parametrize('patch', [16, 8])
@pytest.mark.parametrize('size', [(64, 96), (50, 77)])
@pytest.mark.parametrize('fused', [True, False])
def test_inference_matches_reference(patch, size, fused):
    set_fast_path(fused_kernels=fused)
    model = randomized(f'nano_12_p{patch}').eval()
    x = torch.randn(2, 3, *size)
    with torch.inference_mode():
        assert kernels.select_backend(x, False) == (
            'fused' if fused else 'torch')
        assert_outputs_close(model(x), reference(model, x))


def test_inference_by_pieces_matches_reference():
    """Ragged pieces of tokens and bands of rows (7 tokens at a time)."""
    model = randomized('nano_12_p16').eval()
    x = torch.randn(2, 3, 80, 112)  # 5 x 7 tokens
    with torch.no_grad():
        ref = reference(model, x)
        whole = model(x)
        with fast_path(piece_tokens=7):
            assert [(s.start, s.stop) for s in pieces.pieces(35, 8, x)] == [
                (i, min(i + 7, 35)) for i in range(0, 35, 7)]
            by_pieces = model(x)
    assert_outputs_close(by_pieces, ref)
    assert_outputs_close(by_pieces, whole, atol=1e-5)


def test_pieces_sized_by_memory():
    fp32 = torch.zeros(1)
    with torch.no_grad():
        # the MLP's hidden layer of S12: 4096 * 1536 * 4 B = 24 MiB
        assert pieces.piece_tokens(100000, 1536, fp32) == 4096
        assert max(s.stop - s.start
                   for s in pieces.pieces(100000, 1536, fp32)) <= 4096
        # XCA's temporaries are 384 wide; bf16 takes twice the tokens
        assert pieces.piece_tokens(100000, 384, fp32) == 16384
        assert pieces.piece_tokens(100000, 384, fp32.bfloat16()) == 32768
        # CUDA's caching allocator keeps its blocks: no pieces
        assert pieces.piece_tokens(100000, 1536,
                                   torch.zeros(1, device='meta')) == 100000
    assert pieces.piece_tokens(100000, 1536, fp32) == 100000  # autograd


def test_eval_with_autograd_matches_reference():
    """Eval mode with gradients recorded: the oneDNN autograd path."""
    model = randomized('nano_12_p16').eval()
    x = torch.randn(1, 3, 64, 64)
    assert kernels.select_backend(x, False) == 'onednn'
    assert_outputs_close(model(x), reference(model, x))


def assert_grads_close(grads, ref_grads):
    """Gradients sum over every pixel, so fp32 rounding scales with them:
    compared to 1e-4 of their largest entry (or 1e-4 absolute)."""
    assert grads.keys() == ref_grads.keys()
    for name, ref in ref_grads.items():
        tol = 1e-4 * max(1.0, ref.abs().max().item())
        torch.testing.assert_close(grads[name], ref, rtol=0, atol=tol,
                                   msg=name)


def _loss_and_grads(model, forward, x):
    model.zero_grad(set_to_none=True)
    outs = forward(x)
    loss = sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum()
               for o in outs)
    loss.backward()
    return outs, {name: p.grad for name, p in model.named_parameters()
                  if p.grad is not None}


def assert_training_matches_reference(model, x):
    """A training step of ``model`` and of a copy on the reference path:
    the same outputs and gradients. Returns our gradients and the copy."""
    ref_model = copy.deepcopy(model)
    outs, grads = _loss_and_grads(model, model, x)
    with fast_path(False):
        refs, ref_grads = _loss_and_grads(ref_model, ref_model, x)
    assert_outputs_close([o.detach() for o in outs],
                         [r.detach() for r in refs])
    assert_grads_close(grads, ref_grads)
    return grads, ref_model


@pytest.mark.parametrize('patch', [16, 8])
@pytest.mark.parametrize('fused', [True, False])
def test_training_matches_reference(patch, fused):
    """Train mode: BatchNorm on batch statistics, same outputs, same
    gradients for every parameter, same running statistics afterwards."""
    set_fast_path(fused_kernels=fused)
    model = randomized(f'nano_12_p{patch}').train()
    grads, ref_model = assert_training_matches_reference(
        model, torch.randn(2, 3, 64, 96))
    assert grads.keys() == {n for n, p in model.named_parameters()
                            if p.requires_grad}
    for (name, buf), ref_buf in zip(model.named_buffers(),
                                    ref_model.buffers()):
        torch.testing.assert_close(buf, ref_buf, msg=name)


def test_training_after_inference_mode_at_the_same_size():
    """What inference keeps across calls (the positional encoding's
    features per grid) is a normal tensor even when made under
    ``torch.inference_mode()``: a training step at the same size after it
    trains, equal to the straightforward computation."""
    model = randomized().eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.inference_mode():
        model(x)
    model.train()
    assert_training_matches_reference(model, x)


def test_with_cp_matches_reference():
    model = randomized('nano_12_p16', with_cp=True).train()
    ref_model = copy.deepcopy(model)
    ref_model.set_grad_checkpointing(False)
    x = torch.randn(1, 3, 64, 64)
    _, grads = _loss_and_grads(model, model, x)
    with fast_path(False):
        _, ref_grads = _loss_and_grads(ref_model, ref_model, x)
    assert_grads_close(grads, ref_grads)


def test_group_norm_pyramid_matches_reference():
    """A norm that cannot be folded runs as a module on channels-last maps."""
    model = randomized('nano_12_p16',
                       norm_cfg=dict(type='GN', num_groups=4)).eval()
    assert isinstance(model.fpn1[1], nn.GroupNorm)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert_outputs_close(model(x), reference(model, x))


def testfold_batchnorm():
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1)
    bn = nn.BatchNorm2d(6)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2)
        bn.weight.normal_()
        bn.bias.normal_()
    x = torch.randn(2, 4, 5, 5)
    bn.eval()
    weight, bias = fold_batchnorm(conv.weight, conv.bias, bn)
    torch.testing.assert_close(F.conv2d(x, weight, bias, padding=1),
                               bn(conv(x)), rtol=0, atol=1e-5)
    bn.train()  # batch statistics cannot be folded
    assert fold_batchnorm(conv.weight, conv.bias, bn) is None
    assert fold_batchnorm(conv.weight, conv.bias, nn.GroupNorm(2, 6)) is None


@pytest.mark.parametrize('act,residual', [(None, False), ('gelu', False),
                                          (None, True)])
@pytest.mark.parametrize('backend', ['fused', 'onednn'])
def test_kernels_match_torch_operators(act, residual, backend):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 7, 16)
    weight, bias = torch.randn(24, 16), torch.randn(24)
    res = torch.randn(2, 5, 7, 24) if residual else None
    with torch.no_grad():
        y = kernels.linear(x, weight, bias, act=act, residual=res,
                           backend=backend)
        ref = kernels.linear(x, weight, bias, act=act, residual=res)
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-5)
    expected = F.linear(x, weight, bias)
    if act == 'gelu':
        expected = F.gelu(expected)
    if residual:
        expected = expected + res
    torch.testing.assert_close(ref, expected)

    img = torch.randn(2, 8, 9, 11).contiguous(
        memory_format=torch.channels_last)
    w, b = torch.randn(8, 1, 3, 3), torch.randn(8)
    res = torch.randn_like(img) if residual else None
    with torch.no_grad():
        y = kernels.conv2d(img, w, b, (1, 1), (1, 1), 8, act=act,
                           residual=res, backend=backend)
    expected = F.conv2d(img, w, b, 1, 1, 1, 8)
    if act == 'gelu':
        expected = F.gelu(expected)
    if residual:
        expected = expected + res
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-5)


def test_onednn_linear_gradients():
    torch.manual_seed(0)
    x = torch.randn(6, 16, dtype=torch.float32, requires_grad=True)
    weight = torch.randn(24, 16, requires_grad=True)
    bias = torch.randn(24, requires_grad=True)
    grad = torch.randn(6, 24)
    kernels.linear(x, weight, bias, backend='onednn').backward(grad)
    ours = [t.grad.clone() for t in (x, weight, bias)]
    for t in (x, weight, bias):
        t.grad = None
    F.linear(x, weight, bias).backward(grad)
    for mine, ref in zip(ours, (x.grad, weight.grad, bias.grad)):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('frozen', [False, True])
def test_onednn_mlp_gradients(frozen):
    """fc1 -> GELU -> fc2 with the activation recomputed in backward; also
    with frozen (no-grad) weights."""
    torch.manual_seed(0)
    x = torch.randn(2, 7, 16, requires_grad=True)
    params = [torch.randn(32, 16) * 0.3, torch.randn(32),
              torch.randn(16, 32) * 0.3, torch.randn(16)]
    for p in params:
        p.requires_grad_(not frozen)
    grad = torch.randn(2, 7, 16)
    y = kernels.mlp(x, *params, backend='onednn')
    y.backward(grad)
    ours = [t.grad for t in [x] + params]
    ref_inputs = [t.detach().requires_grad_(t.requires_grad)
                  for t in [x] + params]
    w1, b1, w2, b2 = ref_inputs[1:]
    ref = F.linear(F.gelu(F.linear(ref_inputs[0], w1, b1)), w2, b2)
    ref.backward(grad)
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-5)
    for mine, t in zip(ours, ref_inputs):
        if t.requires_grad:
            torch.testing.assert_close(mine, t.grad, rtol=1e-5, atol=1e-5)
        else:
            assert mine is None


@pytest.mark.parametrize('channels', [5, 64, 67])  # one GEMM; blocks
def test_gram(channels):
    # 3 tokens: gradcheck builds (inputs x outputs) Jacobians
    z = torch.randn(2, 3, channels, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(second_moments._Gram.apply(z),
                               z.transpose(1, 2) @ z)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert second_moments.gram(z.float()).dtype == torch.float32
    # finite differences over one image where the output has thousands of
    # entries (the backward is one batched GEMM at any width: two images
    # at 5 channels)
    one = z if channels < 32 else z[:1].detach().requires_grad_()
    torch.autograd.gradcheck(lambda t: second_moments._Gram.apply(t), (one,))


def test_training_with_dropout_matches_reference():
    """Dropout in the MLP and on the attention takes the general MLP path;
    with rate 1 the masks are deterministic (everything dropped)."""
    model = randomized('nano_12_p16', drop_rate=1.0,
                       attn_drop_rate=1.0).train()
    # in float64: with every attention and MLP branch dropped, the gradients
    # of the early LPI layers are small differences of large terms, and fp32
    # rounding leaves both paths ~3e-4 (of the largest gradient) away from
    # an fp64 evaluation, on some CPUs more than 1e-4 apart from each other
    assert_training_matches_reference(model.double(),
                                      torch.randn(1, 3, 64, 64).double())


def test_fast_path_executes_fewer_multiply_adds():
    """XCA from second moments: two C-wide token GEMMs (z^T z at 3/4, the
    output) instead of four and the two d-wide attention products, plus
    C x C algebra per image -- fewer multiply-adds once there are more than
    about 1.5 C tokens."""
    from torch.utils.flop_counter import FlopCounterMode
    set_fast_path(fused_kernels=False)  # operators the counter sees
    model = randomized('nano_12_p8').eval()  # C = 128
    x = torch.randn(1, 3, 160, 192)  # 20 x 24 = 480 tokens
    counts = []
    for fast in (True, False):
        with torch.no_grad(), fast_path(fast), \
                FlopCounterMode(display=False) as counter:
            model(x)
        counts.append(counter.get_total_flops())
    ours, reference = counts
    # per block, multiply-adds: reference 4 N C^2 + 2 N C d; ours
    # 1.75 N C^2 + 3 C^3 (W_qk G, W_p A W_v) + 2 C^2 d (heads) + 2 C^2
    # (W_qk s; the counter has no rule for the matrix-vector W_p A b_v)
    N, C, d = 480, 128, 32
    saved = 2.25 * N * C**2 + 2 * N * C * d - 3 * C**3 - 2 * C**2 * d \
        - 2 * C**2
    assert reference - ours == 2 * 4 * saved  # the counter: 2 per MAC


def test_xca_rounding_like_the_direct_route():
    """XCA from second moments at a realistic size (4200 tokens, C = 384,
    channel means up to 3 standard deviations): its fp32 error against an
    fp64 evaluation of timm's XCA is of the size of timm's own fp32 error."""
    torch.manual_seed(0)
    model = randomized('small_12_p16')
    blk = model.blocks[0].eval()
    with torch.no_grad():  # the branch, not the residual's rounding, counts
        blk.gamma1.mul_(1000)
    x = torch.randn(1, 4200, 384) * (0.5 + torch.rand(384)) + \
        3 * torch.randn(384)

    def direct(block, tokens):
        return tokens + block.gamma1 * block.attn(block.norm1(tokens))

    set_fast_path(fused_kernels=False)  # the standard-operator backend
    with torch.no_grad():
        with fast_path(False):
            exact = direct(copy.deepcopy(blk).double(), x.double())
            timm_fp32 = direct(blk, x)
        ours = blk.attn.residual_forward(x, blk.norm1, blk.gamma1,
                                         blk.drop_path1)
    err_ours = (ours.double() - exact).abs().max().item()
    err_timm = (timm_fp32.double() - exact).abs().max().item()
    assert err_ours < 3 * err_timm, (err_ours, err_timm)


def test_backend_selection():
    x = torch.zeros(1)
    with torch.no_grad():
        assert kernels.select_backend(x, stochastic=False) == 'fused'
        # live dropout or drop-path: not fused
        assert kernels.select_backend(x, stochastic=True) == 'onednn'
        assert kernels.select_backend(x.double(), False) == 'torch'
        with torch.autocast('cpu', dtype=torch.bfloat16):
            assert kernels.select_backend(x, False) == 'torch'
    assert kernels.select_backend(x, stochastic=False) == 'onednn'
    set_fast_path(fused_kernels=False)
    assert kernels.select_backend(x, stochastic=False) == 'torch'
    with pytest.raises(ValueError, match='backend must be one of'):
        kernels.linear(x.view(1, 1), x.view(1, 1), None, backend='mkl')
    with pytest.raises(ValueError, match='act must be one of'):
        kernels.linear(x.view(1, 1), x.view(1, 1), None, act='relu')


def test_bf16_autocast_matches_reference_under_the_same_autocast():
    """Under an outer autocast (mmengine's ``fp16=True`` loops on CPU) and
    with ``autocast_dtype='bfloat16'`` (fp32 maps out, for fp32 heads): the
    fast paths give each level the straightforward computation's dtype
    under the same autocast (the residual stream fp32 from the first
    addition of an fp32 layer scale) and its values within bf16's rounding
    (measured: 5.6e-3 of a level's largest value), both near fp32."""
    model = randomized('nano_12_p16').eval()
    x = torch.randn(1, 3, 64, 64)

    def under_bf16():
        with torch.autocast('cpu', dtype=torch.bfloat16):
            outer = model(x)
        model.autocast_dtype = 'bfloat16'
        try:
            return outer, model(x)
        finally:
            model.autocast_dtype = None
    with torch.no_grad():
        fp32 = model(x)
        fast = under_bf16()
        with fast_path(False):
            straightforward = under_bf16()
    assert {o.dtype for o in fast[1]} == {torch.float32}

    def error(a, b):  # bf16 keeps 8 bits of mantissa: relative to the scale
        return ((a.float() - b.float()).abs().max() /
                b.float().abs().max()).item()
    for outs, refs in zip(fast, straightforward):
        for level, (out, ref, exact) in enumerate(zip(outs, refs, fp32)):
            assert out.dtype == ref.dtype, level
            assert error(out, ref) < 1.5e-2, level
            assert 1e-5 < error(ref, exact) < 0.05, level


@pytest.mark.parametrize('train', [True, False])
@pytest.mark.parametrize('stream', [torch.float32, torch.bfloat16])
def test_upsampled_levels_in_autocasts_dtype(train, stream):
    """Under autocast the up-sampled levels come out in the dtype the
    transposed convolutions give (autocast's), whatever the dtype of the
    tokens they start from (fp32 on CUDA's path, whose residual stream
    stays fp32): an fp32 output doubles the largest maps, which the neck
    keeps, and what training saves for them."""
    model = randomized()
    up = model.fpn1.train(train)
    x = torch.randn(2, model.embed_dim, 6, 10).to(stream).contiguous(
        memory_format=torch.channels_last)  # a tap, as the backbone gives it
    with torch.autocast('cpu', dtype=torch.bfloat16), \
            torch.set_grad_enabled(train):
        ref = reference(up, x)
        out = up(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    err = (out.float() - ref.float()).abs().max() / ref.float().abs().max()
    assert err < 0.02, err


def test_upsampler_adds_its_bias_in_autocasts_dtype():
    """The up-sampler's inference path adds the bias in the GEMM's dtype, as
    autocast casts nn.ConvTranspose2d's: an fp32 bias made each add compute
    in fp32 into a temporary the size of the output and copy it into the
    bf16 output (XCiT-S12/16's bf16 inference at 800x1344, profiled on a
    2-core Intel Xeon with AMX: the adds 70 ms of CPU time, 25 ms without;
    the call's median 0.390 -> 0.381 s, within the machine's noise)."""
    up = randomized().fpn1.eval()
    x = torch.randn(2, up[0].in_channels, 6, 10).contiguous(
        memory_format=torch.channels_last)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16), \
            torch.profiler.profile() as prof:
        up(x)
    adds = [e for e in prof.events() if e.name == 'aten::add']
    assert adds and not [c for e in adds for c in e.cpu_children
                         if c.name == 'aten::copy_'], \
        'an add of the up-sampler copied its result'


def test_autocast_dtype_rejects_bad_values():
    with pytest.raises(ValueError, match='autocast_dtype must be one of'):
        XCiT('nano_12_p16', autocast_dtype='bf16')


def test_compile_cfg_traces_one_graph(monkeypatch):
    """``compile_cfg`` compiles the whole forward as one graph (no breaks)
    with the same outputs. The 'aot_eager' backend traces forward and
    backward like Inductor but skips code generation, which takes minutes
    on a small CPU (the compile time is measured by tools/benchmark.py).
    The fused oneDNN calls are custom operators in the graph, and eager
    calls run their function without the operator's dispatch."""
    model = randomized('nano_12_p16', compile_cfg=dict(
        backend='aot_eager', fullgraph=True)).eval()
    eager = copy.deepcopy(model)
    eager.compile_cfg = None  # the reference eagerly, not traced again
    x = torch.randn(2, 3, 64, 96)
    eager_calls = []
    function = kernels._fused_linear
    monkeypatch.setattr(kernels, '_fused_linear',
                        lambda *a: eager_calls.append(1) or function(*a))
    with torch.no_grad():
        assert_outputs_close(model(x), reference(eager, x))
        assert not eager_calls  # the graph calls xcit_dense::fused_linear
        randomized('nano_12_p16').eval()(x)
        assert eager_calls
    assert model.__dict__['_compiled_forward'] is not None
    model.train()
    _, grads = _loss_and_grads(model, model, x)
    ref_model = copy.deepcopy(model)
    ref_model.compile_cfg = None
    with fast_path(False):
        _, ref_grads = _loss_and_grads(ref_model, ref_model, x)
    assert_grads_close(grads, ref_grads)


def _failing_at_compile(gm, example_inputs):
    raise RuntimeError('the compiler failed')


def _failing_at_run_time(gm, example_inputs):
    def run(*args):
        raise RuntimeError('the compiled kernel failed')
    return run


@pytest.mark.parametrize('backend', [_failing_at_compile,
                                     _failing_at_run_time])
def test_failed_compile_runs_eagerly_and_says_so_once(backend):
    """A compiler that fails, compiling or running its graph, never ends a
    run: the backbone returns the eager outputs, logs one warning naming
    the error and the switch, and does not try again."""
    torch._dynamo.reset()
    # the straightforward computation, which Dynamo traces in half the
    # time of the fast paths': what a failing compiler leaves does not
    # depend on the path traced
    model = randomized(compile_cfg=dict(backend=backend),
                       fast_path=False).train()
    x = torch.randn(2, 3, 64, 96)
    with logged('test_failed_compile', logging.WARNING) as messages:
        for _ in range(2):
            outs, grads = _loss_and_grads(model, model, x)
    ref_model = copy.deepcopy(model)
    ref_model.compile_cfg = None
    ref_outs, ref_grads = _loss_and_grads(ref_model, ref_model, x)
    assert_outputs_close(outs, ref_outs)
    assert_grads_close(grads, ref_grads)
    assert len(messages) == 1, messages
    assert 'torch.compile of the backbone failed' in messages[0]
    assert 'compile_cfg=None' in messages[0]
    assert model.compile_failure.startswith(
        'BackendCompilerFailed' if backend is _failing_at_compile
        else 'RuntimeError')
    # tools/benchmark.py's row says that a @compile row ran eagerly
    from benchmarks.harness.measure import fallbacks
    assert fallbacks(model) == dict(
        compile_failure=model.compile_failure[:300])
    assert fallbacks(randomized()) == {}


def test_model_errors_are_not_taken_for_compiler_failures():
    """An error of the model itself (here a block that raises) is raised as
    it is, and compilation is not switched off for it."""
    class Broken(nn.Module):
        def forward(self, x, H, W):
            raise ValueError('this block is broken')

    torch._dynamo.reset()
    model = randomized(compile_cfg=dict(backend='eager'), fast_path=False)
    model.blocks[0] = Broken()
    with pytest.raises(ValueError, match='this block is broken'):
        model(torch.randn(1, 3, 64, 64))
    assert model.compile_failure is None


@pytest.mark.parametrize('value', ['yes', 3])
def test_compile_cfg_rejects_bad_values(value):
    with pytest.raises(ValueError, match='compile_cfg must be None, a bool'):
        XCiT('nano_12_p16', compile_cfg=value)


def test_xca_matrix_in_fp32_under_fp16_autocast():
    """``z^T z`` grows with the token count (70000 tokens: diagonal ~7e4,
    beyond fp16's 65504); the C x C algebra runs with autocast off, so an
    fp16 autocast (CUDA's AMP) gives the fp32 result, not inf / NaN."""
    torch.manual_seed(0)
    z = torch.randn(1, 70000, 32)
    gram, total = second_moments.gram(z), z.sum(dim=1)
    args = (torch.randn(96, 32) * 0.2, torch.randn(96) * 0.1,
            torch.randn(32, 32) * 0.2, torch.zeros(32), torch.ones(4, 1, 1),
            4, nn.Identity())
    ref = second_moments.xca_matrix(gram, total, 70000, *args)
    with torch.autocast('cpu', dtype=torch.float16):
        out = second_moments.xca_matrix(gram, total, 70000, *args)
    for o, r in zip(out, ref):
        assert o.dtype == torch.float32 and torch.equal(o, r)
