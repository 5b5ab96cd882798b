"""ONNX export (tools/export_onnx.py, xcit_dense.deploy): verified exports of
a tiny backbone, a tiny UperNet and a tiny Semantic FPN, parity with the
models as mmseg and the fast path run them, and what fails."""
import re
import warnings
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from xcit_dense.deploy import (
    ExportError,
    FeatureGraph,
    SegmentorGraph,
    export_onnx,
    verify_onnx,
)
from xcit_dense.deploy.onnx_export import (
    example_input,
    onnxruntime_session,
    verification_sizes,
)

from conftest import REPO
from tool_runs import load_tool, run_tool_here

TINY = dict(arch=None, patch_size=16, embed_dim=32, depth=4, num_heads=4,
            eta=1.0, out_indices=[0, 1, 2, 3])
# the heads read two of the four levels, so that an export traces fewer
# layers: the UperNet pools to 1 and 2 cells (a fixed-size pooling fails its
# checks), the Semantic FPN up-samples stride 32 twice (so does a size that
# a non-strict export fixes, which its dynamic test catches at 32x32)
UPERNET = f"""
_base_ = r'{REPO}/configs/ade20k/demo_upernet_xcit_nano_synthetic.py'
model = dict(
    backbone=dict({', '.join(f'{k}={v!r}' for k, v in TINY.items())}),
    decode_head=dict(in_channels=[32] * 2, in_index=[2, 3], channels=16,
                     pool_scales=(1, 2)),
    auxiliary_head=dict(in_channels=32, channels=16))
"""
SEM_FPN = f"""
_base_ = r'{REPO}/configs/ade20k/sem_fpn_xcit_t12_p16_80k_ade20k.py'
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    backbone=dict({', '.join(f'{k}={v!r}' for k, v in TINY.items())},
                  init_cfg=None),
    neck=dict(in_channels=[32] * 4, out_channels=16),
    decode_head=dict(in_channels=[16] * 2, in_index=[1, 3],
                     feature_strides=[8, 32], channels=16, num_classes=5,
                     norm_cfg=norm_cfg))
"""


class Holder(nn.Module):
    """What FeatureGraph needs of a detector / segmentor: ``backbone``."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone


def randomise_norms(model):
    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.uniform_(0.5, 2.0, generator=gen)
    return model


def build(config_text, tmp_path, name):
    from mmengine.config import Config

    from xcit_dense.inference import init_model
    path = tmp_path / f'{name}.py'
    path.write_text(config_text)
    cfg = Config.fromfile(str(path))
    torch.manual_seed(0)
    return path, randomise_norms(init_model(cfg, None))


@pytest.fixture(scope='module')
def backbone_onnx(tmp_path_factory):
    """The backbone of a tiny UperNet, exported by ``tools/export_onnx.py
    --backbone-only --dynamic``: the decode head's fixed-size pooling is not
    part of that graph. Its levels are ``out_sizes='ceil'``'s, cropped to
    ceil(H/s) x ceil(W/s) (the default, published layout is in the
    UperNet's export below). The segmentor, the file and the tool's
    output."""
    tmp = tmp_path_factory.mktemp('onnx')
    config, model = build(UPERNET.replace(
        'backbone=dict(', "backbone=dict(out_sizes='ceil', ", 1), tmp,
        'upernet')
    checkpoint = tmp / 'upernet.pth'
    torch.save(dict(state_dict=model.state_dict(), meta={}), checkpoint)
    path = tmp / 'backbone.onnx'
    proc = run_tool_here('tools/export_onnx.py', config, checkpoint, '--out',
                         path, '--shape', 64, 96, '--dynamic',
                         '--backbone-only')
    assert proc.returncode == 0, proc.stderr[-2000:]
    return model, path, proc.stdout


def test_dynamic_backbone_verified_at_three_sizes(backbone_onnx):
    model, path, stdout = backbone_onnx
    assert verification_sizes(64, 96, True) == [(64, 96), (49, 73), (32, 32)]
    for size in ('64x96', '49x73', '32x32'):
        assert f'onnxruntime vs PyTorch at {size}, feat3' in stdout
    rows = verify_onnx(str(path), FeatureGraph(model, with_neck=False), 1,
                       verification_sizes(64, 96, True), log=lambda _: None)
    assert {r['size'] for r in rows} == {(64, 96), (49, 73), (32, 32)}
    assert len(rows) == 3 * 4 and max(r['max_rel_diff'] for r in rows) < 1e-5
    graph = onnx.load(str(path)).graph
    assert [o.name for o in graph.output] == ['feat0', 'feat1', 'feat2',
                                              'feat3']
    assert not list(path.parent.glob('.unverified-*'))
    from xcit_dense.atomic_files import new_file_mode
    assert path.stat().st_mode & 0o777 == new_file_mode() != 0o600


def test_dynamic_backbone_matches_the_fast_path_at_odd_sizes(backbone_onnx):
    """At sizes not checked by the export, the file reproduces the backbone
    as it runs by default (fast path on), with exact ceil(H/s) levels
    (``out_sizes='ceil'``)."""
    model, path, _ = backbone_onnx
    session = onnxruntime_session(str(path))
    for h, w in ((45, 77), (130, 33)):
        x = torch.randn(1, 3, h, w)
        with torch.no_grad():
            refs = model.backbone(x)
        outs = session.run(None, {'input': x.numpy()})
        for s, ref, out in zip((4, 8, 16, 32), refs, outs):
            assert out.shape == (1, 32, -(-h // s), -(-w // s))
            assert np.abs(out - ref.numpy()).max() <= \
                1e-4 * ref.abs().max().item()


def test_wrong_output_order_is_caught(backbone_onnx, tmp_path):
    model, path, _ = backbone_onnx
    proto = onnx.load(str(path))
    outputs = list(proto.graph.output)
    del proto.graph.output[:]
    proto.graph.output.extend(outputs[::-1])
    broken = tmp_path / 'reversed.onnx'
    onnx.save(proto, str(broken))
    with pytest.raises(ExportError, match='output feat3 has shape'):
        verify_onnx(str(broken), FeatureGraph(model, with_neck=False), 1,
                    [(64, 96)], log=lambda _: None)


class FourConvolutions(nn.Module):
    """A pyramid at strides 4 to 32 that exports in about a second: what the
    verification's own failures are tested on."""

    out_strides = (4, 8, 16, 32)

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(
            [nn.Conv2d(3, 8, 4, 4)] + [nn.Conv2d(8, 8, 2, 2) for _ in '123'])

    def forward(self, x):
        feats = []
        for conv in self.convs:
            x = conv(x)
            feats.append(x)
        return tuple(feats)


class ExportsSomethingElse(FeatureGraph):
    """Computes differently while exported: the verification must fail."""

    def forward(self, inputs):
        feats = super().forward(inputs)
        if torch.compiler.is_exporting():
            feats = (feats[0] * 1.01, ) + feats[1:]
        return feats


def test_an_export_that_differs_leaves_no_file(tmp_path):
    torch.manual_seed(0)
    graph = ExportsSomethingElse(Holder(FourConvolutions()), False)
    out = tmp_path / 'differs.onnx'
    with pytest.raises(ExportError, match=r'output feat0 differs .* at most '
                       r'0.0001 of the largest value'):
        export_onnx(graph, str(out), 1, 64, 64, log=lambda _: None)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope='module')
def upernet_cli(tmp_path_factory, tiny_ade20k):
    """The tiny UperNet exported by the CLI with a checkpoint, --dynamic and
    --int8 calibrated on the config's dataset: its config, model,
    checkpoint, fp32 and INT8 files and the tool's output."""
    tmp = tmp_path_factory.mktemp('upernet_cli')
    config, model = build(UPERNET + f"""
data_root = '{tiny_ade20k}/'
test_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
                       dataset=dict(data_root=data_root))
""", tmp, 'upernet')
    checkpoint = tmp / 'upernet.pth'
    torch.save(dict(state_dict=model.state_dict(), meta={}), checkpoint)
    out = tmp / 'upernet.onnx'
    proc = run_tool_here('tools/export_onnx.py', config, checkpoint, '--out',
                         out, '--shape', 64, 96, '--dynamic', '--int8',
                         '--calib', 2)
    assert proc.returncode == 0, proc.stderr
    return SimpleNamespace(config=config, model=model, checkpoint=checkpoint,
                           out=out, int8=tmp / 'upernet.int8.onnx',
                           stdout=proc.stdout)


def test_upernet_export_is_verified_at_three_sizes(upernet_cli):
    """Strict loading of the checkpoint, verification at three sizes (the
    pyramid pooling's cells computed for each)."""
    assert 'verified with onnxruntime at 64x96, 49x73, 32x32' in \
        upernet_cli.stdout


def test_upernet_int8_is_measured_against_the_label_maps(upernet_cli):
    """The INT8 file measured against the fp32 file on the test images after
    the calibration ones, with mIoU against the dataset's label maps,
    before it is written."""
    lines = upernet_cli.stdout.splitlines()
    at = lines.index('INT8 vs fp32 on 2 held-out images of the test dataset '
                     '(items 2 to 3), against its label maps (IoUMetric):')
    miou = [float(re.search(r'  mIoU: (\d+\.\d+)  ', line)[1])
            for line in lines[at + 1:at + 3]]
    assert lines[at + 1].startswith('  fp32  aAcc: ') and \
        lines[at + 2].startswith('  INT8  aAcc: ')
    assert 0 < miou[0] < 100 and abs(miou[0] - miou[1]) < 1  # random labels
    assert lines[at + 3] == (
        f'  lost: mIoU {miou[0] - miou[1]:.2f} points ({miou[0]:.2f} -> '
        f'{miou[1]:.2f}), within --int8-tolerance 1')
    assert lines[at + 4] == f'wrote {upernet_cli.int8}'


def test_upernet_int8_without_label_maps_and_in_the_test_tool(upernet_cli,
                                                              tmp_path):
    """Without label maps the fp32 file's predictions are the reference (it
    scores 100); tools/test.py evaluates the INT8 file."""
    from mmengine.config import Config

    from xcit_dense.deploy import int8_check, quantization
    cfg = Config.fromfile(str(upernet_cli.config))
    cfg.test_pipeline = cfg.test_dataloader.dataset.pipeline = [
        t for t in cfg.test_pipeline if t.type != 'LoadAnnotations']
    measured = int8_check.measure(
        cfg, 'mmseg', quantization.test_dataset(cfg), [2, 3],
        str(upernet_cli.out), str(upernet_cli.int8))
    assert measured['against'] == ("the fp32 file's predictions (its test "
                                   'pipeline loads no label maps)')
    fp32, quantized, _ = int8_check.losses(measured, 'mmseg')['mIoU']
    assert fp32 == 100 and 95 < quantized < 100
    proc = run_tool_here('tools/test.py', upernet_cli.config,
                         upernet_cli.int8, '--work-dir', tmp_path / 'test')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'mIoU' in proc.stdout + proc.stderr


def test_upernet_file_predicts_what_mmseg_predicts(upernet_cli):
    """Labels equal to mmseg's own prediction (data preprocessor, whole
    inference) for images at the export size and an odd one, logits
    within 1e-4."""
    from mmseg.structures import SegDataSample
    session = onnxruntime_session(str(upernet_cli.out))
    for h, w in [(64, 96), (53, 71)]:
        image = torch.randint(0, 256, (3, h, w), dtype=torch.uint8,
                              generator=torch.Generator().manual_seed(5))
        sample = SegDataSample(metainfo=dict(ori_shape=(h, w),
                                             img_shape=(h, w)))
        with torch.no_grad():
            pred = upernet_cli.model.test_step(dict(inputs=[image],
                                                    data_samples=[sample]))
        logits, labels = session.run(
            None, {'input': image[None].float().numpy()})
        assert labels.dtype == np.int64
        assert np.array_equal(labels[0],
                              pred[0].pred_sem_seg.data[0].numpy())
        ref = pred[0].seg_logits.data.numpy()
        assert np.abs(logits[0] - ref).max() <= 1e-4 * np.abs(ref).max()


def test_upernet_file_drawn_as_the_pytorch_model_draws(upernet_cli,
                                                       tmp_path):
    """tools/demo.py draws the exported file without the mm model, on both
    runtimes, as it draws the PyTorch model; a file without labels to draw
    and a checkpoint given with a file are refused in one line."""
    import cv2
    image = tmp_path / 'image.png'
    cv2.imwrite(str(image), np.random.default_rng(2).integers(
        0, 256, (53, 71, 3), dtype=np.uint8))
    out = upernet_cli.out
    drawn = {}
    for name, args in [('torch', (upernet_cli.config, upernet_cli.checkpoint)),
                       ('onnxruntime', (out, )),
                       ('openvino', (out, '--runtime', 'openvino'))]:
        proc = run_tool_here('tools/demo.py', image, *args, '--out',
                             tmp_path / f'{name}.png')
        assert proc.returncode == 0, proc.stderr[-2000:]
        drawn[name] = cv2.imread(str(tmp_path / f'{name}.png'))
    assert 'label map (openvino) drawn to' in proc.stdout
    assert np.array_equal(drawn['onnxruntime'], drawn['torch'])
    assert np.array_equal(drawn['openvino'], drawn['torch'])
    from xcit_dense.deploy import read_metadata
    assert read_metadata(str(out))['xcit_dense.graph'] == 'SegmentorGraph'
    for args, message in [((_feature_graph_file(tmp_path), ),
                           'holds a FeatureGraph: only a whole segmentor'),
                          ((out, upernet_cli.checkpoint),
                           'holds its weights: give no CHECKPOINT')]:
        proc = run_tool_here('tools/demo.py', image, *args, '--out',
                             tmp_path / 'x.png')
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr


def _feature_graph_file(tmp_path):
    """An ONNX file recorded as a --backbone-only export's (FeatureGraph)."""
    from onnx import TensorProto, helper
    path = tmp_path / 'bb.onnx'
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1])
          for n in ('input', 'feat0')]
    file = helper.make_model(helper.make_graph(
        [helper.make_node('Identity', ['input'], ['feat0'])], 'g', io[:1],
        io[1:]))
    helper.set_model_props(file, {'xcit_dense.graph': 'FeatureGraph'})
    onnx.save(file, str(path))
    return path


@pytest.mark.parametrize('cells', [1, 2, 3, 6, (2, 5)])
@pytest.mark.parametrize('size', [(6, 6), (7, 11), (13, 5), (33, 40)])
def test_adaptive_pooling_for_any_size_has_pytorchs_bins(cells, size):
    from xcit_dense.deploy.adaptive_pooling import (
        AnySizePooling,
        adaptive_avg_pool2d_any_size,
    )
    x = torch.randn(2, 3, *size)
    ref = F.adaptive_avg_pool2d(x, cells)
    with AnySizePooling():  # what a non-strict export traces
        replaced = nn.AdaptiveAvgPool2d(cells)(x)
    cells = cells if isinstance(cells, tuple) else (cells, cells)
    torch.testing.assert_close(adaptive_avg_pool2d_any_size(x, cells), ref,
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(replaced, ref, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope='module')
def sem_fpn(tmp_path_factory):
    """The tiny Semantic FPN, random weights: exported by the next two
    tests, with free and with fixed height and width."""
    return build(SEM_FPN, tmp_path_factory.mktemp('sem_fpn'), 'sem_fpn')[1]


def test_semantic_fpn_dynamic_verified_at_three_sizes(sem_fpn, tmp_path):
    """mmseg's Upsample computes its size as int(h * scale_factor): traced
    by dynamo, it stays symbolic, and the file holds at every size."""
    model = sem_fpn
    out = tmp_path / 'dynamic.onnx'
    rows = export_onnx(SegmentorGraph(model), str(out), 1, 64, 64,
                       dynamic=True, log=lambda _: None)
    assert {r['size'] for r in rows} == {(64, 64), (49, 49), (32, 32)}
    assert all(r.get('max_rel_diff', 0) < 1e-4 for r in rows)


def test_semantic_fpn_fixed_size(sem_fpn, tmp_path):
    """Without --dynamic: verified at its size, labels of mmseg."""
    model = sem_fpn
    out = tmp_path / 'sem_fpn.onnx'
    rows = export_onnx(SegmentorGraph(model), str(out), 1, 57, 83,
                       log=lambda _: None)
    assert [(r['size'], r['output']) for r in rows] == [
        ((57, 83), 'seg_logits'), ((57, 83), 'seg_labels')]
    image = example_input(SegmentorGraph(model), 1, 57, 83, seed=9)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        data = model.data_preprocessor(dict(inputs=[image[0].byte()]))
        metas = [dict(img_shape=(57, 83), ori_shape=(57, 83))]
        ref = model.inference(data['inputs'], metas).argmax(1)
    _, labels = onnxruntime_session(str(out)).run(
        None, {'input': image.numpy()})
    assert np.array_equal(labels, ref.numpy())
    # what tools/test.py and tools/demo.py meet: an image of another size
    # (on either runtime), the config of another task, no ONNX file at all:
    # one paragraph each, not the runtime's or protobuf's traceback
    from mmseg.structures import SegDataSample

    from xcit_dense.deploy import load_exported
    from xcit_dense.deploy.runtime_model import RuntimeModel
    from xcit_dense.errors import UserError
    for runtime in ('onnxruntime', 'openvino'):
        with pytest.raises(UserError, match=re.escape(
                f'{out} was exported for 57x83 images, and the test '
                'pipeline gives this one (an image) at 64x64: export it '
                'with --dynamic')):
            load_exported(str(out), runtime).infer(torch.zeros(3, 64, 64),
                                                   SegDataSample())
    with pytest.raises(UserError, match=re.escape(
            'holds a SegmentorGraph (an mmseg model), and the config is an '
            'mmdet one')):
        RuntimeModel(file=str(out), scope='mmdet')
    not_onnx = tmp_path / 'image.onnx'
    not_onnx.write_bytes(b'\x89PNG\r\n\x1a\n' + bytes(range(256)))
    with pytest.raises(UserError, match='cannot be read as an ONNX file'):
        load_exported(str(not_onnx))


class FixesTheSize(FeatureGraph):
    """Computes with the input size as a Python number."""

    def forward(self, inputs):
        feats = super().forward(inputs)
        h = int(inputs.shape[-2] * 1.5) / 1.5
        return (feats[0] * (h / 64), ) + feats[1:]


def test_dynamic_export_that_fixes_a_size_is_caught(tmp_path):
    torch.manual_seed(0)
    graph = FixesTheSize(Holder(FourConvolutions()), False)
    with pytest.raises(ExportError, match=r'at 49x73 its output feat0 '
                       r'differs.*It matched at 64x96'):
        export_onnx(graph, str(tmp_path / 'fixed.onnx'), 1, 64, 96,
                    dynamic=True, log=lambda _: None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('args, message', [
    (('configs/coco/nope.py', '--out', 'x.onnx'), 'Config file not found'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', 'missing.pth',
      '--out', 'x.onnx'), 'The checkpoint does not exist: missing.pth'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', '--out',
      'x.pt'), '--out must name an .onnx file'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--shape', '16', '64'), '--shape must be at least 32 32'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--batch', '2'), 'A whole detector is exported for one '
     'image at a time'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--int8', '--backbone-only'), '--int8 quantizes a whole '
     'segmentor or detector'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--int8', '--calib', '0'), '--calib must be at least 1'),
    (('configs/ade20k/demo_upernet_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--backbone-and-neck'), '--backbone-and-neck is for mmdet '
     'configs'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', '--out',
      'README.md/x.onnx'), 'README.md is a file, not a folder'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--opset', '17'), "--opset 17: PyTorch's ONNX exporter "
     'writes opset 18 or later'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--calib', '4'), '--calib is the number of calibration '
     'images of --int8'),
    (('configs/ade20k/demo_upernet_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--int8-keep-float', 'decode_head'), '--int8-keep-float is '
     'an option of --int8'),
    (('configs/ade20k/demo_upernet_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--int8', '--int8-tolerance', '-1'), '--int8-tolerance must '
     'be at least 0, got -1.0'),
    (('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', '--out',
      'x.onnx', '--cfg-options', 'model.test_cfg.rcnn.nms.type=soft_nms'),
     'this model differs: test_cfg.rcnn.nms is soft_nms. Export its '
     'backbone and neck with --backbone-and-neck'),
])
def test_bad_input_is_one_paragraph(args, message):
    proc = run_tool_here('tools/export_onnx.py', *args)
    err = proc.stderr
    assert proc.returncode == 1
    assert err.startswith('error: ') and message in err
    assert 'Traceback' not in err and err.count('\n') == 1


@pytest.mark.parametrize('config, options, whole, shape', [
    # the demo's test images are 128x128: a fixed export takes them
    ('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', {}, True,
     (128, 128)),
    # COCO's Resize (1333, 800) with keep_ratio: the graph pads to 32 itself
    ('configs/coco/mask_rcnn_xcit_s12.py', {}, True, (800, 1333)),
    # without keep_ratio the scale is (W, H)
    ('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py',
     {'test_pipeline.1.keep_ratio': False, 'test_pipeline.1.scale':
      (160, 96)}, True, (96, 160)),
    # the backbone (and neck) take the padded, normalised input
    ('configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py', {}, False,
     (800, 1344)),
    ('configs/ade20k/demo_upernet_xcit_nano_synthetic.py', {}, False,
     (128, 128)),
])
def test_default_export_size_is_what_the_test_pipeline_gives(
        config, options, whole, shape):
    from xcit_dense.cli import load_config
    cfg = load_config(str(REPO / config), options)
    scope = cfg.default_scope
    tool = load_tool('export_onnx')
    assert tool.default_shape(cfg, scope, whole)[0] == shape
