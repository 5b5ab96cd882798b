"""ADE20K: every config builds and runs (XCiT-S12's and the demo's train a
step and infer a whole image of an awkward size, the other sizes run the
backbone forward); the demo trains and evaluates; tools/test.py writes
predictions; bad data fails with the file's name."""
import re

import cv2
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from conftest import REPO
from shrink import (
    narrowed_mask2former,
    runs_forward,
    shrunk,
    trained_in_tests,
)
from tool_runs import run_tool_here

CONFIGS = sorted((REPO / 'configs' / 'ade20k').glob('*.py'))
DEMO = REPO / 'configs' / 'ade20k' / 'demo_upernet_xcit_nano_synthetic.py'


def test_configs_found():
    names = {p.name for p in CONFIGS}
    assert {'upernet_xcit_s12.py', 'upernet_xcit_s12_ms_flip.py'} <= names
    for short in ('t12', 's12', 's24', 'm24'):
        for patch in (16, 8):
            assert f'upernet_xcit_{short}_p{patch}_160k_ade20k.py' in names
            assert f'sem_fpn_xcit_{short}_p{patch}_80k_ade20k.py' in names
            assert f'mask2former_xcit_{short}_p{patch}_160k_ade20k.py' \
                in names


def _sample(h, w, num_classes):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    sample = SegDataSample(metainfo=dict(
        img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w)))
    label = torch.randint(0, num_classes, (1, h, w))
    label[:, :5] = 255
    sample.gt_sem_seg = PixelData(data=label)
    return sample


def narrowed(model_cfg, width=64):
    """``model_cfg`` with UperNet's, the FPN neck's and head's and
    Mask2Former's channels at ``width`` (512, 384 and 256 in the recipes:
    four fifths of a UperNet training step's time; what is checked does not
    depend on them); the heads' input channels as the recipe sets them
    where they read the backbone."""
    head = model_cfg.decode_head
    if 'neck' in model_cfg:  # Semantic FPN: the head reads the neck
        model_cfg.neck.out_channels = width
        head.in_channels = [width] * len(head.in_channels)
    if head.type.split('.')[-1] in ('UPerHead', 'FPNHead'):
        head.channels = width
    elif 'pixel_decoder' in head:  # Mask2Former
        narrowed_mask2former(head, width)
    if model_cfg.get('auxiliary_head'):
        model_cfg.auxiliary_head.channels = width
    return model_cfg


#: the segmentors built and run here, by config: a recipe, its short name
#: and its test-time-augmentation variant share one, run once
_RUN = set()


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: p.name)
def test_config_builds_and_runs(path):
    from mmseg.registry import MODELS
    cfg = Config.fromfile(str(path))
    assert cfg.default_scope == 'mmseg'
    inner = cfg.model.module if 'module' in cfg.model else cfg.model
    assert inner.backbone.type == 'xcit_dense.XCiT'
    from xcit_dense import ARCH_SETTINGS
    dim = ARCH_SETTINGS[inner.backbone.arch]['embed_dim']
    head_in = inner.get('neck', inner.decode_head).in_channels
    assert head_in == [dim] * 4
    # --auto-scale-lr works: the batch the recipe's lr was set for
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=16)
    run = (trained_in_tests(path.name), repr(inner))
    if run in _RUN:
        return
    _RUN.add(run)
    init_default_scope('mmseg')
    model = MODELS.build(narrowed(shrunk(inner)))
    model.init_weights()
    if not trained_in_tests(path.name):
        assert len(runs_forward(model)) == 4
        return
    num_classes = model.decode_head.num_classes
    # training step on crops
    data = dict(inputs=[torch.randint(0, 255, (3, 64, 96), dtype=torch.uint8)
                        for _ in range(2)],
                data_samples=[_sample(64, 96, num_classes) for _ in range(2)])
    model.train()
    batch = model.data_preprocessor(data, training=True)
    loss, _ = model.parse_losses(model(**batch, mode='loss'))
    assert torch.isfinite(loss)
    loss.backward()
    # whole-image inference, non-square, not a multiple of 32
    h, w = 75, 117
    model.eval()
    test = dict(inputs=[torch.randint(0, 255, (3, h, w), dtype=torch.uint8)],
                data_samples=[_sample(h, w, num_classes)])
    assert model.test_cfg.mode == 'whole'
    with torch.no_grad():
        out = model.test_step(test)
    assert out[0].pred_sem_seg.data.shape == (1, h, w)
    assert out[0].seg_logits.data.shape == (num_classes, h, w)


def _config(tmp_path, data_root, max_iters=4):
    """The UperNet demo on the data at ``data_root``: 4 backbone blocks,
    the heads 32 wide (128 and 64 in the demo)."""
    path = tmp_path / 'demo_tiny.py'
    path.write_text(f"""
_base_ = '{DEMO}'
model = dict(backbone=dict(depth=4, out_indices=(0, 1, 2, 3)),
             decode_head=dict(channels=32), auxiliary_head=dict(channels=32))
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root='{data_root}'))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root='{data_root}'))
test_dataloader = val_dataloader
train_cfg = dict(max_iters={max_iters}, val_interval={max_iters})
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False,
                        begin=0, end=2)]
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval={max_iters}))
""")
    return path


def test_demo_trains_evaluates_and_tests(tiny_ade20k, tmp_path, windows):
    cfg = _config(tmp_path, tiny_ade20k, max_iters=2)
    work = tmp_path / 'work'
    # --auto-scale-lr as mmdet's tools take it: the recipe's 16 images, 2 here
    proc = run_tool_here('tools/train.py', cfg, '--work-dir', work,
                         '--auto-scale-lr')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert 'LR is set based on batch size of 16 and the current batch size ' \
        'is 2. Scaling the original LR by 0.125.' in out
    assert re.search(r'Iter\(train\) \[2/2\].*loss: [\d.]+', out)
    for metric in ('aAcc', 'mIoU', 'mAcc'):
        assert re.search(rf'{metric}: [\d.]+', out), metric
    # tools/test.py writes label maps (--out) and drawings (--show-dir),
    # with only the test data there: the drawings need no training set
    # (mmseg's hook reads runner.iter, which built the training loop and
    # its data)
    import shutil
    test_only = tmp_path / 'test_only'
    for part in ('images', 'annotations'):
        shutil.copytree(tiny_ade20k / part / 'validation',
                        test_only / part / 'validation')
    test_only_cfg = _config(test_only, test_only, max_iters=2)
    preds, show = tmp_path / 'preds', 'shown'
    proc = run_tool_here('tools/test.py', test_only_cfg, work / 'iter_2.pth',
                         '--work-dir', tmp_path / 'test', '--out', preds,
                         '--show-dir', show)
    assert proc.returncode == 0, proc.stderr[-3000:]
    maps = sorted(preds.glob('*.png'))
    assert len(maps) == 4
    label = cv2.imread(str(maps[0]), cv2.IMREAD_UNCHANGED)
    # written in the annotation format: classes 1..5 (reduce_zero_label undone)
    assert label.shape == (128, 128)
    assert 1 <= label.min() and label.max() <= 5
    assert len(list((tmp_path / 'test' / show).rglob('*.png'))) == 4
    # --show: a window per image (a stand-in for a display here), as in
    # mmseg's tools/test.py; with --show-dir too, one paragraph: mmseg's
    # hook saves nothing while it shows
    proc = run_tool_here('tools/test.py', cfg, work / 'iter_2.pth',
                         '--work-dir', tmp_path / 'show', '--show',
                         '--wait-time', '0.01')
    assert proc.returncode == 0, proc.stderr[-3000:]
    images = sorted((tiny_ade20k / 'images' / 'validation').iterdir())
    # mmseg's window titles: the phase and the image's name
    assert sorted(windows) == [f'test_{p.name}' for p in images]
    proc = run_tool_here('tools/test.py', cfg, work / 'iter_2.pth',
                         '--work-dir', tmp_path / 'both', '--show',
                         '--show-dir', show)
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert 'Give --show or --show-dir for segmentation, not both' in \
        proc.stderr.splitlines()[-1]
    assert not (tmp_path / 'both').exists()
    # --out is a folder of label maps: a file there is one paragraph
    proc = run_tool_here('tools/test.py', cfg, work / 'iter_2.pth',
                         '--work-dir', tmp_path / 'out_file', '--out',
                         maps[0])
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert 'is a file; --out names the folder to write.' in \
        proc.stderr.splitlines()[-1]
    assert not (tmp_path / 'out_file').exists()



def test_label_beyond_classes_names_file(tiny_ade20k, tmp_path):
    import shutil
    root = tmp_path / 'data'
    shutil.copytree(tiny_ade20k, root)
    bad = sorted((root / 'annotations' / 'training').glob('*.png'))[1]
    label = cv2.imread(str(bad), cv2.IMREAD_UNCHANGED)
    label[10:20, 10:20] = 9
    cv2.imwrite(str(bad), label)
    proc = run_tool_here('tools/train.py', _config(tmp_path, root),
                         '--work-dir', tmp_path / 'work')
    assert proc.returncode == 1
    assert 'Traceback' not in proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert bad.name in message and 'label values [9]' in message, message
    assert 'allowed: 0 (ignore) and 1..5' in message


def test_missing_split_directory_names_it(tiny_ade20k, tmp_path):
    import shutil
    root = tmp_path / 'data'
    shutil.copytree(tiny_ade20k, root)
    shutil.rmtree(root / 'annotations' / 'validation')
    proc = run_tool_here('tools/train.py', _config(tmp_path, root),
                         '--work-dir', tmp_path / 'work')
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert re.search(r'seg_map_path directory .* does not exist: .*'
                     r'annotations/validation', message), message
    assert not (tmp_path / 'work').exists()
