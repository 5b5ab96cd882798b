"""The XCiT backbone: presets, pyramid shapes, training switches, arguments."""
import contextlib
import copy
import math
import re
import threading
from collections import OrderedDict

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.xcit import PositionalEncodingFourier
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from xcit_dense import ARCH_SETTINGS, XCiT
from xcit_dense.models.positional_encoding import CachedFourierEncoding
from xcit_dense.models.presets import OUT_STRIDES

from models_meta import on_meta
from tool_runs import run_tool_here

SIZES = [(224, 224), (256, 320), (333, 517)]
STRIDES = (4, 8, 16, 32)


def published_side(n, patch, stride):
    """Rows (or columns) of the published backbone's level of ``stride``
    for ``n`` of the image's: the token grid, ``ceil(n / patch)``,
    up-sampled, or max-pooled rounding down."""
    grid = -(-n // patch)
    return grid * patch // stride if stride <= patch else \
        grid // (stride // patch)


def tiny(arch='nano_12_p16', **kwargs):
    """A preset shrunk to 4 blocks (dims, heads, patch and eta kept)."""
    kwargs.setdefault('depth', 4)
    kwargs.setdefault('out_indices', (0, 1, 2, 3))
    return XCiT(arch=arch, **kwargs)


def test_fourteen_presets():
    names = {f'{s}_p{p}' for s in ('nano_12', 'tiny_12', 'small_12',
                                   'tiny_24', 'small_24', 'medium_24',
                                   'large_24') for p in (16, 8)}
    assert set(ARCH_SETTINGS) == names


@pytest.mark.parametrize('arch', sorted(ARCH_SETTINGS))
def test_preset_matches_timm(arch):
    """Every preset has exactly timm's backbone weights (names and shapes),
    and the default taps of the published detection configs. Both built on
    the meta device (shapes without values: a second for large_24 instead
    of four); the layer scale's initial value on the preset shrunk (4
    blocks, 64 channels: the preset's value at any width)."""
    with on_meta():
        model = XCiT(arch=arch)
        ref = timm.create_model(f'xcit_{arch}_224', pretrained=False)
    classification = ('cls_token', 'cls_attn_blocks.', 'norm.', 'head.')
    expected = {k: v.shape for k, v in ref.state_dict().items()
                if not k.startswith(classification)}
    ours = {k: v.shape for k, v in model.state_dict().items()
            if not k.startswith('fpn')}
    assert ours == expected
    depth = ARCH_SETTINGS[arch]['depth']
    assert model.out_indices == ((3, 5, 7, 11) if depth == 12 else
                                 (7, 11, 15, 23))
    eta = 1.0 if depth == 12 else 1e-5
    shrunk = tiny(arch, embed_dim=64, num_heads=2)
    assert torch.all(shrunk.blocks[0].gamma1 == eta)


@pytest.fixture(scope='module')
def pyramid_runs():
    """The pyramid's outputs of a shrunk preset at each of :data:`SIZES`,
    by the settings the shrunk model depends on (depth and eta apart, the
    presets of 12 and of 24 blocks shrink to the same model)."""
    return {}


def pyramid_outputs(arch, runs):
    """:func:`tiny`'s ``arch`` at each of :data:`SIZES`: computed for the
    presets up to 192 wide, on fake tensors (shapes without values, the
    same code on the CPU) for the wider, whose computation at these sizes
    takes seconds and shows no other shapes; one run per shrunk model."""
    settings = ARCH_SETTINGS[arch]
    key = tuple(settings[k] for k in ('embed_dim', 'num_heads', 'patch_size'))
    if key in runs:
        return runs[key]
    wide = settings['embed_dim'] > 192
    fake = FakeTensorMode(allow_non_fake_inputs=True) if wide else \
        contextlib.nullcontext()
    with on_meta() if wide else contextlib.nullcontext():
        model = tiny(arch).eval()  # one model for the sizes
    if wide:  # its parameters and buffers fake tensors on the CPU
        with fake:
            model.to_empty(device='cpu')
    runs[key] = []
    for H, W in SIZES:
        with fake, torch.no_grad():
            runs[key].append(model(torch.randn(1, 3, H, W)))
    return runs[key]


@pytest.mark.parametrize('arch', sorted(ARCH_SETTINGS))
def test_pyramid_shapes(arch, pyramid_runs):
    """The pyramid's shapes of every preset at every size
    (:func:`pyramid_outputs`)."""
    dim, patch = (ARCH_SETTINGS[arch][k] for k in ('embed_dim', 'patch_size'))
    wide = dim > 192
    for (H, W), outs in zip(SIZES, pyramid_outputs(arch, pyramid_runs)):
        assert isinstance(outs[0], FakeTensor) == wide
        assert isinstance(outs, tuple) and len(outs) == 4
        for out, stride in zip(outs, STRIDES):
            assert out.shape == (1, dim, published_side(H, patch, stride),
                                 published_side(W, patch, stride)), (H, W)


@pytest.mark.parametrize('patch', [16, 8])
@pytest.mark.parametrize('size', [(26, 40), (65, 31), (100, 97)])
def test_odd_sizes(patch, size):
    """At sizes that are not multiples of 32: by default the published
    backbone's sizes (tests/test_published_models.py compares the values
    with its forward); ``out_sizes='ceil'``: exactly ceil(H/s) x ceil(W/s),
    the same values where both have them (its max-pooling keeps the last
    row and column of an odd grid, its up-sampled levels are cropped)."""
    torch.manual_seed(0)
    published = tiny(f'nano_12_p{patch}').eval()
    ceil = tiny(f'nano_12_p{patch}', out_sizes='ceil').eval()
    ceil.load_state_dict(published.state_dict())
    H, W = size
    x = torch.randn(2, 3, H, W)
    with torch.no_grad():
        outs, ceil_outs = published(x), ceil(x)
    assert [o.shape[-2:] for o in outs] == [
        (published_side(H, patch, s), published_side(W, patch, s))
        for s in STRIDES]
    assert [o.shape[-2:] for o in ceil_outs] == [
        (math.ceil(H / s), math.ceil(W / s)) for s in STRIDES]
    for out, ceil_out in zip(outs, ceil_outs):
        h, w = (min(a, b) for a, b in zip(out.shape[-2:],
                                          ceil_out.shape[-2:]))
        assert torch.equal(out[..., :h, :w], ceil_out[..., :h, :w])


@pytest.mark.parametrize('patch,levels,window,smallest', [
    (16, (0, 1, 2, 3), 2, 17), (8, (0, 1, 2, 3), 4, 25),
    (8, (0, 1, 2), 2, 9), (16, (0, 1, 2), 1, 1)])
def test_images_too_small_for_the_published_pooling(patch, levels, window,
                                                    smallest):
    """The published layout max-pools the token grid rounding down: an
    image whose grid is smaller than the pooling window is one paragraph
    naming the smallest size and ``out_sizes='ceil'``, which takes it; the
    smallest size runs."""
    model = tiny(f'nano_12_p{patch}', out_levels=levels).eval()
    ceil = tiny(f'nano_12_p{patch}', out_levels=levels,
                out_sizes='ceil').eval()
    with torch.no_grad():
        assert len(model(torch.zeros(1, 3, smallest, 40))) == len(levels)
        if smallest == 1:
            return
        small = torch.zeros(1, 3, 40, smallest - 1)
        with pytest.raises(ValueError, match=re.escape(
                f"XCiT(out_sizes='published') max-pools its grid of "
                f'ceil(H / {patch}) x ceil(W / {patch}) tokens by '
                f'{window} x {window}, '
                f'rounding down as the published backbone does, which '
                f'takes images of at least {smallest} x {smallest} '
                f'pixels; got shape (1, 3, 40, {smallest - 1}).') +
                ".*out_sizes='ceil'"):
            model(small)
        assert [o.shape[-1] for o in ceil(small)] == [
            math.ceil((smallest - 1) / OUT_STRIDES[i]) for i in levels]


@pytest.mark.parametrize('shape', [(3, 32, 32), (1, 1, 32, 32),
                                   (1, 3, 0, 32), (2, 3, 16, 0),
                                   (0, 3, 32, 32)])
@pytest.mark.parametrize('method', ['forward', 'forward_taps'])
def test_input_that_is_no_batch_of_images_is_named(shape, method):
    """An unbatched image, other channels, an empty side or batch: one
    message that names the shape taken and the shape given (not an error
    from deep inside a convolution, or from a fast path's channels-last
    copy), from ``forward`` and ``forward_taps`` alike."""
    with pytest.raises(ValueError, match=re.escape(
            'XCiT takes a batch of images, a tensor of shape (B, 3, H, W) '
            'with B, H, W >= 1') + '.*' + re.escape(f'got shape {shape}.')):
        getattr(tiny(), method)(torch.zeros(shape))


@pytest.mark.parametrize('dtype', [torch.uint8, torch.float64])
def test_images_of_another_dtype_are_named(dtype):
    """uint8 images (not normalised by a data preprocessor) or fp64 ones
    into an fp32 model: one paragraph naming both dtypes (also under
    autocast, which casts neither); under autocast fp16 images go in, and
    an fp64 model takes fp64 images."""
    model = tiny().eval()
    message = re.escape("XCiT takes images in its weights' dtype "
                        '(torch.float32; under torch.autocast float32, '
                        f'float16 or bfloat16), got {dtype}')
    with pytest.raises(ValueError, match=message):
        model(torch.zeros(1, 3, 32, 32, dtype=dtype))
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.raises(ValueError, match=message):
            model(torch.zeros(1, 3, 32, 32, dtype=dtype))
        model(torch.zeros(1, 3, 32, 32, dtype=torch.float16))
    model.double()(torch.zeros(1, 3, 32, 32, dtype=torch.float64))


def test_backbone_demo_prints_the_pyramid_and_refuses_empty_sizes():
    """The published layout's sizes by default; an image too small for it
    is one paragraph, taken with ``--out-sizes ceil``."""
    proc = run_tool_here('tools/demo_backbone.py', '--arch', 'nano_12_p16',
                         '--size', 33, 70)
    assert proc.returncode == 0, proc.stderr
    assert [line.split(':', 1)[1].strip() for line in proc.stdout.splitlines()
            if line.startswith('  level')] == [
        'stride  4  (1, 128, 12, 20)', 'stride  8  (1, 128, 6, 10)',
        'stride 16  (1, 128, 3, 5)', 'stride 32  (1, 128, 1, 2)']
    proc = run_tool_here('tools/demo_backbone.py', '--arch', 'nano_12_p8',
                         '--size', 24, 70)
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert 'takes images of at least 25 x 25 pixels' in proc.stderr
    assert "out_sizes='ceil'" in proc.stderr
    proc = run_tool_here('tools/demo_backbone.py', '--size', 0, 64)
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "argument --size: expected a positive integer, got '0'")


@pytest.mark.parametrize('patch,ops', [
    (16, ['up4', 'up2', 'id', 'pool2']),
    (8, ['up2', 'id', 'pool2', 'pool4']),
])
def test_published_resampling(patch, ops):
    model = tiny(f'nano_12_p{patch}')
    kinds = []
    for r in model.resamplers:
        if isinstance(r, nn.Identity):
            kinds.append('id')
        elif isinstance(r, nn.MaxPool2d):  # rounding down, as published
            assert not r.ceil_mode
            kinds.append(f'pool{r.kernel_size}')
        else:
            convs = [m for m in r if isinstance(m, nn.ConvTranspose2d)]
            assert all(c.kernel_size == (2, 2) and c.stride == (2, 2)
                       for c in convs)
            kinds.append(f'up{2 ** len(convs)}')
            if len(convs) == 2:  # ConvT, norm, GELU, ConvT
                assert isinstance(r[1], nn.BatchNorm2d)
                assert isinstance(r[2], nn.GELU)
    assert kinds == ops
    # names of the published detection checkpoints
    keys = [k for k in model.state_dict() if k.startswith('fpn')]
    if patch == 16:
        assert 'fpn1.0.weight' in keys and 'fpn1.3.weight' in keys
        assert 'fpn1.1.running_mean' in keys and 'fpn2.0.weight' in keys
    else:
        assert 'fpn1.0.weight' in keys


def test_levels_from_taps_exact():
    model = tiny('nano_12_p16').eval()
    x = torch.randn(1, 3, 128, 192)
    with torch.no_grad():
        taps = model.forward_taps(x)
        outs = model(x)
    assert torch.equal(outs[2], taps[2])
    assert torch.equal(outs[3], F.max_pool2d(taps[3], 2, 2))


def test_fourier_encoding_cached_and_exact():
    ours = CachedFourierEncoding(dim=64)
    ref = PositionalEncodingFourier(dim=64)
    ref.load_state_dict(ours.state_dict())
    for H, W in [(14, 14), (21, 33), (5, 50), (14, 14)]:
        assert torch.equal(ours(2, H, W), ref(2, H, W))
    assert len(ours._features) == 3
    a = ours.cached_features(7, 9, torch.device('cpu'))
    assert ours.cached_features(7, 9, torch.device('cpu')) is a
    assert ours.cached_features(7, 9, torch.device('cpu'),
                                torch.bfloat16).dtype == torch.bfloat16
    small = CachedFourierEncoding(dim=8, cache_size=2)
    for n in range(1, 6):
        small(1, n, n)
    assert [k[:2] for k in small._features] == [(4, 4), (5, 5)]
    # follows the weights' dtype
    small.to(torch.float64)
    ref64 = PositionalEncodingFourier(dim=8).to(torch.float64)
    ref64.load_state_dict(small.state_dict())
    assert torch.equal(small(1, 3, 4), ref64(1, 3, 4))


def test_fourier_encoding_cache_serves_several_threads():
    """One model served from several threads: a thread that evicts a grid
    while another looks it up (paused between finding it and marking it
    used, where the interpreter may switch threads) neither fails the
    lookup nor is failed by it."""
    enc = CachedFourierEncoding(dim=8, cache_size=1)
    cpu = torch.device('cpu')
    first = enc.cached_features(2, 3, cpu)
    looking, evicted = threading.Event(), threading.Event()

    class PausedLookups(OrderedDict):

        def move_to_end(self, key, last=True):
            looking.set()
            evicted.wait(timeout=0.5)  # unless the other thread is kept out
            super().move_to_end(key, last)

    def evict():
        looking.wait()
        enc.cached_features(4, 5, cpu)
        evicted.set()

    enc._features = PausedLookups(enc._features)
    other = threading.Thread(target=evict)
    other.start()
    assert enc.cached_features(2, 3, cpu) is first
    other.join()
    assert [key[:2] for key in enc._features] == [(4, 5)]


def test_fourier_encoding_gets_gradient():
    enc = CachedFourierEncoding(dim=16)
    enc(1, 4, 4).sum().backward()
    enc(1, 4, 4).sum().backward()  # cached features, fresh projection
    assert enc.token_projection.weight.grad is not None


def _grads(model, x):
    model.zero_grad()
    sum(o.square().mean() for o in model(x)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()
            if p.grad is not None}


def test_with_cp_same_gradients():
    torch.manual_seed(0)
    model = tiny('nano_12_p16').train()
    model_cp = copy.deepcopy(model)
    model_cp.set_grad_checkpointing(True)
    assert XCiT(arch='nano_12_p16', with_cp=True).grad_checkpointing
    x = torch.randn(2, 3, 64, 96)
    g, g_cp = _grads(model, x), _grads(model_cp, x)
    assert g.keys() == g_cp.keys() and len(g) > 0
    for name in g:
        torch.testing.assert_close(g[name], g_cp[name], rtol=1e-5,
                                   atol=1e-6, msg=name)


@pytest.mark.parametrize('patch', [16, 8])
def test_every_trainable_param_gets_gradient(patch):
    model = XCiT(arch=f'nano_12_p{patch}', out_indices=(1, 2, 4, 6),
                 drop_path_rate=0.1).train()
    assert len(model.blocks) == 7  # blocks after the last tap are not built
    grads = _grads(model, torch.randn(2, 3, 64, 64))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and trainable == set(grads)


def test_frozen_stages():
    model = tiny('nano_12_p16', frozen_stages=2).train()
    frozen = ['patch_embed', 'pos_embed', 'blocks.0.', 'blocks.1.']
    for name, p in model.named_parameters():
        assert p.requires_grad != name.startswith(tuple(frozen)), name
    stem_bn = model.patch_embed.proj[0][1]
    lpi_bn_frozen = model.blocks[1].local_mp.bn
    lpi_bn_live = model.blocks[2].local_mp.bn
    before = [m.running_mean.clone() for m in (stem_bn, lpi_bn_frozen,
                                               lpi_bn_live)]
    assert not stem_bn.training and not lpi_bn_frozen.training
    assert lpi_bn_live.training
    grads = _grads(model, torch.randn(2, 3, 64, 64))
    assert not any(n.startswith(tuple(frozen)) for n in grads)
    assert any(n.startswith('blocks.2.') for n in grads)
    assert torch.equal(stem_bn.running_mean, before[0])
    assert torch.equal(lpi_bn_frozen.running_mean, before[1])
    assert not torch.equal(lpi_bn_live.running_mean, before[2])


def test_norm_eval():
    model = tiny('nano_12_p16', norm_eval=True).train()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)
    assert model.blocks[0].training


def test_norm_cfg_default_bn_and_syncbn_by_config():
    assert not any(isinstance(m, nn.SyncBatchNorm)
                   for m in XCiT(arch='nano_12_p16').modules())
    model = tiny('nano_12_p16', norm_cfg=dict(type='SyncBN'))
    sync = [n for n, m in model.named_modules()
            if isinstance(m, nn.SyncBatchNorm)]
    assert 'patch_embed.proj.0.1' in sync
    assert 'blocks.0.local_mp.bn' in sync
    assert 'fpn1.1' in sync
    assert not any(type(m) is nn.BatchNorm2d for m in model.modules())


def test_explicit_arguments_override_preset():
    model = XCiT(arch='small_12_p16', embed_dim=96, num_heads=4, depth=6,
                 eta=0.5, out_indices=(1, 2, 3, 5))
    assert model.embed_dim == 96 and len(model.blocks) == 6
    assert model.blocks[0].attn.num_heads == 4
    assert torch.all(model.blocks[0].gamma1 == 0.5)
    # other depths tap the same relative positions as depth 12
    assert XCiT(arch=None, patch_size=8, embed_dim=32, depth=4,
                num_heads=2).out_indices == (0, 1, 2, 3)
    assert XCiT(arch='nano_12_p16', depth=6).out_indices == (1, 2, 3, 5)
    with pytest.raises(ValueError, match='out_indices'):
        XCiT(arch='nano_12_p16', depth=3)


def test_no_weight_decay_names():
    model = tiny('nano_12_p16')
    names = model.no_weight_decay()
    params = dict(model.named_parameters())
    assert names <= set(params)
    for expected in ['blocks.0.attn.temperature', 'blocks.3.gamma1',
                     'blocks.3.gamma2', 'blocks.3.gamma3',
                     'pos_embed.token_projection.weight',
                     'pos_embed.token_projection.bias',
                     'blocks.0.norm1.weight', 'blocks.0.norm3.bias',
                     'blocks.0.local_mp.bn.weight',
                     'patch_embed.proj.0.1.weight', 'fpn1.1.bias']:
        assert expected in names, expected
    for decayed in ['blocks.0.attn.qkv.weight', 'blocks.0.mlp.fc1.weight',
                    'blocks.0.local_mp.conv1.weight', 'fpn1.0.weight',
                    'patch_embed.proj.0.0.weight']:
        assert decayed not in names, decayed


@pytest.mark.parametrize('kwargs,match', [
    (dict(arch='huge_12_p16'),
     r"Unknown XCiT arch 'huge_12_p16'.*nano_12_p16"),
    (dict(arch='small_12_p16', patch_size=4), r'patch_size must be one of'
     r' \(8, 16\)'),
    (dict(arch='small_12_p16', out_indices=(3, 5, 7, 12)),
     r'out_indices must be 4 strictly increasing block indices in \[0, 11\]'),
    (dict(arch='small_12_p16', out_indices=(3, 5, 7)), r'out_indices must'),
    (dict(arch='small_12_p16', out_indices=(5, 3, 7, 11)), r'out_indices'),
    (dict(arch='small_12_p16', out_indices=(-1, 3, 7, 11)), r'out_indices'),
    (dict(arch='small_12_p16', frozen_stages=13), r'frozen_stages must be'),
    (dict(arch='small_12_p16', num_heads=5), r'divisible by num_heads'),
    (dict(arch=None, embed_dim=64), r'arch=None needs explicit'),
    (dict(arch='nano_12_p16', drop_path_rate=1.5),
     r'drop_path_rate must be in \[0, 1\].*got 1\.5'),
    (dict(arch='nano_12_p16', drop_path_rate=-0.1), r'drop_path_rate'),
    # type slips: one paragraph, not a TypeError from deep inside
    (dict(arch='nano_12_p16', drop_path_rate='0.1'), r'drop_path_rate'),
    (dict(arch='nano_12_p16', frozen_stages=None),
     r'frozen_stages must be an int'),
    (dict(arch='nano_12_p16', frozen_stages=1.5), r'frozen_stages'),
    (dict(arch='nano_12_p16', out_indices=11), r'out_indices.*got 11$'),
    (dict(arch='nano_12_p16', out_indices=(False, True, 7, 11)),
     r'out_indices'),
    (dict(arch='nano_12_p16', eta='1'), r'eta must be a number > 0'),
    (dict(arch='nano_12_p16', eta=0), r'eta must be a number > 0'),
    (dict(arch='nano_12_p16', mlp_ratio=-1), r'mlp_ratio must be'),
    (dict(arch='nano_12_p16', in_channels=0),
     r'in_channels must be a positive int'),
    (dict(arch='nano_12_p16', in_channels='3'), r'in_channels'),
    (dict(arch='nano_12_p16', qkv_bias='yes'),
     r'qkv_bias must be True or False'),
    (dict(arch='nano_12_p16', with_cp='yes'), r'with_cp must be'),
    (dict(arch='nano_12_p16', drop_rate=2), r'drop_rate must be a prob'),
    (dict(arch='nano_12_p16', compile_cfg=dict(moed='max-autotune')),
     r"compile_cfg takes torch.compile's arguments \(.*mode.*\); "
     r"got 'moed'"),
    # norms: what mmcv builds, checked on an NCHW map
    (dict(arch='nano_12_p16', norm_cfg=None),
     r"norm_cfg must be a dict with a 'type'"),
    (dict(arch='nano_12_p16', norm_cfg=dict(type='LN')),
     r"norm_cfg=\{'type': 'LN'\} does not normalise the backbone's "
     r'16-channel maps \(RuntimeError: Given normalized_shape'),
    (dict(arch='nano_12_p16', norm_cfg=dict(type='GN', num_groups=32)),
     r"16-channel maps \(ValueError: num_channels \(16\) must be "
     r'divisible.*embed_dim / 8'),
    (dict(arch='nano_12_p16', out_levels=()), r'out_levels must be'),
    (dict(arch='nano_12_p16', out_levels=(1, 4)),
     r'out_levels must be strictly increasing pyramid levels in \[0, 3\]'),
    (dict(arch='nano_12_p16', out_levels=(2, 1)), r'out_levels'),
    (dict(arch='nano_12_p16', out_sizes='floor'),
     r"out_sizes must be 'published' \(.*\) or 'ceil' \(ours: exactly "
     r"ceil\(H / s\) x ceil\(W / s\) at stride s\); got 'floor'"),
    (dict(arch='nano_12_p16', norm_cfg=dict(type='Foo')),
     r"norm_cfg=\{'type': 'Foo'\} does not normalise"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        XCiT(**kwargs)


@pytest.mark.parametrize('levels', [(1, 2, 3), (0, 1, 2), (3, )])
def test_out_levels_return_those_levels_and_build_nothing_else(levels):
    """``out_levels``: the maps of those levels, as the whole pyramid
    computes them; the other levels' resamplers and the blocks after the
    last one tapped are not built, and every parameter built gets a
    gradient (DDP needs no ``find_unused_parameters``)."""
    torch.manual_seed(0)
    whole = XCiT(arch='nano_12_p16', depth=4, out_indices=(0, 1, 2, 3))
    part = XCiT(arch='nano_12_p16', depth=4, out_indices=(0, 1, 2, 3),
                out_levels=levels)
    state = whole.state_dict()
    part.load_state_dict({k: v for k, v in state.items()
                          if k in part.state_dict()})
    assert [n for n, _ in part.named_children() if n.startswith('fpn')] == \
        [f'fpn{level + 1}' for level in levels]
    assert len(part.blocks) == levels[-1] + 1
    assert part.out_strides == tuple(4 * 2**level for level in levels)
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        expected = whole.eval()(x)
        got = part.eval()(x)
    assert len(got) == len(levels)
    for level, out in zip(levels, got):
        torch.testing.assert_close(out, expected[level])
    part.train()
    sum(o.sum() for o in part(x)).backward()
    assert all(p.grad is not None for p in part.parameters())


def test_deprecated_pretrained_is_the_init_cfg_it_names():
    """``pretrained``, as mmdet's and mmseg's backbones take it (mmseg's
    EncoderDecoder hands its model-level one on): a warning and the
    ``Pretrained`` init_cfg; with an init_cfg too, refused."""
    with pytest.warns(DeprecationWarning, match='pretrained is deprecated'):
        model = XCiT(arch='nano_12_p16', depth=4, out_indices=(0, 1, 2, 3),
                     pretrained='xcit.pth')
    assert model.init_cfg == dict(type='Pretrained', checkpoint='xcit.pth')
    with pytest.raises(ValueError, match='init_cfg and pretrained'):
        XCiT(arch='nano_12_p16', pretrained='xcit.pth',
             init_cfg=dict(type='Pretrained', checkpoint='other.pth'))


def test_arguments_of_numpy_and_other_norms():
    """numpy's integers where ints are asked for (a config computed with
    numpy), and the other 2-D norms mmcv builds: group norm with a
    num_groups that divides every width, instance norm, SyncBN."""
    import numpy as np
    x = torch.randn(1, 3, 32, 48)
    model = XCiT(arch='nano_12_p16', depth=np.int64(4),
                 out_indices=np.arange(4), frozen_stages=np.int32(1))
    assert model.depth == 4 and model.out_indices == (0, 1, 2, 3)
    assert type(model.depth) is int
    for norm_cfg in (dict(type='GN', num_groups=8), dict(type='IN'),
                     dict(type='SyncBN')):
        model = tiny(norm_cfg=norm_cfg)
        assert [o.shape[1] for o in model(x)] == [128] * 4
