"""Published XCiT detectors and segmentors (mmdet 2.11 / mmseg 0.11 layout):
tools/test.py, tools/demo.py, load_from and the converter take them, also from
an http(s) URL (a loopback server here), and give the same predictions as the
same weights in our layout; bad files fail with a paragraph naming the keys.

The published files are synthesised with random weights under the key names
of the published code, enumerated below from facebookresearch/xcit
``detection/backbone/xcit.py`` and the heads of mmdet 2.11 / mmseg 0.11
(nothing is downloaded).
"""
import functools
import http.server
import pickle
import re
import threading

import cv2
import numpy as np
import pytest
import torch

from conftest import REPO
from shrink import NARROW_MASK_RCNN
from tool_runs import run_tool_here

COCO_DEMO = REPO / 'configs' / 'coco' / 'demo_mask_rcnn_xcit_nano_synthetic.py'
ADE_DEMO = REPO / 'configs' / 'ade20k' / 'demo_upernet_xcit_nano_synthetic.py'
BN = ('weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked')


# ------------------------------------------------- the published key names
def published_backbone_keys(depth, patch_size):
    """``backbone.*`` keys of the published detection / segmentation XCiT
    (``detection/backbone/xcit.py``): ConvPatchEmbed, XCABlocks, the Fourier
    encoder as ``pos_embeder``, fpn1..fpn4; no class token, class attention,
    final norm or head."""
    keys = []
    for i in range(4 if patch_size == 16 else 3):  # conv3x3 + BN, GELUs
        keys += [f'patch_embed.proj.{2 * i}.0.weight']
        keys += [f'patch_embed.proj.{2 * i}.1.{k}' for k in BN]
    for b in range(depth):
        p = f'blocks.{b}.'
        keys += [p + g for g in ('gamma1', 'gamma2', 'gamma3')]
        for norm in ('norm1', 'norm2', 'norm3'):
            keys += [f'{p}{norm}.weight', f'{p}{norm}.bias']
        keys += [p + 'attn.temperature']
        for layer in ('attn.qkv', 'attn.proj', 'mlp.fc1', 'mlp.fc2',
                      'local_mp.conv1', 'local_mp.conv2'):
            keys += [f'{p}{layer}.weight', f'{p}{layer}.bias']
        keys += [f'{p}local_mp.bn.{k}' for k in BN]
    keys += ['pos_embeder.token_projection.weight',
             'pos_embeder.token_projection.bias']
    if patch_size == 16:  # fpn1: deconv, BN, GELU, deconv; fpn2: deconv
        keys += ['fpn1.0.weight', 'fpn1.0.bias', 'fpn1.3.weight',
                 'fpn1.3.bias', 'fpn2.0.weight', 'fpn2.0.bias']
        keys += [f'fpn1.1.{k}' for k in BN]
    else:
        keys += ['fpn1.0.weight', 'fpn1.0.bias']
    return ['backbone.' + k for k in keys]


def _conv(prefix, bias=True, norm=False):
    """mmcv ConvModule keys."""
    keys = [f'{prefix}.conv.weight'] + ([f'{prefix}.conv.bias'] if bias
                                         else [])
    return keys + ([f'{prefix}.bn.{k}' for k in BN] if norm else [])


def published_mask_rcnn_keys(depth, patch_size):
    """mmdet 2.11 Mask R-CNN: FPN (4 inputs), RPNHead, StandardRoIHead with
    Shared2FCBBoxHead and FCNMaskHead (4 convs)."""
    keys = published_backbone_keys(depth, patch_size)
    for i in range(4):
        keys += _conv(f'neck.lateral_convs.{i}') + _conv(
            f'neck.fpn_convs.{i}')
    for layer in ('rpn_conv', 'rpn_cls', 'rpn_reg'):
        keys += [f'rpn_head.{layer}.weight', f'rpn_head.{layer}.bias']
    for layer in ('shared_fcs.0', 'shared_fcs.1', 'fc_cls', 'fc_reg'):
        keys += [f'roi_head.bbox_head.{layer}.weight',
                 f'roi_head.bbox_head.{layer}.bias']
    for i in range(4):
        keys += _conv(f'roi_head.mask_head.convs.{i}')
    for layer in ('upsample', 'conv_logits'):
        keys += [f'roi_head.mask_head.{layer}.weight',
                 f'roi_head.mask_head.{layer}.bias']
    return keys


def published_upernet_keys(depth, patch_size):
    """mmseg 0.11 UPerHead (pool scales 1, 2, 3, 6) with an FCNHead (one
    conv) as auxiliary head; ConvModules with BN have no conv bias."""
    keys = published_backbone_keys(depth, patch_size)
    head = 'decode_head'
    for i in range(4):
        keys += _conv(f'{head}.psp_modules.{i}.1', bias=False, norm=True)
    keys += _conv(f'{head}.bottleneck', bias=False, norm=True)
    for i in range(3):
        keys += _conv(f'{head}.lateral_convs.{i}', bias=False, norm=True)
        keys += _conv(f'{head}.fpn_convs.{i}', bias=False, norm=True)
    keys += _conv(f'{head}.fpn_bottleneck', bias=False, norm=True)
    keys += [f'{head}.conv_seg.weight', f'{head}.conv_seg.bias']
    keys += _conv('auxiliary_head.convs.0', bias=False, norm=True)
    keys += ['auxiliary_head.conv_seg.weight', 'auxiliary_head.conv_seg.bias']
    return keys


# ------------------------------------------------------------- fixtures
def _tiny_config(tmp_path, demo, data_root, extra=''):
    """``demo`` on 4 blocks and ``data_root``, one iteration; a Mask
    R-CNN's FPN and heads 32 wide (the published key names and what is
    checked of the weights do not depend on the widths)."""
    root = f'{data_root}/'
    path = tmp_path / f'{demo.stem}_tiny.py'
    ann, narrow = '', ''
    if 'mask_rcnn' in demo.stem:
        ann = (f"\nval_evaluator = dict(ann_file='{root}annotations/val.json')"
               '\ntest_evaluator = val_evaluator')
        narrow = f',\n             {NARROW_MASK_RCNN}'
    path.write_text(f"""
_base_ = '{demo}'
model = dict(backbone=dict(depth=4, out_indices=(0, 1, 2, 3)){narrow})
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root='{root}'))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root='{root}'))
test_dataloader = val_dataloader{ann}
train_cfg = dict(max_iters=1, val_interval=1)
param_scheduler = []
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
{extra}
""")
    return path


def _random_model_weights(config):
    """Our layout: the state dict of the config's model, random (seeded)."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import xcit_dense  # noqa: F401
    cfg = Config.fromfile(str(config))
    init_default_scope(cfg.default_scope)
    if cfg.default_scope == 'mmseg':
        from mmseg.registry import MODELS
    else:
        from mmdet.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    state = model.state_dict()
    for key, value in state.items():  # make every tensor matter
        if value.is_floating_point() and 'running_var' not in key:
            value.add_(torch.randn_like(value) * 0.02)
    return state


def _write_pair(tmp_path, config, toolkit, classes, palette=None):
    """The same random weights as our checkpoint and as a published one."""
    ours = _random_model_weights(config)
    published = {('backbone.pos_embeder.' + k[len('backbone.pos_embed.'):]
                  if k.startswith('backbone.pos_embed.') else k): v
                 for k, v in ours.items()}
    meta = {f'{toolkit}_version': '2.11.0' if toolkit == 'mmdet' else
            '0.11.0', 'CLASSES': classes, 'epoch': 36, 'iter': 1000,
            'config': "model = dict(type='...')", 'mmcv_version': '1.3.0'}
    if palette is not None:
        meta['PALETTE'] = palette
    ours_path, published_path = tmp_path / 'ours.pth', tmp_path / 'pub.pth'
    torch.save({'meta': {'dataset_meta': {'classes': classes}},
                'state_dict': ours}, ours_path)
    torch.save({'meta': meta, 'state_dict': published,
                'optimizer': {'state': {}, 'param_groups': [
                    {'lr': 1e-4, 'params': [0, 1]}]},
                'amp': {'loss_scaler0': {'loss_scale': 512.0,
                                         'unskipped': 17}}}, published_path)
    return ours_path, published_path, published


@pytest.fixture(scope='module')
def loopback(tmp_path_factory):
    """An HTTP server on 127.0.0.1 serving a temporary directory; stops at
    the end of the module."""
    root = tmp_path_factory.mktemp('served')

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ('127.0.0.1', 0), functools.partial(Quiet, directory=str(root)))
    # polled every 50 ms, not 0.5 s: its shutdown waits for the next poll
    thread = threading.Thread(target=server.serve_forever, args=(0.05, ),
                              daemon=True)
    thread.start()
    yield root, f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()
    server.server_close()


@pytest.fixture(scope='module')
def coco_pair(tmp_path_factory, tiny_coco):
    tmp = tmp_path_factory.mktemp('coco_published')
    cfg = _tiny_config(tmp, COCO_DEMO, tiny_coco)
    ours, pub, published = _write_pair(
        tmp, cfg, 'mmdet', ('circle', 'square', 'triangle'))
    return cfg, ours, pub, published


@pytest.fixture(scope='module')
def ade_pair(tmp_path_factory, tiny_ade20k):
    """The UperNet demo's pair, with ADE20K-style classes and palette."""
    tmp = tmp_path_factory.mktemp('ade_published')
    cfg = _tiny_config(tmp, ADE_DEMO, tiny_ade20k)
    classes = ('background', 'disc', 'square', 'triangle', 'stripes')
    palette = [[120, 120, 120], [220, 20, 60], [0, 128, 255], [60, 180, 75],
               [255, 200, 0]]
    ours, pub, published = _write_pair(tmp, cfg, 'mmseg', classes, palette)
    return cfg, ours, pub, published


def _fails_cleanly(proc, *patterns):
    err = proc.stderr
    assert proc.returncode == 1, proc.stdout[-2000:] + err[-2000:]
    assert 'Traceback' not in err, err[-3000:]
    message = err[err.rindex('error: '):]
    for pattern in patterns:
        assert re.search(pattern, message), message
    return message


# ---------------------------------------------------------------- tests
def test_synthesised_files_have_the_published_key_names(coco_pair,
                                                        ade_pair):
    *_, published = coco_pair
    assert sorted(published) == sorted(published_mask_rcnn_keys(4, 16))
    *_, published = ade_pair
    assert sorted(published) == sorted(published_upernet_keys(4, 16))


def test_detector_from_a_url_predicts_as_our_layout(coco_pair, loopback,
                                                    tmp_path):
    cfg, ours, pub, _ = coco_pair
    served, url = loopback
    name = 'maskrcnn_xcit_tiny_test.pth'
    (served / name).write_bytes(pub.read_bytes())
    torch_home = tmp_path / 'torch_home'
    env = dict(TORCH_HOME=str(torch_home))
    preds = {}
    for which, ckpt in (('ours', ours), ('published', f'{url}/{name}')):
        out = tmp_path / f'{which}.pkl'
        proc = run_tool_here('tools/test.py', cfg, ckpt, '--work-dir',
                             tmp_path / which, '--out', out, env=env)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-3000:]
        with open(out, 'rb') as f:
            preds[which] = pickle.load(f)
    assert 'Converted a published XCiT checkpoint' in log
    assert 'renamed backbone.pos_embeder.* -> backbone.pos_embed.*' in log
    assert 'dropped the mmdet 2.11.0 training state: optimizer, amp' in log
    # downloaded once into torch's hub cache
    assert (torch_home / 'hub' / 'checkpoints' / name).is_file()
    assert len(preds['ours']) == len(preds['published']) == 4
    for a, b in zip(preds['ours'], preds['published']):
        for key in ('bboxes', 'scores', 'labels'):
            assert torch.equal(a['pred_instances'][key],
                               b['pred_instances'][key])
        assert np.array_equal(np.asarray(a['pred_instances']['masks']),
                              np.asarray(b['pred_instances']['masks']))
    assert any(len(p['pred_instances']['scores']) for p in preds['ours'])


def test_mm_apis_take_published_files_as_they_are(coco_pair, ade_pair,
                                                  tmp_path, capsys,
                                                  loopback, monkeypatch):
    """mmdet's ``init_detector`` and ``DetInferencer`` and mmseg's
    ``init_model`` load without our tools (mmengine's non-strict
    ``load_checkpoint``): the backbone reads the published name of its
    positional encoder, so a published file gives the weights of ours, with
    nothing missing or left over; ``load_state_dict`` is strict with it."""
    from mmdet.apis import DetInferencer, init_detector
    from mmseg.apis import MMSegInferencer
    from mmseg.apis import init_model as init_segmentor
    cfg, ours, pub, published = coco_pair
    seg_cfg, seg_ours, seg_pub, _ = ade_pair
    loaded_ours = {}  # each toolkit's model of our file, by its init
    for init, config, files in (
            (init_detector, cfg, (ours, pub)),
            (init_segmentor, seg_cfg, (seg_ours, seg_pub))):
        capsys.readouterr()
        models = [init(str(config), str(f), device='cpu') for f in files]
        printed = capsys.readouterr()
        # mmengine prints what a non-strict load did not match
        assert 'do not match exactly' not in printed.out + printed.err
        ref, model = (m.state_dict() for m in models)
        loaded_ours[init] = ref
        assert ref.keys() == model.keys()
        assert all(torch.equal(ref[k], model[k]) for k in ref)
    models[1].load_state_dict(torch.load(seg_pub)['state_dict'], strict=True)
    segmentor = MMSegInferencer(model=str(seg_cfg), weights=str(seg_pub),
                                device='cpu').model
    assert all(torch.equal(a, b) for a, b in zip(
        segmentor.state_dict().values(), ref.values()))
    served, url = loopback  # DetInferencer from the URL, as docs show
    (served / 'mm_apis.pth').write_bytes(pub.read_bytes())
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    detector = DetInferencer(model=str(cfg), weights=f'{url}/mm_apis.pth',
                             device='cpu', show_progress=False).model
    assert all(torch.equal(a, b) for a, b in zip(
        detector.state_dict().values(), loaded_ours[init_detector].values()))


def test_damaged_published_file_names_the_key(coco_pair, tmp_path):
    from xcit_dense import CheckpointError
    from xcit_dense.checkpoint.published import (
        check_model_weights,
        convert_published,
    )
    cfg, ours, pub, _ = coco_pair
    ckpt = torch.load(pub, weights_only=True)
    model_state = torch.load(ours, weights_only=True)['state_dict']
    key = 'roi_head.mask_head.convs.2.conv.weight'
    missing = dict(ckpt, state_dict={
        k: v for k, v in ckpt['state_dict'].items() if k != key})
    with pytest.raises(CheckpointError,
                       match=rf'missing weights \(1\): {re.escape(key)}'):
        check_model_weights(convert_published(missing)[0]['state_dict'],
                            model_state)
    # a changed shape, through tools/test.py: one paragraph naming it
    ckpt['state_dict'][key] = ckpt['state_dict'][key][:, :-1]
    bad = tmp_path / 'damaged.pth'
    torch.save(ckpt, bad)
    proc = run_tool_here('tools/test.py', cfg, bad, '--work-dir',
                         tmp_path / 'w')
    _fails_cleanly(proc, rf'shape mismatches \(1\): {re.escape(key)}: '
                   r'checkpoint \(\d+, \d+, 3, 3\) vs model')


def test_resume_from_published_is_refused(coco_pair, tmp_path):
    cfg, _, pub, _ = coco_pair
    work = tmp_path / 'work'
    proc = run_tool_here('tools/train.py', cfg, '--work-dir', work, '--resume',
                         pub)
    _fails_cleanly(proc, r'Cannot resume from .*pub\.pth: it is a published',
                   r'load_from')
    assert not work.exists()


def test_fine_tune_published_on_other_classes(coco_pair, tmp_path):
    cfg, _, pub, published = coco_pair
    # two of the data's three categories: a different number of classes
    extra = ("metainfo = dict(classes=('circle', 'square'))\n"
             "train_dataloader = dict(dataset=dict(metainfo=metainfo))\n"
             "val_dataloader = dict(dataset=dict(metainfo=metainfo))\n"
             "model = dict(roi_head=dict(bbox_head=dict(num_classes=2), "
             "mask_head=dict(num_classes=2)))\n"
             f"load_from = '{pub}'")
    cfg4 = tmp_path / 'two_classes.py'
    cfg4.write_text(f"_base_ = '{cfg}'\n{extra}")
    work = tmp_path / 'work'
    proc = run_tool_here('tools/train.py', cfg4, '--work-dir', work)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert 'Converted a published XCiT checkpoint' in log
    reinit = re.search(r'Fine-tuning to other classes: the class-dependent '
                       r'layers (.*) differ in shape', log).group(1)
    assert set(reinit.split(', ')) == {
        'roi_head.bbox_head.fc_cls.weight', 'roi_head.bbox_head.fc_cls.bias',
        'roi_head.bbox_head.fc_reg.weight', 'roi_head.bbox_head.fc_reg.bias',
        'roi_head.mask_head.conv_logits.weight',
        'roi_head.mask_head.conv_logits.bias'}
    # everything else started from the published weights
    trained = torch.load(work / 'iter_1.pth', weights_only=True)
    start = published['backbone.pos_embeder.token_projection.weight']
    now = trained['state_dict']['backbone.pos_embed.token_projection.weight']
    assert (now - start).abs().max() < 1e-2  # one small step away


def test_demo_draws_published_model_with_its_classes(coco_pair, tiny_coco,
                                                     tmp_path):
    cfg, _, pub, _ = coco_pair
    image = next((tiny_coco / 'val').glob('*.png'))
    out = tmp_path / 'result.jpg'
    proc = run_tool_here('tools/demo.py', image, cfg, pub, '--out', out,
                         '--score-thr', '0.0')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'Converted a published XCiT checkpoint' in proc.stdout
    assert cv2.imread(str(out)).shape[:2] == (128, 128)


def test_converter_writes_our_layout(coco_pair, tmp_path):
    cfg, ours, pub, _ = coco_pair
    dst = tmp_path / 'converted.pth'
    # a .safetensors DST: refused before the model is built and checked
    proc = run_tool_here('tools/convert_checkpoint.py', pub,
                         tmp_path / 'converted.safetensors', '--config', cfg)
    _fails_cleanly(proc, r'whole detector / segmentor, which is written '
                   r'as \.pth')
    assert 'checking every weight' not in proc.stdout
    # the backbone checkpoints' options: refused, not ignored
    proc = run_tool_here('tools/convert_checkpoint.py', pub, dst, '--config',
                         cfg, '--arch', 'small_12_p16', '--checkpoint-key',
                         'model')
    _fails_cleanly(proc, r'--arch and --checkpoint-key choose what a '
                   r'classification / backbone checkpoint is checked against')
    assert not dst.exists()
    proc = run_tool_here('tools/convert_checkpoint.py', pub, dst, '--config',
                         cfg)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert 'renamed backbone.pos_embeder.*' in proc.stdout
    converted = torch.load(dst, weights_only=True)
    expected = torch.load(ours, weights_only=True)['state_dict']
    assert converted['state_dict'].keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(converted['state_dict'][key], value), key
    assert converted['meta']['dataset_meta']['classes'] == (
        'circle', 'square', 'triangle')
    assert converted['meta']['converted_from'] == 'mmdet 2.11.0'
    # without --config, a file name the model index does not know
    proc = run_tool_here('tools/convert_checkpoint.py', pub, dst)
    _fails_cleanly(proc, r'not in the model index; pass the config')


def test_segmentor_published_label_maps_equal(ade_pair, tmp_path):
    cfg, ours, pub, _ = ade_pair
    maps = {}
    for which, ckpt in (('ours', ours), ('published', pub)):
        out = tmp_path / f'{which}_maps'
        proc = run_tool_here('tools/test.py', cfg, ckpt, '--work-dir',
                             tmp_path / which, '--out', out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        maps[which] = [cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
                       for p in sorted(out.glob('*.png'))]
    assert len(maps['ours']) == len(maps['published']) == 4
    for a, b in zip(maps['ours'], maps['published']):
        assert np.array_equal(a, b)
    assert len(np.unique(np.concatenate([m.ravel()
                                         for m in maps['ours']]))) > 1


@pytest.mark.parametrize('patch', [16, 8])
def test_backbone_computes_what_the_published_code_computes(patch):
    """The backbone as the model index's configs build it (``out_sizes``
    left at its default) computes the published backbone's forward
    (restated from facebookresearch/xcit in tests/published_xcit.py), its
    weights taken in the published key layout, at sizes that are not
    multiples of 32: every level's shape and values, in eval mode and in
    training mode (batch statistics, gradients recorded), where the
    BatchNorms' running statistics follow too."""
    from published_xcit import Recorded, published_forward

    from xcit_dense import XCiT
    torch.manual_seed(0)
    model = XCiT(arch=f'nano_12_p{patch}', depth=4, out_indices=(0, 1, 2, 3))
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if key.endswith('running_var'):
                value.uniform_(0.5, 1.5)
            elif value.is_floating_point():  # every tensor matters
                value.add_(torch.randn_like(value) * 0.1)
    published = Recorded(
        (re.sub(r'^pos_embed\.', 'pos_embeder.', k), v.clone())
        for k, v in model.state_dict().items())
    assert sorted('backbone.' + k for k in published) == \
        sorted(published_backbone_keys(4, patch))
    heads = model.blocks[0].attn.num_heads
    for training in (False, True):
        model.train(training)
        for H, W in ((72, 100), (50, 66)):
            x = torch.randn(2, 3, H, W)
            with torch.set_grad_enabled(training):
                outs = model(x)
            with torch.no_grad():
                refs = published_forward(published, x, patch, heads,
                                         model.out_indices, training)
            for level, (out, ref) in enumerate(zip(outs, refs, strict=True)):
                where = f'{H}x{W}, level {level}, training={training}'
                assert out.shape == ref.shape, where
                torch.testing.assert_close(  # fp32 rounding: about 1e-6
                    out.detach(), ref, rtol=0,
                    atol=1e-5 * ref.abs().max().item(), msg=where)
    assert published.read == set(published)  # every published weight
    for key, value in model.state_dict().items():  # running statistics
        ref = published[re.sub(r'^pos_embed\.', 'pos_embeder.', key)]
        torch.testing.assert_close(value, ref, rtol=1e-5, atol=1e-6,
                                   msg=key)


def test_backbone_init_cfg_from_a_url(loopback, tmp_path, monkeypatch):
    from xcit_dense import XCiT
    served, url = loopback
    model = XCiT(arch='nano_12_p16', out_indices=(0, 1, 2, 3))
    torch.save({'model': {k: torch.randn_like(v) if v.is_floating_point()
                          else v for k, v in model.state_dict().items()
                          if not k.startswith('fpn')}},
               served / 'xcit_nano_test.pth')
    monkeypatch.setenv('TORCH_HOME', str(tmp_path))
    loaded = XCiT(arch='nano_12_p16', out_indices=(0, 1, 2, 3),
                  init_cfg=dict(type='Pretrained',
                                checkpoint=f'{url}/xcit_nano_test.pth'))
    loaded.init_weights()
    cached = tmp_path / 'hub' / 'checkpoints' / 'xcit_nano_test.pth'
    expected = torch.load(cached, weights_only=True)['model']
    state = loaded.state_dict()
    for key, value in expected.items():
        assert torch.equal(state[key], value), key


def test_url_that_fails_is_one_paragraph(loopback, coco_pair, tmp_path):
    cfg, *_ = coco_pair
    _, url = loopback
    proc = run_tool_here('tools/test.py', cfg, f'{url}/no_such_file.pth',
                         '--work-dir', tmp_path / 'w',
                         env=dict(TORCH_HOME=str(tmp_path)))
    _fails_cleanly(proc, r'Cannot download the checkpoint .*no_such_file',
                   r'404')
    assert not (tmp_path / 'hub' / 'checkpoints' /
                'no_such_file.pth').exists()
