"""tools/ on the embedded COCO demo: training with evaluation, resuming,
testing, drawing, and clear errors on bad input (two-process training:
test_interruptions.py)."""
import collections
import copy
import pickle
import re

import cv2
import pytest
import torch

from xcit_dense import XCiT
from xcit_dense.models import policy

from conftest import REPO
from shrink import NARROW_MASK_RCNN
from tool_runs import run_tool_here

DEMO = REPO / 'configs' / 'coco' / 'demo_mask_rcnn_xcit_nano_synthetic.py'


def _config(tmp_path, data_root, max_iters=4, extra=''):
    """The demo config on the tiny dataset, shrunk to a few iterations, a
    4-block backbone and 32-wide FPN and heads."""
    path = tmp_path / 'demo_tiny.py'
    path.write_text(f"""
_base_ = '{DEMO}'
data_root = '{data_root}/'
model = dict(backbone=dict(depth=4, out_indices=(0, 1, 2, 3)),
             {NARROW_MASK_RCNN})
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/val.json')
test_evaluator = val_evaluator
train_cfg = dict(max_iters={max_iters}, val_interval={max_iters})
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False,
                        begin=0, end=2)]
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval=2, max_keep_ckpts=5))
{extra}
""")
    return path


@pytest.fixture(scope='module')
def trained(tmp_path_factory, tiny_coco):
    """A 4-iteration demo training with evaluation, under mmengine's
    EMAHook (as mmdet's RTMDet and YOLOX recipes train): its checkpoints
    hold the average model, which the tools test, draw and resume."""
    tmp = tmp_path_factory.mktemp('train')
    cfg = _config(tmp, tiny_coco, extra="custom_hooks = [dict("
                  "type='EMAHook', ema_type='ExpMomentumEMA', "
                  "momentum=0.5, priority=49)]")
    work = tmp / 'work'
    looks = collections.Counter()  # (part, customised below it), per call
    customised_below = policy.customised_below
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(policy, 'customised_below', lambda module: looks.update(
            [(type(module).__name__, customised_below(module))]) or
            customised_below(module))
        proc = run_tool_here('tools/train.py', cfg, '--work-dir', work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cfg, work, proc.stdout + proc.stderr, looks


def test_train_logs_progress_and_coco_metrics(trained):
    _, work, out, _ = trained
    assert re.search(r'Iter\(train\) \[4/4\].*eta: .*loss: [\d.]+', out)
    assert 'loss_mask' in out
    assert re.search(r'coco/bbox_mAP: [\d.]+', out)
    assert re.search(r'coco/segm_mAP: [\d.]+', out)
    assert (work / 'iter_4.pth').is_file()
    saved = torch.load(work / 'iter_4.pth', weights_only=True)
    assert saved['ema_state_dict'].keys() > {
        'module.backbone.patch_embed.proj.0.0.weight'}


def test_the_runner_customises_no_call_below_a_part(trained):
    """mmengine's runner, with EMAHook, mmdet's detector and evaluation
    registers no hook nor instance ``forward`` below the backbone's parts:
    every part took its fast path in training and validation."""
    looks = trained[3]
    assert {part for part, _ in looks} == {
        'ConvPatchEmbed', 'CachedFourierEncoding', 'XCABlock', 'XCA', 'LPI',
        'Mlp', 'TransposedConvUpsampler'}
    assert not any(customised for _, customised in looks), looks


def test_resume_continues_with_same_state(trained, tmp_path, monkeypatch):
    """From the command line: resuming restores the iteration and the
    optimizer state (as loaded, before the next step), continues at the
    saved iteration, to a last checkpoint (one iteration: the fixture's
    iter_4.pth is left as it is)."""
    cfg, work, *_ = trained
    ckpt = torch.load(work / 'iter_2.pth', weights_only=True)  # the default
    assert ckpt['meta']['iter'] == 2
    from mmengine.runner import Runner
    resumed_state = []
    load_or_resume = Runner.load_or_resume

    def recorded(runner):
        load_or_resume(runner)
        resumed_state.append((runner.iter, copy.deepcopy(
            runner.optim_wrapper.state_dict()['state'])))
    monkeypatch.setattr(Runner, 'load_or_resume', recorded)
    resumed = tmp_path / 'resumed_cli'
    proc = run_tool_here('tools/train.py', cfg, '--work-dir', resumed,
                         '--resume', work / 'iter_2.pth', '--cfg-options',
                         'train_cfg.max_iters=3')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    (at, state), = resumed_state
    assert at == 2
    saved = ckpt['optimizer']['state']
    assert state.keys() == saved.keys() and len(state) > 0
    for k in saved:
        torch.testing.assert_close(state[k]['exp_avg'], saved[k]['exp_avg'])
    assert 'resumed epoch: 0, iter: 2' in out
    assert re.search(r'Iter\(train\) \[3/3\]', out)
    assert (resumed / 'iter_3.pth').is_file()


def test_test_tool_writes_predictions_and_drawings(trained, tmp_path,
                                                   windows):
    """--out, --show-dir and --show (a window per image, here a stand-in
    for a display) together, as in mmdet's tools/test.py."""
    cfg, work, *_ = trained
    out_pkl, show = tmp_path / 'preds.pkl', 'shown'
    proc = run_tool_here('tools/test.py', cfg, work / 'iter_4.pth',
                         '--work-dir', tmp_path, '--out', out_pkl,
                         '--show-dir', show, '--show', '--wait-time', '0.01')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r'coco/segm_mAP: [\d.]+', out)
    with open(out_pkl, 'rb') as f:
        preds = pickle.load(f)
    assert len(preds) == 4 and 'pred_instances' in preds[0]
    drawn = list(tmp_path.rglob(f'{show}/*.png'))
    assert len(drawn) == 4
    assert sorted(windows) == sorted(p.name for p in drawn)


def test_show_without_a_display_fails_cleanly(trained, tmp_path):
    """--show where matplotlib can open no window (no display: its backend
    writes files) is refused before the test, not left waiting unseen."""
    import matplotlib.pyplot as plt
    cfg, work, *_ = trained
    before = plt.get_backend()
    plt.switch_backend('agg')
    try:
        proc = run_tool_here('tools/test.py', cfg, work / 'iter_4.pth',
                             '--work-dir', tmp_path / 'work', '--show')
        demo = run_tool_here('tools/demo.py', tmp_path / 'any.png', cfg,
                             work / 'iter_4.pth', '--show')
    finally:
        plt.switch_backend(before)
    for proc, instead in ((proc, '--show-dir DIR'), (demo, '--out')):
        _fails_cleanly(proc, re.escape(
            "--show opens a window for each image, and matplotlib opens "
            "none here (its backend is 'agg'"), f'with {instead} instead')
    assert not (tmp_path / 'work').exists()
    proc = run_tool_here('tools/test.py', cfg, work / 'iter_4.pth',
                         '--show', '--wait-time', '-1')
    assert proc.returncode == 2
    assert '-1 is not a number of seconds >= 0' in proc.stderr


def test_demo_tool_draws(trained, tiny_coco, tmp_path):
    cfg, work, *_ = trained
    image = next((tiny_coco / 'val').glob('*.png'))
    out = tmp_path / 'vis' / 'result.jpg'
    # the names of mmseg's and mmdet 3's demo/image_demo.py
    proc = run_tool_here('tools/demo.py', image, cfg, work / 'iter_4.pth',
                         '--out-file', out, '--pred-score-thr', '0.0')
    assert proc.returncode == 0, proc.stderr[-3000:]
    drawn = cv2.imread(str(out))
    assert drawn is not None and drawn.shape[:2] == (128, 128)
    assert drawn.std() > 0
    # a folder (existing, or a path without an extension): the drawing under
    # the image's name; a file OpenCV writes no drawing as: one paragraph
    for folder in (tmp_path / 'vis', tmp_path / 'new' / 'drawn'):
        proc = run_tool_here('tools/demo.py', image, cfg, work / 'iter_4.pth',
                             '--out', folder)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert cv2.imread(str(folder / image.name)).shape[:2] == (128, 128)
    proc = run_tool_here('tools/demo.py', image, cfg, work / 'iter_4.pth',
                         '--out', tmp_path / 'result.txt')
    _fails_cleanly(proc, r'--out .*result\.txt: a drawing is written as an '
                   r'image file ending in \.jpg')
    assert not (tmp_path / 'result.txt').exists()


def test_demo_tool_draws_every_image_of_a_folder(trained, tiny_coco,
                                                 tmp_path, windows):
    """A folder of images: each drawn into the folder --out under its name
    with one model, or shown in a window titled with its name (--show, a
    stand-in display here); other files skipped; an --out that is a file,
    or a folder without images, is one paragraph."""
    import shutil
    cfg, work, *_ = trained
    folder = tmp_path / 'images'
    shutil.copytree(tiny_coco / 'val', folder)
    (folder / 'notes.txt').write_text('not an image')
    names = sorted(p.name for p in folder.glob('*.png'))
    out = tmp_path / 'drawn'
    proc = run_tool_here('tools/demo.py', folder, cfg, work / 'iter_4.pth',
                         '--out', out, '--score-thr', '0.0')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == names
    assert proc.stdout.count(' drawn to ') == len(names) == 4
    for name in names:
        drawn = cv2.imread(str(out / name))
        assert drawn is not None and drawn.shape[:2] == (128, 128)
    assert windows == []
    proc = run_tool_here('tools/demo.py', folder, cfg, work / 'iter_4.pth',
                         '--show', '--wait-time', '0.01')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert windows == names and proc.stdout.count(' shown\n') == 4
    proc = run_tool_here('tools/demo.py', folder, cfg, work / 'iter_4.pth')
    assert proc.returncode == 2 and 'give --out' in proc.stderr
    a_file, empty = tmp_path / 'a_file.jpg', tmp_path / 'empty'
    a_file.write_text('')
    empty.mkdir()
    for image, target, message in [
            (folder, a_file, 'must be a folder for a folder of images'),
            (empty, tmp_path / 'elsewhere', 'No image in the folder')]:
        proc = run_tool_here('tools/demo.py', image, cfg,
                             work / 'iter_4.pth', '--out', target)
        _fails_cleanly(proc, message)


def test_demo_tool_refuses_a_device_not_here(tmp_path):
    """--device names a device this machine has, or is refused by argparse
    before anything is read (it was PyTorch's traceback at the model's
    build: 'Found no NVIDIA driver')."""
    for device, message in [
            ('cuda:99', r'cuda:99: this machine has \d+ CUDA devices? '
                        r'\(--device cpu runs on the CPU\)'),
            ('gpu', "gpu is not a device")]:
        proc = run_tool_here('tools/demo.py', tmp_path / 'a.png',
                             tmp_path / 'a.py', tmp_path / 'a.pth', '--out',
                             tmp_path / 'out.jpg', '--device', device)
        assert proc.returncode == 2 and 'Traceback' not in proc.stderr
        assert re.search(message, proc.stderr), proc.stderr


def test_runtime_is_for_an_exported_file(trained, tmp_path):
    """--runtime with a checkpoint (run by PyTorch) is refused, not
    silently ignored."""
    cfg, work, *_ = trained
    for tool, args in [('tools/test.py', ()),
                       ('tools/demo.py', ('--out', tmp_path / 'x.png'))]:
        first = (tmp_path / 'a.png', ) if tool == 'tools/demo.py' else ()
        proc = run_tool_here(tool, *first, cfg, work / 'iter_4.pth', *args,
                             '--runtime', 'openvino')
        _fails_cleanly(proc, '--runtime chooses the runtime of an .onnx '
                       'file')


def test_demo_tool_refuses_what_is_no_image(trained, tmp_path):
    cfg, work, *_ = trained
    not_image = tmp_path / 'notes.png'
    not_image.write_text('not an image')
    for image, message in [(tmp_path / 'missing.png', 'Image not found'),
                           (not_image, 'Cannot read .*notes\\.png as an '
                            'image')]:
        proc = run_tool_here('tools/demo.py', image, cfg,
                             work / 'iter_4.pth', '--out',
                             tmp_path / 'out.jpg')
        _fails_cleanly(proc, message)
    assert not (tmp_path / 'out.jpg').exists()


def _fails_cleanly(proc, *patterns):
    """Exit status 1 and, last on stderr, one paragraph: its first line
    begins with 'error: ', and an indented line may follow (a checkpoint's
    mismatched keys by kind)."""
    err = proc.stderr
    assert proc.returncode == 1, proc.stdout[-2000:] + err[-2000:]
    assert 'Traceback' not in err
    lines = err.strip().splitlines()
    first = max(i for i, line in enumerate(lines)
                if not line.startswith('  '))
    message = '\n'.join(lines[first:])
    assert message.startswith('error: '), message
    for pattern in patterns:
        assert re.search(pattern, message), message


def test_amp_as_mmdets_train_tool_gives_it(tiny_coco, tmp_path,
                                           monkeypatch, capsys):
    """--amp: the config's OptimWrapper, named with its scope or without
    (or not named), becomes mmengine's AmpOptimWrapper; one already there
    is kept; on a machine without a GPU it is fp32 again, said once. A
    wrapper of another type is one paragraph before the work dir is
    written (mmdet's tools/train.py asserts)."""
    from mmengine.config import ConfigDict

    from xcit_dense.runner import adapt_to_machine, use_amp
    for given in ('OptimWrapper', 'mmengine.OptimWrapper', None):
        cfg = ConfigDict(optim_wrapper=dict(optimizer=dict(type='SGD')))
        if given:
            cfg.optim_wrapper.type = given
        use_amp(cfg)
        assert (cfg.optim_wrapper.type, cfg.optim_wrapper.loss_scale) == (
            'AmpOptimWrapper', 'dynamic'), given
    # bf16 as docs/training.md gives it: the AMP wrapper's own arguments
    # go with it (OptimWrapper refuses them)
    amp = dict(type='mmengine.AmpOptimWrapper', loss_scale=512.0,
               dtype='bfloat16', optimizer=dict(type='SGD', lr=0.1))
    cfg = ConfigDict(optim_wrapper=amp)
    use_amp(cfg)
    assert cfg.optim_wrapper == amp
    assert 'already enabled' in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    adapt_to_machine(cfg)
    assert cfg.optim_wrapper == dict(type='OptimWrapper',
                                     optimizer=amp['optimizer'])
    assert capsys.readouterr().out.startswith('No GPU: fp32 training')
    from mmengine.optim import build_optim_wrapper
    build_optim_wrapper(torch.nn.Linear(2, 2), cfg.optim_wrapper)

    work = tmp_path / 'work'
    proc = run_tool_here('tools/train.py', _config(tmp_path, tiny_coco),
                         '--work-dir', work, '--amp', '--cfg-options',
                         'optim_wrapper.type=ApexOptimWrapper')
    _fails_cleanly(proc, "--amp turns mmengine's OptimWrapper into its "
                   "AmpOptimWrapper, and this config's optimizer wrapper is "
                   "'ApexOptimWrapper'")
    assert not work.exists()


@pytest.mark.parametrize('tool', ['train.py', 'test.py'])
def test_checkpoint_of_another_model_fails_before_the_work_dir(
        trained, tmp_path, tool):
    """Resuming from, or testing, a checkpoint that does not fit the
    config's model (here: other classes) is one paragraph before the
    runner writes its work dir (no timestamped log folder, no config
    dump)."""
    cfg, work, *_ = trained
    other = tmp_path / 'work'
    args = (['--resume', work / 'iter_2.pth'] if tool == 'train.py' else
            [work / 'iter_2.pth'])
    first = [args.pop()] if tool == 'test.py' else []
    proc = run_tool_here(f'tools/{tool}', cfg, *first, '--work-dir', other,
                         *args, '--cfg-options',
                         'model.roi_head.bbox_head.num_classes=5')
    _fails_cleanly(proc, 'The checkpoint does not fit the model of the '
                   'config', r'roi_head\.bbox_head\.fc_cls\.weight: '
                   r'checkpoint \(4, 64\) vs model \(6, 64\)')
    assert not other.exists()


@pytest.mark.parametrize('tool,launcher,missing', [
    ('train.py', 'pytorch', 'RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT'),
    ('train.py', 'slurm', 'SLURM_PROCID, SLURM_NTASKS, SLURM_NODELIST'),
    ('test.py', 'mpi', 'OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_RANK, '
     'OMPI_COMM_WORLD_SIZE, MASTER_ADDR')])
def test_launcher_that_did_not_start_the_process_fails_cleanly(
        tool, launcher, missing, tiny_coco, tmp_path, monkeypatch):
    """``--launcher`` in a process its launcher did not start (where
    mmengine's ``init_dist`` ends in a KeyError or torch's rendezvous
    error): one paragraph naming what is missing, before anything is
    written."""
    from xcit_dense.cli import LAUNCHER_ENVIRONMENT
    for names, _ in LAUNCHER_ENVIRONMENT.values():
        for name in names:
            monkeypatch.delenv(name, raising=False)
    work = tmp_path / 'work'
    checkpoint = [] if tool == 'train.py' else [tmp_path / 'any.pth']
    proc = run_tool_here(f'tools/{tool}', _config(tmp_path, tiny_coco),
                         *checkpoint, '--work-dir', work, '--launcher',
                         launcher)
    _fails_cleanly(proc, re.escape(f'--launcher {launcher} is for a process '
                                   'started by'),
                   re.escape(f'(its environment has no {missing})'))
    assert not work.exists()


#: a bad input by case: the --cfg-options that make it
BAD_OPTIONS = {
    'data_root': ['train_dataloader.dataset.data_root=/nonexistent/'],
    'ann_file': ['train_dataloader.dataset.ann_file=annotations/x.json'],
    'arch': ['model.backbone.arch=huge_12_p16'],
    'drop_path_rate': ['model.backbone.drop_path_rate=1.5'],
    'unknown': ['model.backbone.drop_path=0.1'],
    'channels': ['model.backbone.arch=tiny_12_p16'],  # the neck as was
    # mmengine's conv-BN fusion of modules it traces with torch.fx
    'traced': ["efficient_conv_bn_eval=['backbone']"],
    'transposed': ["efficient_conv_bn_eval=['backbone.fpn1']"],
    # mmseg's ResNet bases set it; its EncoderDecoder hands it on
    'pretrained': ['model.pretrained=open-mmlab://resnet50_v1c'],
}
#: what the one paragraph says of it
BAD_INPUT_SAID = {
    'data_root': [r'data root .* does not exist: /nonexistent/'],
    'ann_file': [r'annotation file .* does not exist: .*annotations/'
                 r'x\.json'],
    'arch': [r"Unknown XCiT arch 'huge_12_p16'", r'nano_12_p16'],
    'drop_path_rate': [r'Bad backbone in the config \(model\.backbone\)'
                       r': drop_path_rate must be in \[0, 1\]'],
    'unknown': [r"unexpected keyword argument 'drop_path'"],
    'truncated': [r'bad\.pth', r'truncated'],
    'prefix': [r'mean_teacher\.pth cannot initialise the backbone',
               r"No weights under the prefix 'backbone\.'",
               r'begin with student\., teacher\.'],
    'channels': [r'model\.neck\.in_channels is \[128, 128, 128, 128\]'
                 r', but the backbone \(model\.backbone\) gives 4 maps '
                 r'of 192 channels'],
    'traced': [r"efficient_conv_bn_eval names 'backbone', but mmengine "
               r'traces it with torch\.fx, which cannot \(TraceError',
               r"efficient_conv_bn_eval=\['backbone\.patch_embed\.proj'"],
    'transposed': [r'computes nothing for the transposed convolution '
                   r'backbone\.fpn1\.0 followed by BatchNorm '
                   r'backbone\.fpn1\.1'],
    'pretrained': [r"model\.pretrained='open-mmlab://resnet50_v1c' "
                   r'would initialise the XCiT backbone',
                   r'--cfg-options model\.pretrained=None'],
    'shapes': [r'mean_teacher\.pth cannot initialise the backbone',
               r'patch_embed\.proj\.0\.0\.weight: checkpoint '
               r'\(24, 3, 3, 3\) vs model \(16, 3, 3, 3\)'],
}


def _bad_checkpoint_config(case, tmp_path) -> str:
    """The config lines that initialise the backbone from a bad checkpoint:
    a truncated file; a Mean Teacher detector's file (its backbones under
    'teacher.' and 'student.'; a tiny_12 one, 192 channels where the
    config's has 128) with the wrong prefix or with the right one."""
    if case == 'truncated':
        good = tmp_path / 'good.pth'
        torch.save({'state_dict': {'w': torch.zeros(1000)}}, good)
        bad = tmp_path / 'bad.pth'
        bad.write_bytes(good.read_bytes()[:300])
        return (f"model = dict(backbone=dict(init_cfg=dict(_delete_=True, "
                f"type='Pretrained', checkpoint='{bad}')))")
    if case in ('prefix', 'shapes'):
        path = tmp_path / 'mean_teacher.pth'
        with torch.device('meta'):
            weights = XCiT(arch='tiny_12_p16', depth=4,
                           out_indices=(0, 1, 2, 3)).state_dict()
        torch.save({'state_dict': {
            f'{model}.backbone.{k}': torch.zeros(v.shape, dtype=v.dtype)
            for model in ('teacher', 'student') for k, v in weights.items()}},
            path)
        prefix = 'backbone.' if case == 'prefix' else 'teacher.backbone'
        return (f"model['backbone']['init_cfg'] = dict(_delete_=True, "
                f"type='Pretrained', checkpoint='{path}', "
                f"prefix='{prefix}')")
    return ''


@pytest.mark.parametrize('case', BAD_INPUT_SAID)
def test_bad_input_fails_cleanly(case, tiny_coco, tmp_path):
    work = tmp_path / 'work'
    cfg = _config(tmp_path, tiny_coco,
                  extra=_bad_checkpoint_config(case, tmp_path))
    args = ['tools/train.py', cfg, '--work-dir', work]
    if case in BAD_OPTIONS:
        args += ['--cfg-options', *BAD_OPTIONS[case]]
    _fails_cleanly(run_tool_here(*args), *BAD_INPUT_SAID[case])
    assert not work.exists()  # nothing that looks like a run
