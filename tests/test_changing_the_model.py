"""A module a researcher replaces, wraps or subclasses runs as written.

Every fast path runs only for the exact module types and states it was
written for; anything else goes through its own ``forward``. Each test makes
a change whose effect is known exactly (a branch scaled by ``s`` equals the
unchanged model with that branch's layer scale times ``s``, ...) and checks
the fast model against it, in eval and in training.
"""
import copy
from functools import partial

import pytest
import torch
import torch.nn as nn
from timm.models.xcit import ConvPatchEmbed as TimmConvPatchEmbed
from timm.models.xcit import XCABlock as TimmXCABlock

from xcit_dense import XCiT, fast_path
from xcit_dense.models.block import XCABlock
from xcit_dense.models.lpi import LPI
from xcit_dense.models.ops import second_moments
from xcit_dense.models.pyramid import TransposedConvUpsampler
from xcit_dense.models.xca import XCA

from test_fast_path import assert_outputs_close, randomized, reference  # noqa: I100

pytestmark = pytest.mark.usefixtures('fast_paths_at_any_size')


class Scaled(nn.Module):
    """A wrapper: ``s * module(*args)``."""

    def __init__(self, module, s):
        super().__init__()
        self.module, self.s = module, s

    def forward(self, *args):
        return self.s * self.module(*args)


def outputs(model, x, mode):
    """The model's outputs in ``mode`` (training: batch statistics, with
    autograd)."""
    model.train(mode == 'train')
    if mode == 'train':
        return [o.detach() for o in model(x)]
    with torch.no_grad():
        return model(x)


X = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope='module')
def _one_randomized():
    """One :func:`randomized` model and its values as built."""
    model = randomized()
    return model, copy.deepcopy(model.state_dict())


@pytest.fixture
def randomized_again(_one_randomized):
    """The module's :func:`randomized` model for a test that customises a
    module's call: its values as built (a call in training moves
    BatchNorm's statistics), and afterwards no forward hook or instance
    ``forward`` left (loading the values takes a fifth of a copy's time)."""
    model, state = _one_randomized
    model.load_state_dict(state)
    yield model
    for module in model.modules():
        for hooks in (module._forward_hooks, module._forward_hooks_with_kwargs,
                      module._forward_hooks_always_called):
            hooks.clear()
        module.__dict__.pop('forward', None)


@pytest.mark.parametrize('mode', ['eval', 'train'])
@pytest.mark.parametrize('branch,gamma', [('attn', 'gamma1'),
                                          ('local_mp', 'gamma3'),
                                          ('mlp', 'gamma2')])
def test_wrapped_branch_scales_like_its_layer_scale(branch, gamma, mode):
    model = randomized()
    expected = copy.deepcopy(model)
    setattr(model.blocks[1], branch,
            Scaled(getattr(model.blocks[1], branch), 0.5))
    with torch.no_grad():
        getattr(expected.blocks[1], gamma).mul_(0.5)
    assert_outputs_close(outputs(model, X, mode), outputs(expected, X, mode))
    assert_outputs_close(outputs(model, X, mode), reference(model, X))


class HalfLPI(LPI):
    def forward(self, x, H, W):
        return 0.5 * super().forward(x, H, W)


class NoAttention(XCA):
    def forward(self, x):
        return torch.zeros_like(x)


class IdentityBlock(XCABlock):
    def forward(self, x, H, W):
        return x


@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_subclassed_modules_run_their_own_forward(mode):
    model = randomized()
    expected = copy.deepcopy(model)
    blk = model.blocks[0]
    for name, cls in [('local_mp', HalfLPI), ('attn', NoAttention)]:
        sub = cls.__new__(cls)
        sub.__dict__.update(getattr(blk, name).__dict__)
        setattr(blk, name, sub)
    identity = IdentityBlock.__new__(IdentityBlock)
    identity.__dict__.update(model.blocks[2].__dict__)
    model.blocks[2] = identity
    with torch.no_grad():
        expected.blocks[0].gamma3.mul_(0.5)
        expected.blocks[0].gamma1.zero_()
        for gamma in ('gamma1', 'gamma2', 'gamma3'):
            getattr(expected.blocks[2], gamma).zero_()
    assert_outputs_close(outputs(model, X, mode), outputs(expected, X, mode))


@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_replaced_pyramid_resamplers(mode):
    model = randomized()
    unchanged = outputs(copy.deepcopy(model), X, mode)

    class PlusOne(TransposedConvUpsampler):
        def forward(self, x):
            return super().forward(x) + 1

    plus_one = PlusOne.__new__(PlusOne)
    plus_one.__dict__.update(model.fpn1.__dict__)
    model.fpn1 = plus_one
    model.fpn2 = Scaled(model.fpn2, 3.0)
    outs = outputs(model, X, mode)
    assert_outputs_close(outs, [unchanged[0] + 1, 3 * unchanged[1],
                                unchanged[2], unchanged[3]])
    # an nn.Sequential as any other: slicing gives the same class
    assert type(model.fpn1[0:2]) is PlusOne and len(model.fpn1[0:2]) == 2


@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_wrapped_stem_and_positional_encoding(mode):
    model = randomized()
    expected = copy.deepcopy(model)
    model.pos_embed = Scaled(model.pos_embed, 0.0)
    with torch.no_grad():
        expected.pos_embed.token_projection.weight.zero_()
        expected.pos_embed.token_projection.bias.zero_()
    assert_outputs_close(outputs(model, X, mode), outputs(expected, X, mode))

    class Shifted(nn.Module):  # the stem's tokens, shifted by 0.1
        def __init__(self, stem):
            super().__init__()
            self.stem = stem

        def forward(self, x):
            tokens, grid = self.stem(x)
            return tokens + 0.1, grid

    model.patch_embed = Shifted(model.patch_embed)
    changed = outputs(model, X, mode)
    with fast_path(False):
        assert_outputs_close(changed, outputs(model, X, mode))
    assert not torch.allclose(changed[2], outputs(expected, X, mode)[2])


#: tensors the fast paths fold or cast in inference: the stem's and the
#: up-sampler's BatchNorm (folded into the convolution before it), LPI's and
#: the MLP's layer scales and the layers they are folded into
WRITTEN = ('patch_embed.proj.0.1.weight', 'patch_embed.proj.2.1.running_var',
           'fpn1.1.running_mean', 'fpn1.0.weight', 'blocks.0.gamma3',
           'blocks.1.gamma2', 'blocks.2.mlp.fc2.weight',
           'blocks.3.local_mp.conv2.weight')


def _write(model, name, how):
    """``model``'s tensor ``name`` times 1.5, written ``how``."""
    tensor = model.get_parameter(name) if name in dict(
        model.named_parameters()) else model.get_buffer(name)
    if how == '.data':  # as mmengine's EMAHook writes (no version counted)
        tensor.data.mul_(1.5)
    elif how == 'in place':
        with torch.no_grad():
            tensor.mul_(1.5)
    elif how == 'new data':
        tensor.data = tensor.data * 1.5
    else:
        state = model.state_dict()
        state[name] = state[name] * 1.5
        model.load_state_dict(state)


@pytest.mark.parametrize('how', ['.data', 'in place', 'new data',
                                 'load_state_dict'])
def test_weights_written_between_calls_are_read_by_the_next(how):
    """What inference derives from the weights (folds, casts) is derived on
    every call: a weight or statistic written in any way between two calls,
    through ``.data`` too (which no version counter records), and the
    positional encoding's settings, are read by the next call as the
    straightforward computation reads them."""
    model = randomized().eval()
    for name in WRITTEN:
        with torch.no_grad():
            model(X)
        _write(model, name, how)
        with torch.no_grad():
            assert_outputs_close(model(X), reference(model, X))
    model.pos_embed.temperature, model.pos_embed.scale = 100, 3.0
    with torch.no_grad():
        assert_outputs_close(model(X), reference(model, X))


@pytest.mark.parametrize('skip_buffer', [True, False])
def test_mean_teacher_updates_reach_the_teachers_inference(skip_buffer):
    """mmdet's MeanTeacherHook (semi-supervised detection) moves the
    teacher's parameters, and its buffers unless ``skip_buffer``, towards
    the student's through ``.data``; the teacher, an eval-mode model
    predicting pseudo-labels every iteration, computes with the weights as
    they are after each update."""
    from mmdet.engine.hooks import MeanTeacherHook
    pair = nn.Module()
    pair.teacher, pair.student = randomized(seed=0).eval(), randomized(seed=1)
    hook = MeanTeacherHook(momentum=0.5, skip_buffer=skip_buffer)
    for _ in range(3):
        with torch.no_grad():
            outs = pair.teacher(X)
        assert_outputs_close(outs, reference(pair.teacher, X))
        hook.momentum_update(pair, 0.5)
        with torch.no_grad():
            for p in pair.student.parameters():
                p.add_(0.1 * torch.randn_like(p))
    with torch.no_grad():
        assert_outputs_close(pair.teacher(X), reference(pair.teacher, X))


def test_stem_replaced_for_other_channels_takes_them():
    """A stem whose first convolution takes 4 channels (RGB-D, say): the
    backbone takes 4-channel images, as its stem now does, and refuses
    3-channel ones with its own message."""
    torch.manual_seed(0)
    model = XCiT(arch='nano_12_p16', depth=4, out_indices=(0, 1, 2, 3))
    first = model.patch_embed.proj[0][0]
    model.patch_embed.proj[0][0] = nn.Conv2d(
        4, first.out_channels, first.kernel_size, first.stride,
        first.padding, bias=False)
    model.eval()
    x = torch.randn(1, 4, 40, 56)
    with torch.no_grad():
        outs = model(x)
        with fast_path(False):
            refs = model(x)
    assert_outputs_close(outs, refs)
    with pytest.raises(ValueError, match=r'\(B, 4, H, W\).*\(1, 3, 40, 56\)'):
        model(torch.randn(1, 3, 40, 56))


def test_dropout_switched_on_in_an_eval_model():
    """MC dropout: dropout modules put in training mode inside an eval-mode
    model act (rate 1: everything dropped, so the effect is exact)."""
    model = randomized(drop_rate=1.0, attn_drop_rate=1.0,
                       drop_path_rate=1.0).eval()
    expected = copy.deepcopy(model).eval()
    blk = model.blocks[1]
    blk.mlp.drop1.train()  # fc1's output dropped: the MLP gives fc2's bias
    blk.attn.attn_drop.train()  # attention dropped: XCA gives proj's bias
    blk.drop_path3.train()  # the local branch dropped
    with torch.no_grad():
        exp = expected.blocks[1]
        exp.mlp.fc1.weight.zero_()  # GELU(0) = 0
        exp.mlp.fc1.bias.zero_()
        exp.attn.proj.weight.zero_()
        exp.gamma3.zero_()
        assert_outputs_close(model(X), expected(X))
        assert not torch.allclose(model(X)[3], randomized().eval()(X)[3])


@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_other_activations_and_padding_modes_are_honoured(mode):
    model = randomized()
    before = outputs(copy.deepcopy(model), X, mode)
    for blk in model.blocks:
        blk.mlp.act = nn.GELU(approximate='tanh')
        blk.local_mp.act = nn.ReLU()
        blk.local_mp.conv1.padding_mode = 'reflect'
    model.patch_embed.proj[1] = nn.SiLU()
    model.fpn1[2] = nn.ReLU()
    changed = outputs(model, X, mode)
    with fast_path(False):
        assert_outputs_close(changed, outputs(model, X, mode))
    for level in range(4):
        assert not torch.allclose(changed[level], before[level])


def test_fast_path_taken_only_where_written_for(monkeypatch):
    """The default model takes XCA's second-moment path in every block;
    ``fast_path(False)``, ``fast_path=False`` and a subclass do not."""
    calls = []
    original = second_moments.xca_matrix

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(second_moments, 'xca_matrix', counting)
    model = randomized().eval()
    with torch.no_grad():
        model(X)
        assert len(calls) == 4
        with fast_path(False):
            model(X)
        assert len(calls) == 4
        model.set_fast_path(False)
        assert not any(getattr(m, 'use_fast_path', False)
                       for m in model.modules())
        model(X)
        assert len(calls) == 4
        model.set_fast_path(True)
        model.blocks[0].attn = NoAttention.__new__(NoAttention)
        model.blocks[0].attn.__dict__.update(model.blocks[1].attn.__dict__)
        model(X)
        assert len(calls) == 7
    switched = [m.use_fast_path for m in XCiT(
        'nano_12_p16', depth=4, out_indices=(0, 1, 2, 3),
        fast_path=False).modules() if hasattr(m, 'use_fast_path')]
    assert len(switched) == 1 + 1 + 4 * 4 + 2 and not any(switched)


#: a module of each kind whose call a fast path computes itself
HOOKED = ['patch_embed.proj.0.0', 'patch_embed.proj.0.1', 'patch_embed.proj.1',
          'pos_embed.token_projection', 'blocks.1.norm1', 'blocks.1.attn',
          'blocks.1.attn.qkv', 'blocks.1.attn.proj', 'blocks.1.local_mp',
          'blocks.1.local_mp.conv1', 'blocks.1.local_mp.act',
          'blocks.1.local_mp.bn', 'blocks.1.local_mp.conv2', 'blocks.1.mlp',
          'blocks.1.mlp.fc1', 'blocks.1.mlp.act', 'blocks.1.mlp.fc2',
          'fpn1.0', 'fpn1.1', 'fpn1.3', 'fpn2.0']


@pytest.mark.parametrize('mode', ['eval', 'train'])
@pytest.mark.parametrize('how', ['hook', 'forward'])
@pytest.mark.parametrize('name', HOOKED)
def test_a_customised_call_runs_on_every_call_of_its_module(
        name, how, mode, randomized_again):
    """A forward hook on any module of the backbone (a feature
    extractor's, Grad-CAM's, a FLOP counter's), or a ``forward`` set on
    the instance, is called as often, on inputs of the same shapes, as in
    the straightforward computation, and what it returns is that module's
    output: with one that halves it, the model computes what the
    straightforward one computes with it."""
    model = randomized_again
    module = model.get_submodule(name)
    shapes = []

    def halve(module, args, output):
        shapes.append(tuple(args[0].shape))
        return 0.5 * output
    if how == 'hook':
        module.register_forward_hook(halve)
    else:
        forward = module.forward
        module.forward = lambda *args: halve(module, args, forward(*args))
    outs = outputs(model, X, mode)
    fast, shapes[:] = shapes[:], []
    with fast_path(False):
        refs = outputs(model, X, mode)
    assert fast == shapes and shapes
    assert_outputs_close(outs, refs)


def test_hooks_turn_off_only_the_fast_paths_that_would_skip_them(
        monkeypatch):
    """A hook on block 1's ``qkv`` layer turns off the fast path of that
    block's attention (which computes ``qkv``'s call itself), not the
    others'; the other kinds of hooks are called as well: pre-hooks,
    backward hooks, global ones, and the pre-hooks of ``weight_norm`` and
    of ``torch.nn.utils.prune``, which recompute the weight before each
    call."""
    calls = []
    original = second_moments.xca_matrix
    monkeypatch.setattr(second_moments, 'xca_matrix',
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    model = randomized().eval()
    handle = model.blocks[1].attn.qkv.register_forward_hook(
        lambda *args: None)
    with torch.no_grad():
        model(X)
        assert len(calls) == 3  # blocks 0, 2 and 3
        handle.remove()
        calls.clear()
        model(X)
        assert len(calls) == 4

    seen = []
    pre = model.blocks[2].mlp.fc2.register_forward_pre_hook(
        lambda *args: seen.append('pre'))
    back = model.blocks[2].local_mp.conv2.register_full_backward_hook(
        lambda *args: seen.append('backward'))
    outs = model.train()(X)
    sum(o.sum() for o in outs).backward()
    assert seen == ['pre', 'backward']
    pre.remove(), back.remove()
    called = {True: [], False: []}
    for setting in called:
        handle = nn.modules.module.register_module_forward_hook(
            lambda module, args, output: called[setting].append(module))
        try:
            with torch.no_grad(), fast_path(setting):
                model.eval()(X)
        finally:
            handle.remove()
    assert called[True] == called[False]
    assert sum(type(m) is nn.Linear for m in called[True]) == 4 * 4

    from torch.nn.utils import prune, weight_norm
    with pytest.warns(FutureWarning):
        fc1 = weight_norm(model.blocks[3].mlp.fc1)
    conv = prune.l1_unstructured(model.blocks[2].local_mp.conv1, 'weight',
                                 amount=0.5)
    with torch.no_grad():  # as an optimizer's step moves them
        fc1.weight_g.mul_(0.5)
        conv.weight_orig.mul_(2)
    assert_outputs_close(outputs(model, X, 'eval'), reference(model, X))


@pytest.mark.filterwarnings('ignore:torch.utils.checkpoint. the use_reentrant')
def test_mmengines_activation_checkpointing_of_a_branch_checkpoints_it(
        monkeypatch):
    """mmengine's ``activation_checkpointing = ['backbone.blocks.1.mlp',
    ...]`` sets a checkpointing ``forward`` on those modules: each is
    checkpointed on every step (the block and LPI's own fast paths leave
    those calls to them), with the gradients of the straightforward
    computation."""
    from mmengine.runner import activation_checkpointing
    calls = []
    checkpoint = activation_checkpointing.checkpoint
    monkeypatch.setattr(
        activation_checkpointing, 'checkpoint',
        lambda fn, *args: calls.append(1) or checkpoint(fn, *args))
    model = randomized().train()
    ref = copy.deepcopy(model)
    activation_checkpointing.turn_on_activation_checkpointing(
        model, ['blocks.1.mlp', 'blocks.2.local_mp.conv1', 'fpn1'])
    grads = []
    for m, setting in ((model, True), (ref, False)):
        with fast_path(setting):
            outs = m(X)
        sum((o * o).mean() for o in outs).backward()
        grads.append([p.grad for p in m.parameters()])
    assert len(calls) == 3
    for grad, ref_grad in zip(*grads):
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)


def test_mmengines_efficient_conv_bn_eval_of_the_stem_runs_it(monkeypatch):
    """mmengine's ``efficient_conv_bn_eval = ['backbone.patch_embed.proj']``
    sets the forward of an FX trace on the stem's layers: its conv-BN
    pairs run through mmengine's function on every call (the stem's own
    fast path leaves them to it), with the straightforward outputs."""
    from mmengine.model import efficient_conv_bn_eval as ecbe
    calls = []
    fused = ecbe.efficient_conv_bn_eval_forward
    monkeypatch.setattr(ecbe, 'efficient_conv_bn_eval_forward',
                        lambda *args: calls.append(1) or fused(*args))
    model = randomized()
    ref = copy.deepcopy(model)
    ecbe.turn_on_efficient_conv_bn_eval(model, ['patch_embed.proj'])
    assert_outputs_close(outputs(model, X, 'eval'), reference(ref.eval(), X))
    assert len(calls) == 4  # the stem's four conv-BN pairs


def test_straightforward_paths_are_timms_arithmetic():
    """Without the fast path, the block and the stem compute exactly what
    timm's modules compute (the published design)."""
    torch.manual_seed(0)
    ours = randomized().eval()
    timm_block = TimmXCABlock(128, 4, qkv_bias=True, eta=1.0,
                              norm_layer=partial(nn.LayerNorm, eps=1e-6))
    timm_block.eval()
    timm_block.load_state_dict(ours.blocks[0].state_dict())
    timm_stem = TimmConvPatchEmbed(patch_size=16, embed_dim=128).eval()
    timm_stem.load_state_dict(ours.patch_embed.state_dict())
    tokens = torch.randn(2, 12, 128)
    with torch.no_grad(), fast_path(False):
        assert torch.equal(ours.blocks[0](tokens, 3, 4),
                           timm_block(tokens, 3, 4))
        ours_tokens, grid = ours.patch_embed(X)
        timm_tokens, timm_grid = timm_stem(X)
    assert grid == timm_grid and torch.equal(ours_tokens, timm_tokens)


class DoubledBatchNorm(nn.BatchNorm2d):
    """A BatchNorm subclass with a forward of its own."""

    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize('where', ['stem', 'pyramid'])
def test_a_batch_norm_subclass_runs_its_forward_where_norms_fold(where):
    """In eval mode the stem's and the pyramid's BatchNorms fold into the
    convolutions before them: a subclass is called, not folded."""
    model = randomized().eval()
    old = model.patch_embed.proj[0][1] if where == 'stem' else model.fpn1[1]
    new = DoubledBatchNorm(old.num_features).eval()
    new.load_state_dict(old.state_dict())
    if where == 'stem':
        model.patch_embed.proj[0][1] = new
    else:
        model.fpn1[1] = new
    with torch.no_grad():
        assert_outputs_close(model(X), reference(model, X))


@pytest.mark.parametrize('gamma,shape', [('gamma1', ()), ('gamma1', (1, 1)),
                                         ('gamma2', (1, 1)),
                                         ('gamma3', (1, 1))])
@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_layer_scales_of_other_shapes_run_as_written(gamma, shape, mode):
    """A layer scale that is not one value per channel (a scalar, as
    ReZero's, or a broadcast (1, 1, C) one) runs as the straightforward
    computation broadcasts it."""
    model = randomized()
    channels = model.blocks[0].gamma1.shape
    value = torch.full(shape + (channels if shape else ()), 0.5)
    setattr(model.blocks[0], gamma, nn.Parameter(value))
    assert_outputs_close(outputs(model, X, mode),
                         outputs_straightforward(model, X, mode))


def outputs_straightforward(model, x, mode):
    with fast_path(False):
        return outputs(model, x, mode)


@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_gradients_enabled_inside_inference_mode(mode):
    """``enable_grad`` inside ``inference_mode`` (autograd records nothing
    there): the outputs of the straightforward computation, no error."""
    model = randomized().train(mode == 'train')
    expected = copy.deepcopy(model)
    with torch.inference_mode(), torch.enable_grad():
        outs = model(X)
        assert not any(o.requires_grad for o in outs)
    with torch.no_grad(), fast_path(False):
        refs = expected(X)
    assert_outputs_close([o.clone() for o in outs], refs)


def test_torch_func_transforms():
    """``torch.func.grad`` of a ``functional_call`` and ``vmap`` give what
    the straightforward computation gives."""
    from torch.func import functional_call, grad, vmap
    model = randomized().eval()
    params = {k: v.detach() * 1.1 for k, v in model.named_parameters()}

    def loss(p):
        return sum(o.square().mean()
                   for o in functional_call(model, p, (X, )))

    got = grad(loss)(params)
    with fast_path(False):
        expected = grad(loss)(params)
    for name in params:
        torch.testing.assert_close(got[name], expected[name], rtol=0,
                                   atol=1e-4 * expected[name].abs().max()
                                   + 1e-12, msg=name)
    batched = X[:, None]  # two calls of batch 1
    with torch.no_grad():
        outs = vmap(model)(batched)
        assert_outputs_close([o[:, 0] for o in outs], reference(model, X))
