"""AutocastPartsHook (xcit_dense/precision.py): the named parts of a model
run in bf16 in validation and testing, everything between them and their
outputs in fp32; training untouched; tools/test.py with the hook in a
config. Float32PartsHook: the named parts in fp32 under autocast for the
whole run."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from xcit_dense import AutocastPartsHook, Float32PartsHook, UserError

from conftest import run_tool_here
from test_export_detector import MASK_RCNN

pytestmark = pytest.mark.usefixtures('fast_paths_at_any_size')


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        between = self.net(x) * 2  # computed between the parts
        self.seen = between.dtype
        return self.head(between)


def test_parts_run_in_bf16_and_hand_on_fp32():
    model = Toy()
    inner = []
    model.net[1].register_forward_hook(
        lambda mod, args, out: inner.append(out.dtype))
    runner = SimpleNamespace(model=model, logger=SimpleNamespace(
        info=lambda message: inner.append(message)))
    hook = AutocastPartsHook(parts=['net', 'head'])
    x = torch.randn(3, 4)
    hook.before_test(runner)
    out = model(x)
    assert inner[0].startswith('net, head run in bfloat16')
    assert inner[1] == torch.bfloat16  # inside the part
    assert model.seen == torch.float32 and out.dtype == torch.float32
    assert not torch.is_autocast_enabled('cpu')  # left after each part
    reference = Toy()
    reference.load_state_dict(model.state_dict())
    torch.testing.assert_close(out, reference(x), rtol=0.05, atol=0.05)
    hook.after_test(runner)
    model(x)
    assert inner[-1] == torch.float32  # removed: training runs as written
    with pytest.raises(UserError, match='the model has no roi_head'):
        AutocastPartsHook(parts=['net', 'roi_head']).before_val(runner)
    with pytest.raises(UserError, match="'bfloat16' or 'float16'"):
        AutocastPartsHook(dtype='int8')


def test_float32_parts_under_autocast():
    """Under bf16 autocast the named part computes in fp32 from fp32 inputs
    (the part before it hands on bf16), given positionally or by keyword;
    the rest stays in autocast; removed after the run."""
    model = Toy()
    inner = []
    model.head.register_forward_hook(
        lambda mod, args, kwargs, out: inner.append(
            ([*args, *kwargs.values()][0].dtype, out.dtype)),
        with_kwargs=True)
    runner = SimpleNamespace(model=SimpleNamespace(module=model),  # DDP
                             logger=SimpleNamespace(info=inner.append))
    hook = Float32PartsHook(parts=['head'])
    hook.before_run(runner)
    assert inner == ['head run in float32 (autocast off inside them)']
    x = torch.randn(3, 4)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model(x)
        assert model.seen == torch.bfloat16  # the rest in autocast
        assert torch.is_autocast_enabled('cpu')  # back on after the part
        by_keyword = model.head(input=torch.randn(3, 4).bfloat16())
    assert inner[1:] == [(torch.float32, torch.float32)] * 2
    assert out.dtype == by_keyword.dtype == torch.float32
    hook.after_run(runner)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16  # removed
    with pytest.raises(UserError, match='the model has no pixel_decoder'):
        Float32PartsHook(parts=['pixel_decoder']).before_run(runner)
    with pytest.raises(UserError, match='a list of module names'):
        Float32PartsHook(parts='head')


def test_what_has_no_bf16_kernel_runs_in_fp32_under_bf16():
    """mmcv's RoIAlign has no bf16 kernel (nor on CUDA: mmcv 2.1.0 dispatches
    float, double and half), so under bf16 autocast mmdet's RoI extractor
    stops at it; with the types of ``WITHOUT_BF16_KERNELS`` it runs in fp32
    and gives what fp32 gives for the bf16 features, in training
    (Float32PartsHook) and in inference with parts in bf16
    (AutocastPartsHook)."""
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor

    from xcit_dense.precision import WITHOUT_BF16_KERNELS
    model = nn.Module()
    model.roi = SingleRoIExtractor(
        out_channels=8, featmap_strides=[4, 8],
        roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=2))
    gen = torch.Generator().manual_seed(0)
    feats = [torch.randn(1, 8, 32, 32, generator=gen).bfloat16(),
             torch.randn(1, 8, 16, 16, generator=gen).bfloat16()]
    rois = torch.tensor([[0, 2., 2., 60., 50.], [0, 10., 4., 120., 126.]])
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.raises(NotImplementedError, match='BFloat16'):
            model.roi(feats, rois)
    log = []
    runner = SimpleNamespace(model=model,
                             logger=SimpleNamespace(info=log.append))
    hook = Float32PartsHook(types=WITHOUT_BF16_KERNELS)
    hook.before_run(runner)
    assert log == ['2 RoIAlign run in float32 (autocast off inside them)']
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model.roi(feats, rois)
    expected = model.roi([f.float() for f in feats], rois)
    assert out.dtype == torch.bfloat16  # the extractor's own buffer
    assert torch.equal(out, expected.bfloat16())
    hook.after_run(runner)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.raises(NotImplementedError, match='BFloat16'):
            model.roi(feats, rois)

    # inference with the networks in bf16: a part whose convolution hands
    # RoIAlign bf16 maps
    class Part(nn.Module):
        def __init__(self, extractor):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 1)
            self.roi = extractor

        def forward(self, feats, rois):
            return self.roi([self.conv(f) for f in feats], rois)
    model.part = Part(model.roi)
    floats = [f.float() for f in feats]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.raises(NotImplementedError, match='BFloat16'):
            model.part(floats, rois)
    log.clear()
    hook = AutocastPartsHook(parts=['part'])
    hook.before_test(runner)
    assert log[1] == '2 RoIAlign run in float32 (autocast off inside them)'
    assert model.part(floats, rois).dtype == torch.float32
    hook.after_test(runner)


def test_bf16_amp_configs_get_the_hook(capsys):
    """``tools/train.py`` with a bf16 ``AmpOptimWrapper`` adds
    ``Float32PartsHook(types=WITHOUT_BF16_KERNELS)`` and says so; fp16 and
    fp32 configs, and those with such a hook of their own, are left."""
    from mmengine.config import Config

    from xcit_dense.precision import WITHOUT_BF16_KERNELS
    from xcit_dense.runner import keep_fp32_without_bf16_kernels

    def hooks(wrapper, custom_hooks=None):
        cfg = Config(dict(optim_wrapper=wrapper, custom_hooks=custom_hooks))
        keep_fp32_without_bf16_kernels(cfg)
        return [h for h in cfg.get('custom_hooks') or []
                if h['type'] == 'xcit_dense.Float32PartsHook']
    added = dict(type='xcit_dense.Float32PartsHook',
                 types=list(WITHOUT_BF16_KERNELS))
    capsys.readouterr()
    assert hooks(dict(type='AmpOptimWrapper', dtype='bfloat16')) == [added]
    assert capsys.readouterr().out.startswith(
        "bf16 AMP: mmcv's RoIAlign, deformable attention and deformable "
        'convolutions, which have no bf16 kernels, run in fp32')
    assert hooks(dict(type='mmengine.AmpOptimWrapper',
                      dtype=torch.bfloat16)) == [added]
    capsys.readouterr()
    assert hooks(dict(type='AmpOptimWrapper')) == []  # fp16
    assert capsys.readouterr().out == ''
    assert hooks(dict(type='OptimWrapper', dtype='bfloat16')) == []
    own = dict(type='xcit_dense.Float32PartsHook', types=['RoIAlign'])
    assert hooks(dict(type='AmpOptimWrapper', dtype='bfloat16'),
                 [own]) == [own]
    with pytest.raises(UserError, match='one of them not empty'):
        Float32PartsHook()


def test_test_tool_with_the_hook(tmp_path, tiny_coco):
    config = tmp_path / 'bf16.py'
    config.write_text(MASK_RCNN + f"""
data_root = '{tiny_coco}/'
test_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                       dataset=dict(data_root=data_root))
test_evaluator = dict(ann_file=data_root + 'annotations/val.json')
custom_hooks = [dict(type='xcit_dense.AutocastPartsHook', dtype='bfloat16')]
""")
    from mmengine.config import Config

    from xcit_dense.inference import init_model
    torch.manual_seed(0)
    model = init_model(Config.fromfile(str(config)), None)
    checkpoint = tmp_path / 'model.pth'
    torch.save(dict(state_dict=model.state_dict(), meta={}), checkpoint)
    proc = run_tool_here('tools/test.py', config, checkpoint, '--work-dir',
                         tmp_path / 'work')
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert ('backbone, neck, rpn_head, roi_head.bbox_head, '
            'roi_head.mask_head run in bfloat16') in out
    assert 'coco/segm_mAP' in out
