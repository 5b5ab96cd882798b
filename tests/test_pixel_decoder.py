"""Float32MSDeformAttnPixelDecoder (xcit_dense/pixel_decoder.py): mmdet's
Mask2Former pixel decoder with autocast off inside, as Mask2Former's
published code runs it; mmdet's bit for bit without autocast, its
checkpoint keys; the Mask2Former recipes (COCO and ADE20K) build it."""
import copy

import pytest
import torch
from mmengine.config import Config, ConfigDict
from mmengine.registry import DefaultScope

from conftest import REPO

#: mmdet's Mask2Former pixel decoder as its recipes set it, narrowed: 3
#: encoder levels of the 4 inputs, one encoder layer
DECODER = dict(
    in_channels=[16, 16, 16, 16], strides=[4, 8, 16, 32], feat_channels=32,
    out_channels=32, num_outs=3, norm_cfg=dict(type='GN', num_groups=8),
    act_cfg=dict(type='ReLU'),
    encoder=dict(num_layers=1, layer_cfg=dict(
        self_attn_cfg=dict(embed_dims=32, num_heads=4, num_levels=3,
                           num_points=2, dropout=0.0, batch_first=True),
        ffn_cfg=dict(embed_dims=32, feedforward_channels=64,
                     num_fcs=2, ffn_drop=0.0,
                     act_cfg=dict(type='ReLU', inplace=True)))),
    positional_encoding=dict(num_feats=16, normalize=True))


def build(type_, scope='mmdet'):
    from mmdet.registry import MODELS

    import xcit_dense.pixel_decoder  # noqa: F401  (registers it)
    with DefaultScope.overwrite_default_scope(scope):
        return MODELS.build(ConfigDict(copy.deepcopy(DECODER), type=type_))


def features(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 16, 32 // s, 48 // s, generator=g)
            for s in (1, 2, 4, 8)]


def flat(outputs):
    mask_feature, multi_scale = outputs
    return [mask_feature, *multi_scale]


def under_autocast(mmdets, ours, feats, dtype):
    """Without gradients, under autocast in ``dtype`` on the features'
    device: mmdet's decoder's outputs on ``feats``, and ours on the
    features in ``dtype`` (what autocast hands it: a backbone's half
    precision features); and outside autocast mmdet's on those same
    features in fp32."""
    with torch.no_grad():
        with torch.autocast(feats[0].device.type, dtype=dtype):
            low = flat(mmdets(feats))
            given = [f.to(dtype) for f in feats]
            outs = flat(ours(given))
        reference = flat(mmdets([f.float() for f in given]))
    return low, outs, reference


def test_fp32_under_autocast_and_mmdets_without():
    mmdets = build('MSDeformAttnPixelDecoder')
    ours = build('xcit_dense.Float32MSDeformAttnPixelDecoder')
    ours.load_state_dict(mmdets.state_dict(), strict=True)
    assert ours.state_dict().keys() == mmdets.state_dict().keys()
    feats = features(0)
    with torch.no_grad():
        expected = flat(mmdets(feats))
        for out, ref in zip(flat(ours(feats)), expected):
            assert torch.equal(out, ref)
    low, outs, reference = under_autocast(mmdets, ours, feats,
                                          torch.bfloat16)
    # mmdet's computes in bf16 under autocast; ours as fp32 on the same
    # inputs, bit for bit
    assert {o.dtype for o in low} == {torch.bfloat16}
    for out, ref in zip(outs, reference):
        assert out.dtype == torch.float32
        assert torch.equal(out, ref)
    # and its gradients reach the inputs in their dtype
    given = [f.bfloat16().requires_grad_() for f in feats]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = sum(o.sum() for o in flat(ours(given)))
    loss.backward()
    assert all(f.grad is not None and f.grad.dtype == torch.bfloat16
               for f in given)


@pytest.mark.parametrize('path, head, scope', [
    ('coco/mask2former_xcit_s12_p16_lsj_50e_coco.py', 'panoptic_head',
     'mmdet'),
    ('coco/demo_mask2former_xcit_nano_synthetic.py', 'panoptic_head',
     'mmdet'),
    ('ade20k/mask2former_xcit_s12_p16_160k_ade20k.py', 'decode_head',
     'mmseg')])
def test_mask2former_recipes_decode_in_fp32(path, head, scope):
    """The recipes' pixel decoder, built as their heads build it (the
    config's own imports, mmdet's or mmseg's scope)."""
    from mmdet.registry import MODELS
    from mmengine.utils import import_modules_from_strings

    from xcit_dense.pixel_decoder import Float32MSDeformAttnPixelDecoder
    cfg = Config.fromfile(str(REPO / 'configs' / path))
    # the config imports the module that registers it
    assert 'xcit_dense.pixel_decoder' in cfg.custom_imports.imports
    import_modules_from_strings(**cfg.custom_imports)
    decoder = cfg.model[head].pixel_decoder
    assert decoder.type == 'xcit_dense.Float32MSDeformAttnPixelDecoder'
    with DefaultScope.overwrite_default_scope(scope):
        built = MODELS.build(dict(
            decoder, in_channels=[384] * 4,
            feat_channels=cfg.model[head].feat_channels,
            out_channels=cfg.model[head].out_channels))
    assert type(built) is Float32MSDeformAttnPixelDecoder
