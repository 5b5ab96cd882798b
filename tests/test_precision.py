"""AutocastPartsHook (xcit_dense/precision.py): the named parts of a model
run in bf16 in validation and testing, everything between them and their
outputs in fp32; training untouched; tools/test.py with the hook in a
config. Float32PartsHook: the named parts in fp32 under autocast for the
whole run. On a CPU without native bf16 the bf16 a config asks for runs in
fp32 (said once), and the benchmark refuses its bf16 rows there."""
import logging
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from xcit_dense import (
    AutocastPartsHook,
    Float32PartsHook,
    UserError,
    XCiT,
    precision,
)
from xcit_dense.precision import cpu_has_native_bf16 as probe_of_the_cpu

from conftest import logged
from test_export_detector import detector_checkpoint
from tool_runs import run_tool_here

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
    """tools/test.py with the hook in a config: the parts named run in bf16
    and the detections are the fp32 run's within bf16's rounding. The
    detector's classifiers are sharpened (tests/test_export_detector.py:
    confident detections) and its mask logits lifted (an untrained mask
    head's are near 0 everywhere, where bf16's rounding flips pixels); the
    fp32 run's detections scoring at least 0.5 are the objects the hooked
    run is scored against (fp32's own COCO mAP against them: 1.0): bbox and
    segm mAP at least 0.5 (measured 0.70; the near-tied, overlapping
    detections of a random detector move 1 to 2 px in bf16), scores and
    boxes in fp32, and not fp32's to the bit (the parts ran in bf16)."""
    import pickle
    config, checkpoint, model = detector_checkpoint(tmp_path, tiny_coco)
    with torch.no_grad():
        model.roi_head.mask_head.conv_logits.bias.fill_(5)
    torch.save(dict(state_dict=model.state_dict(), meta={}), checkpoint)
    hooked = tmp_path / 'bf16.py'
    hooked.write_text(f"_base_ = './{config.name}'\n"
                      "custom_hooks = [dict(type='xcit_dense."
                      "AutocastPartsHook', dtype='bfloat16')]\n")
    predictions = {}
    for name, run_config, options in [
            ('fp32', config, []),
            ('bf16', hooked, ['--cfg-options',
                              f'test_evaluator.ann_file={tmp_path}/'
                              'fp32_objects.json'])]:
        proc = run_tool_here('tools/test.py', run_config, checkpoint,
                             '--work-dir', tmp_path / name, '--out',
                             tmp_path / f'{name}.pkl', *options)
        assert proc.returncode == 0, proc.stderr[-2000:]
        with open(tmp_path / f'{name}.pkl', 'rb') as f:
            predictions[name] = pickle.load(f)
        if name == 'fp32':
            objects = confident_objects(
                predictions['fp32'], f'{tiny_coco}/annotations/val.json',
                tmp_path / 'fp32_objects.json')
            assert objects >= 4  # on the 4 test images
    out = proc.stdout + proc.stderr
    assert ('backbone, neck, rpn_head, roi_head.bbox_head, '
            'roi_head.mask_head run in bfloat16') in out
    scores = dict(re.findall(r'coco/(bbox|segm)_mAP: ([\d.]+)', out))
    assert scores.keys() == {'bbox', 'segm'}, out[-2000:]
    assert all(float(v) >= 0.5 for v in scores.values()), scores
    got = [p['pred_instances'] for p in predictions['bf16']]
    ref = [p['pred_instances'] for p in predictions['fp32']]
    assert all(p['scores'].dtype == p['bboxes'].dtype == torch.float32
               for p in got)
    assert not all(torch.equal(a['scores'], b['scores'])
                   for a, b in zip(got, ref))


def confident_objects(predictions, ann_file, path):
    """A COCO annotation file with ``ann_file``'s images and categories and,
    as its objects, the detections of ``predictions`` (tools/test.py --out)
    scoring at least 0.5; returns how many."""
    import json
    with open(ann_file) as f:
        coco = json.load(f)
    categories = sorted(c['id'] for c in coco['categories'])
    coco['annotations'] = []
    for image in predictions:
        pred = image['pred_instances']
        for box, score, label, mask in zip(pred['bboxes'].tolist(),
                                           pred['scores'].tolist(),
                                           pred['labels'].tolist(),
                                           pred['masks']):
            if score < 0.5:
                continue
            x0, y0, x1, y1 = box
            coco['annotations'].append(dict(
                id=len(coco['annotations']) + 1, image_id=image['img_id'],
                category_id=categories[label], iscrowd=0,
                bbox=[x0, y0, x1 - x0, y1 - y0], area=(x1 - x0) * (y1 - y0),
                segmentation=dict(size=mask['size'],
                                  counts=mask['counts'].decode())))
    with open(path, 'w') as f:
        json.dump(coco, f)
    return len(coco['annotations'])


@pytest.fixture
def emulated_bf16(monkeypatch):
    """A CPU without native bf16, whose requests have not spoken yet."""
    monkeypatch.setattr(precision, 'cpu_has_native_bf16', lambda: False)
    monkeypatch.setattr(precision, '_SAID', set())


def test_the_probe_reads_pytorchs_cpu_features(monkeypatch):
    """Native bf16: x86's AVX-512 BF16 or AMX-BF16, Arm's BF16; AVX2 and
    AVX-512 alone are not; an older PyTorch's private probes; unknown:
    bf16 as asked."""
    def native(features):
        monkeypatch.setattr(precision, '_cpu_features', lambda: features)
        return probe_of_the_cpu.__wrapped__()  # past the memo
    avx512 = dict(architecture='x86_64', avx2=True, avx512_f=True,
                  avx512_bf16=False, amx_bf16=False)
    assert not native(avx512)
    assert not native(dict(architecture='x86_64', avx2=True))
    assert native(dict(avx512, avx512_bf16=True))
    assert native(dict(avx512, amx_bf16=True))
    assert native(dict(architecture='arm64', neon=True, bf16=True))
    assert native(None)
    monkeypatch.undo()
    assert isinstance(probe_of_the_cpu(), bool)
    monkeypatch.delattr(torch.cpu, 'get_capabilities')
    monkeypatch.setattr(torch.cpu, '_is_avx512_bf16_supported',
                        lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, '_is_amx_tile_supported', lambda: True,
                        raising=False)
    assert precision._cpu_features() == dict(avx512_bf16=False,
                                             amx_bf16=True)


def test_backbone_bf16_runs_fp32_without_native_bf16(monkeypatch):
    """``autocast_dtype='bfloat16'`` on a CPU without native bf16: one
    warning, whatever the calls and models, and fp32's outputs exactly; on
    one with it, bf16 as before; fp16 and CUDA as asked."""
    torch.manual_seed(0)
    model = XCiT('nano_12_p16', depth=4, out_indices=(0, 1, 2, 3)).eval()
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        fp32 = model(x)
        model.autocast_dtype = 'bfloat16'
        native = model(x)
        monkeypatch.setattr(precision, 'cpu_has_native_bf16', lambda: False)
        monkeypatch.setattr(precision, '_SAID', set())
        with logged(level=logging.WARNING) as warnings:
            emulated = [model(x), model(x)]
    assert all(o.dtype == torch.float32 for o in native)
    assert not all(torch.equal(a, b) for a, b in zip(native, fp32))
    for outs in emulated:
        assert all(torch.equal(a, b) for a, b in zip(outs, fp32))
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("XCiT(autocast_dtype='bfloat16'): ")
    assert 'has no native bf16' in warnings[0]
    assert 'running the backbone in float32 here' in warnings[0]
    assert precision.autocast_fits('cuda', torch.bfloat16, 'x', 'it')
    assert precision.autocast_fits('cpu', torch.float16, 'x', 'it')
    assert precision._SAID == {"XCiT(autocast_dtype='bfloat16')"}


def test_hook_runs_parts_fp32_without_native_bf16(emulated_bf16):
    """AutocastPartsHook on a CPU without native bf16: the parts run as
    written, in fp32 (the outputs of the model without the hook), said once
    for every validation and test; its parts are still checked."""
    model = Toy()
    inner = []
    model.net[1].register_forward_hook(
        lambda mod, args, out: inner.append(out.dtype))
    runner = SimpleNamespace(model=model, logger=SimpleNamespace(
        info=inner.append))
    hook = AutocastPartsHook(parts=['net', 'head'])
    x = torch.randn(3, 4)
    expected = model(x)
    inner.clear()
    with logged(level=logging.WARNING) as warnings:
        for _ in range(2):
            hook.before_val(runner)
            assert torch.equal(model(x), expected)
            hook.after_val(runner)
    assert inner == [torch.float32] * 2  # no log of parts in bfloat16
    assert len(warnings) == 1 and warnings[0].startswith(
        'AutocastPartsHook: ') and 'running net, head in float32' in \
        warnings[0]
    with pytest.raises(UserError, match='the model has no roi_head'):
        AutocastPartsHook(parts=['net', 'roi_head']).before_test(runner)


def test_benchmark_refuses_bf16_rows_without_native_bf16(
        tmp_path, monkeypatch, capsys):
    """``@bf16`` rows, and ``@amp`` rows on the CPU (bf16 autocast there),
    are refused in one paragraph before anything is measured, and the
    reference matmul is fp32 alone; with native bf16, or on CUDA, as
    before."""
    from benchmarks.harness.matmul import matmul_rates, matmul_summary
    from benchmarks.harness.names import refuse_emulated_bf16
    rows = ['xcit_nano_12_p16', 'xcit_nano_12_p16@bf16',
            'xcit_nano_12_p16@cp+amp', 'mask_rcnn_xcit_s12@bf16']
    assert refuse_emulated_bf16(rows, 'cpu') is None
    both = matmul_rates('cpu', 32, 1, 1)
    assert both['fp32_gflops_per_s'] > 0 and both['bf16_gflops_per_s'] > 0
    monkeypatch.setattr(precision, 'cpu_has_native_bf16', lambda: False)
    assert refuse_emulated_bf16(rows, 'cuda') is None
    refusal = refuse_emulated_bf16(rows, 'cpu')
    assert refusal.startswith(
        'xcit_nano_12_p16@bf16, xcit_nano_12_p16@cp+amp, '
        'mask_rcnn_xcit_s12@bf16: bf16 on the CPU')
    assert '--device cuda' in refusal and '\n' not in refusal
    fp32 = matmul_rates('cpu', 32, 1, 1)
    assert fp32['fp32_gflops_per_s'] > 0 and \
        fp32['bf16_gflops_per_s'] is None
    assert matmul_summary(fp32).endswith(
        'bf16 not measured (no native bf16 on this CPU)')
    proc = run_tool_here(  # settings that measure quickly if not refused
        'tools/benchmark.py', '--models', *rows[:2], '--sizes', '32x32',
        '--batch', '1', '--modes', 'infer', '--repeat', '1', '--threads',
        '1', '--matmul-size', '32', '--out-dir', tmp_path / 'out')
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        'error: xcit_nano_12_p16@bf16: bf16 on the CPU (@bf16, and @amp, '
        'bf16 autocast there), and this CPU has no native bf16 (none of '
        'avx512_bf16, amx_bf16, bf16, sve_bf16 in '
        'torch.cpu.get_capabilities()), where PyTorch emulates bf16 at '
        'several times the time of fp32: the rows would time the '
        'emulation. Measure them on a CPU with native bf16 (AVX-512 BF16, '
        'AMX, Arm BF16) or with --device cuda, or leave them out of '
        '--models.')
    assert not (tmp_path / 'out').exists()  # before the reference matmul
