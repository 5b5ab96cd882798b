"""The pre-flight's check that the neck, or without one the heads, take the
backbone's maps (xcit_dense/preflight/model.py, ``check_channels``): the
shipped config of each model family passes; with the backbone's preset
changed and the rest left as it was, the part that would fail at the first
forward is named in one paragraph with the setting that fixes it, and that
setting passes."""
import re

import pytest
from mmengine.config import Config

from xcit_dense.errors import UserError
from xcit_dense.preflight import check_backbone, check_channels

from conftest import REPO

FAMILIES = [  # config, the parts that take the maps, in the order checked
    ('coco/demo_mask_rcnn_xcit_nano_synthetic.py', ['model.neck']),
    ('coco/demo_mask2former_xcit_nano_synthetic.py',
     ['model.panoptic_head']),
    ('ade20k/demo_upernet_xcit_nano_synthetic.py',
     ['model.decode_head', 'model.auxiliary_head']),
    ('ade20k/demo_mask2former_xcit_nano_synthetic.py',
     ['model.decode_head']),
]


def _check(cfg):
    check_channels(cfg, check_backbone(cfg))


@pytest.mark.parametrize('config, parts', FAMILIES,
                         ids=['mask_rcnn', 'mask2former_coco', 'upernet',
                              'mask2former_ade20k'])
def test_parts_that_take_the_maps_must_take_them_as_they_come(config,
                                                              parts):
    cfg = Config.fromfile(str(REPO / 'configs' / config))
    _check(cfg)  # as shipped
    cfg.model.backbone.arch = 'tiny_12_p16'  # 192 channels, not nano's 128
    for key in parts:
        with pytest.raises(UserError) as error:
            _check(cfg)
        message = str(error.value)
        assert message.startswith(f'{key}.in_channels is '), message
        assert 'gives 4 maps of 192 channels' in message
        assert 'nano 128, tiny 192, small 384' in message
        fix = re.search(r'--cfg-options "(\S+)=(\S+)"$', message)
        assert fix and fix.group(1) == f'{key}.in_channels', message
        cfg.merge_from_dict({fix.group(1): eval(fix.group(2))})
    _check(cfg)  # set as the messages said


def test_a_neck_that_takes_fewer_maps_is_named():
    cfg = Config.fromfile(str(REPO / 'configs' / FAMILIES[0][0]))
    cfg.model.neck.in_channels = [128] * 3
    with pytest.raises(UserError, match=re.escape(
            '"model.neck.in_channels=[128,128,128,128]"')):
        _check(cfg)


def test_other_backbones_are_left_to_their_own_checks():
    cfg = Config.fromfile(str(REPO / 'configs' / FAMILIES[0][0]))
    cfg.model.backbone = dict(type='mmdet.ResNet', depth=50)
    _check(cfg)


def test_a_list_of_necks_is_named_as_cfg_options_names_it():
    """mmdet's necks may be a list; the first takes the maps, and the
    message's setting (``model.neck.0.in_channels``) is one mmengine's
    ``--cfg-options`` applies."""
    cfg = Config.fromfile(str(REPO / 'configs' / FAMILIES[0][0]))
    cfg.model.neck = [cfg.model.neck]
    cfg.model.backbone.arch = 'tiny_12_p16'
    with pytest.raises(UserError) as error:
        _check(cfg)
    key, value = re.search(r'--cfg-options "(\S+)=(\S+)"$',
                           str(error.value)).groups()
    assert key == 'model.neck.0.in_channels'
    cfg.merge_from_dict({key: eval(value)})
    assert cfg.model.neck[0].in_channels == [192] * 4
    _check(cfg)


def test_the_checkpoint_check_leaves_the_model_config_as_it_was(tmp_path):
    """``check_fits`` builds the model on the meta device from a copy of its
    config: mmdet's DeformableDETR (and DINO) set their head's arguments
    in the config they are given, and the runner's build of the same
    config then failed its assertion (tools/test.py, --resume, load_from)."""
    import torch
    from mmdet.registry import MODELS

    from xcit_dense.cli import load_config
    from xcit_dense.preflight import check_fits
    from xcit_dense.toolkits import use_toolkit
    config = tmp_path / 'ddetr.py'
    config.write_text(
        "_base_ = 'mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_"
        "coco.py'\n"
        "custom_imports = dict(imports=['xcit_dense'])\n"
        "model = dict(backbone=dict(_delete_=True, type='xcit_dense.XCiT', "
        "arch='nano_12_p16', depth=4, out_indices=(0, 1, 2, 3), "
        "init_cfg=None), neck=dict(in_channels=[128] * 4, num_outs=4))\n")
    cfg = load_config(str(config))
    use_toolkit('mmdet')
    before = cfg.model.to_dict()
    with torch.device('meta'):
        weights = MODELS.build(cfg.model).state_dict()
    cfg = load_config(str(config))
    check_fits(cfg, {'state_dict': weights}, allow_new_classes=False)
    assert cfg.model.to_dict() == before
    with torch.device('meta'):
        MODELS.build(cfg.model)  # as the runner builds it


@pytest.mark.parametrize('setting, message', [
    (dict(in_index=4), r'model\.decode_head\.in_index is 4, but the backbone '
     r'gives 4 maps \(indices 0 to 3'),
    (dict(in_index=[1, 2, 3]), r'in_channels is \[128, 128, 128, 128\].*'
     r'in_channels=\[128,128,128\]'),
    (dict(c1_in_channels=256, c1_in_index=0),
     r'c1_in_channels is 256, .*c1_in_channels=128'),
    (dict(c1_in_index=5), r'c1_in_index is 5'),
])
def test_heads_name_maps_the_backbone_gives(setting, message):
    """mmseg's ``in_index`` (one map or a list), DeepLabV3+'s low-level map
    (``c1_in_index``, ``c1_in_channels``): one paragraph before the run,
    where mmseg would end in an IndexError, an AssertionError or a
    convolution's shape error."""
    cfg = Config.fromfile(
        str(REPO / 'configs/ade20k/demo_upernet_xcit_nano_synthetic.py'))
    cfg.model.decode_head.update(setting)
    with pytest.raises(UserError, match=message):
        _check(cfg)


def test_a_neck_of_three_levels_takes_out_levels():
    """A neck built for the strides 8, 16, 32 (mmdet's ChannelMapper of DINO,
    RTMDet's CSPNeXtPAFPN: no level selector of their own) with three
    in_channels: the message names ``out_levels``, and with
    ``out_levels=(1, 2, 3)`` the check passes."""
    cfg = Config.fromfile(
        str(REPO / 'configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py'))
    cfg.model.neck.in_channels = [128] * 3
    with pytest.raises(UserError, match=r'gives 4 maps of 128 channels .*'
                       r'at strides 4, 8, 16, 32 \(a neck built for the '
                       r'strides 8, 16, 32 takes them with '
                       r'model\.backbone\.out_levels=\(1, 2, 3\)\)'):
        _check(cfg)
    cfg.model.backbone.out_levels = (1, 2, 3)
    _check(cfg)
