"""tools/get_flops.py: FLOPs and parameters of the demo detectors and
segmentors, as mmdet's and mmseg's get_flops.py count them (validation
images or one image of ``--shape``), the backbone's equal to mmengine's
count of the straightforward computation (validation images: the same code
for both toolkits, run here for a segmentor)."""
import functools
import re

import pytest
import torch

from conftest import REPO
from tool_runs import load_tool, run_tool_here

COCO_DEMO = REPO / 'configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py'
ADE20K = REPO / 'configs/ade20k'


def _counts(proc):
    """The tool's figures: input shape, FLOPs, parameters and the
    backbone's FLOPs and parameters, as printed."""
    out = proc.stdout
    assert proc.returncode == 0, out[-2000:] + proc.stderr[-3000:]
    found = re.search(
        r'Compute type: (.*)\nInput shape: (\(\d+, \d+\)).*\nFlops: (\S+)\n'
        r'Params: (\S+)\n=+\nBackbone \(XCiT\): Flops (\S+), Params (\S+)\n'
        r'Flops are multiply-adds .* not counted \(how often each ran\): '
        r'.*aten::gelu \(\d+\)', out)
    assert found, out
    return found.groups()


@functools.lru_cache(maxsize=None)
def _tool():
    return load_tool('get_flops')


def _size(number):
    return _tool().size(number)


@functools.lru_cache(maxsize=None)
def _backbone_flops(h, w):
    """mmengine's count of the demos' backbone, straightforward (once per
    size)."""
    from mmengine.analysis import FlopAnalyzer

    from xcit_dense import XCiT
    model = XCiT(arch='nano_12_p16', fast_path=False).eval()
    with torch.no_grad():
        return FlopAnalyzer(model, torch.zeros(1, 3, h, w)).total()


def _parameters(config):
    """The parameters of ``config``'s model, all and its backbone's, but
    those of an auxiliary head (training only)."""
    from xcit_dense.cli import load_config
    from xcit_dense.inference import init_model
    model = init_model(load_config(str(config)), None)
    counted = [(name, p.numel()) for name, p in model.named_parameters()
               if not name.startswith('auxiliary_head.')]
    return (sum(n for _, n in counted),
            sum(n for name, n in counted if name.startswith('backbone.')))


def test_detector_on_one_shape():
    """One image of ``--shape``, padded by the data preprocessor as mmdet's
    is (and said so); the parameters the model's, the backbone's count
    mmengine's of the straightforward computation."""
    proc = run_tool_here('tools/get_flops.py', COCO_DEMO, '--shape', '60',
                         '90')
    kind, shape, flops, params, backbone, backbone_params = _counts(proc)
    assert kind == 'direct: randomly generate a picture'
    assert 'Use size divisor set input shape from (60, 90) to (64, 96)' \
        in proc.stdout
    assert shape == '(64, 96)'
    total, in_backbone = _parameters(COCO_DEMO)
    assert (params, backbone_params) == (_size(total), _size(in_backbone))
    assert backbone == _size(_backbone_flops(64, 96))
    # the same count again: the image and the initial weights are seeded
    # (the RoI heads' count depends on the proposals of both)
    again = run_tool_here('tools/get_flops.py', COCO_DEMO, '--shape', '60',
                          '90')
    assert _counts(again)[2] == flops


@pytest.mark.parametrize('demo', ['upernet', 'mask2former'])
def test_segmentor_without_its_auxiliary_head(demo, tiny_ade20k):
    """mmseg's way: one image (``--shape H``: square), the auxiliary head,
    which only training runs, left out; a Mask2Former head, which mmseg's
    'tensor' mode calls without the data samples it needs, counted as its
    prediction runs it. ``--num-images``: validation images, as for
    detection."""
    config = ADE20K / f'demo_{demo}_xcit_nano_synthetic.py'
    proc = run_tool_here('tools/get_flops.py', config, '--shape', '64')
    kind, shape, flops, params, backbone, _ = _counts(proc)
    assert kind == 'direct: randomly generate a picture'
    assert shape == '(64, 64)'
    assert params == _size(_parameters(config)[0])
    assert backbone == _size(_backbone_flops(64, 64))
    if demo == 'upernet':  # validation images, mmdet's default way
        proc = run_tool_here(
            'tools/get_flops.py', config, '--num-images', '2',
            '--cfg-options',
            f'val_dataloader.dataset.data_root={tiny_ade20k}/')
        kind, shape, _, _, backbone, _ = _counts(proc)
        assert kind == 'dataloader: load a picture from the dataset'
        assert '(the last of 2 images; Flops: their mean)' in proc.stdout
        h, w = map(int, shape.strip('()').split(', '))
        assert backbone == _size(_backbone_flops(h, w))


@pytest.mark.parametrize('text,suffix,message', [
    ('a = 1\nx = undefined_name\n', '.py', r"NameError: name "
     r"'undefined_name' is not defined \(line 2 of .*bad\.py\)"),
    ('a: [1, 2\n', '.yaml', r"ParserError: while parsing a flow sequence"),
    ('hi\n', '.txt', r'a config is a \.py, \.json, \.yaml, \.yml file'),
])
def test_a_config_that_does_not_load_is_one_paragraph(tmp_path, text, suffix,
                                                      message):
    config = tmp_path / f'bad{suffix}'
    config.write_text(text)
    proc = run_tool_here('tools/get_flops.py', config, '--shape', '64')
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert re.search(rf'^error: Cannot load the config .*bad\{suffix}: '
                     rf'{message}', proc.stderr.splitlines()[-1])


@pytest.mark.parametrize('option,code,message', [
    ('foo', 2, r"--cfg-options takes key=value items .*got 'foo'"),
    ('model.neck.type=Nope', 1,
     r'^error: Nope is not in the mmdet::model registry'),
])
def test_a_bad_cfg_option_is_one_paragraph(option, code, message):
    proc = run_tool_here('tools/get_flops.py', COCO_DEMO, '--shape', '64',
                         '--cfg-options', option)
    assert proc.returncode == code and 'Traceback' not in proc.stderr
    assert re.search(message, proc.stderr.splitlines()[-1])


def test_bad_input_is_one_paragraph(tmp_path):
    proc = run_tool_here('tools/get_flops.py', COCO_DEMO, '--shape', '1',
                         '2', '3')
    assert proc.returncode == 2
    assert '--shape takes H or H W, got 3 numbers' in proc.stderr
    proc = run_tool_here('tools/get_flops.py', COCO_DEMO, '--shape', '64',
                         '--num-images', '2')
    assert proc.returncode == 2
    assert 'give one of them' in proc.stderr
    proc = run_tool_here('tools/get_flops.py', COCO_DEMO, '--cfg-options',
                         f'val_dataloader.dataset.data_root={tmp_path}/no/')
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert re.search(r'^error: .*data root .* does not exist.*; or count '
                     r'one image of a given size instead: --shape H W',
                     proc.stderr.splitlines()[-1])
