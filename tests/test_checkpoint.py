"""Importing classification checkpoints: every supported format, numerical
parity with timm, and clear failures on bad files."""
import argparse
import datetime
import re

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from xcit_dense import CheckpointError, XCiT
from xcit_dense.checkpoint import (
    convert_state_dict,
    extract_state_dict,
    read_checkpoint,
)

from conftest import REPO
from tool_runs import run_tool_here

OUT_INDICES = [3, 5, 7, 11]


def _timm_model(arch):
    """A timm XCiT with random weights and non-trivial BatchNorm statistics."""
    torch.manual_seed(0)
    model = timm.create_model(f'xcit_{arch}_224', pretrained=False)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    for name, p in model.named_parameters():
        if name.endswith(('gamma1', 'gamma2', 'gamma3', 'temperature')):
            p.data.uniform_(0.5, 1.5)
    return model.eval()


def _official(sd):
    """The facebookresearch/xcit layout: under 'model', 'pos_embeder',
    training arguments alongside."""
    model = {k.replace('pos_embed.', 'pos_embeder.'): v for k, v in sd.items()}
    return {'model': model, 'epoch': 399,
            'args': argparse.Namespace(model='xcit', lr=5e-4)}


def _dino(sd):
    """A DINO training checkpoint: DDP student, plain teacher, both wrapping
    the backbone with a projection head."""
    backbone = {k.replace('pos_embed.', 'pos_embeder.'): v
                for k, v in sd.items() if not k.startswith('head.')}
    head = {'head.mlp.0.weight': torch.randn(8, 4),
            'head.last_layer.weight_g': torch.randn(8, 1)}
    teacher = {**{f'backbone.{k}': v for k, v in backbone.items()}, **head}
    student = {f'module.{k}': torch.zeros_like(v) for k, v in teacher.items()}
    return {'teacher': teacher, 'student': student, 'epoch': 300,
            'args': argparse.Namespace(arch='xcit_small_12_p16')}


FORMATS = {
    'official.pth': lambda sd, path: torch.save(_official(sd), path),
    'timm.pth': lambda sd, path: torch.save(sd, path),
    'pytorch_model.bin': lambda sd, path: torch.save(sd, path),
    'model.safetensors': lambda sd, path: save_file(
        {k: v.contiguous() for k, v in sd.items()}, str(path)),
    'dino.pth': lambda sd, path: torch.save(_dino(sd), path),
}


@pytest.fixture(scope='module')
def timm_nano():
    return _timm_model('nano_12_p16')


def _load(path, arch='nano_12_p16', **kwargs):
    model = XCiT(arch=arch, init_cfg=dict(type='Pretrained',
                                          checkpoint=str(path)), **kwargs)
    model.init_weights()
    return model.eval()


@pytest.fixture(scope='module')
def timm_taps(timm_nano):
    """Images of two sizes and timm's intermediates of them, computed once
    for the formats compared with them."""
    torch.manual_seed(0)
    pairs = []
    for size in [(224, 224), (100, 150)]:
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            pairs.append((size, x, timm_nano.forward_intermediates(
                x, indices=OUT_INDICES, intermediates_only=True)))
    return pairs


@pytest.mark.parametrize('fmt', sorted(FORMATS))
def test_parity_with_timm(fmt, timm_nano, timm_taps, tmp_path):
    path = tmp_path / fmt
    FORMATS[fmt](timm_nano.state_dict(), path)
    model = _load(path)
    for size, x, ref in timm_taps:
        with torch.no_grad():
            taps = model.forward_taps(x)
        for a, b in zip(taps, ref):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        if size == (224, 224):  # the pyramid of the same taps, at one size
            with torch.no_grad():
                outs = model(x)
            assert torch.equal(outs[2], taps[2])
            assert torch.equal(outs[3], F.max_pool2d(taps[3], 2, 2))


def test_parity_patch8(tmp_path):
    ref_model = _timm_model('nano_12_p8')
    path = tmp_path / 'official_p8.pth'
    torch.save(_official(ref_model.state_dict()), path)
    model = _load(path, arch='nano_12_p8')
    x = torch.randn(1, 3, 128, 160)
    with torch.no_grad():
        ref = ref_model.forward_intermediates(
            x, indices=OUT_INDICES, intermediates_only=True)
        taps, outs = model.forward_taps(x), model(x)
    for a, b in zip(taps, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert torch.equal(outs[1], taps[1])
    assert torch.equal(outs[2], F.max_pool2d(taps[2], 2, 2))
    assert torch.equal(outs[3], F.max_pool2d(taps[3], 4, 4))


def test_dino_student_key(timm_nano, tmp_path):
    path = tmp_path / 'dino.pth'
    FORMATS['dino.pth'](timm_nano.state_dict(), path)
    model = XCiT(arch='nano_12_p16', init_cfg=dict(
        type='Pretrained', checkpoint=str(path), checkpoint_key='student'))
    model.init_weights()
    assert torch.all(model.blocks[0].attn.qkv.weight == 0)


def test_classification_weights_dropped_and_logged(timm_nano, tmp_path):
    from xcit_dense.checkpoint import load_backbone_checkpoint
    path = tmp_path / 'official.pth'
    FORMATS['official.pth'](timm_nano.state_dict(), path)
    model = XCiT(arch='nano_12_p16')
    fpn_before = model.fpn1[0].weight.clone()
    messages = []

    class Log:
        info = messages.append
    report = load_backbone_checkpoint(model, str(path), logger=Log)
    assert report['format'] == 'official'
    dropped = set(report['dropped'])
    assert {'cls_token', 'norm.weight', 'head.weight'} <= dropped
    assert any(k.startswith('cls_attn_blocks.') for k in dropped)
    assert 'fpn1.0.weight' in report['fresh']
    assert torch.equal(model.fpn1[0].weight, fpn_before)
    log = '\n'.join(messages)
    assert 'cls_token' in log and 'cls_attn_blocks' in log
    assert 'freshly initialised' in log


def test_rgb_checkpoint_into_other_input_channels(timm_nano, tmp_path):
    """``in_channels=1`` or 4 from an RGB checkpoint, as timm adapts its
    stems: one channel takes the sum of the three filters (a grey image
    gives what the RGB model gives for it in three equal channels), four
    repeat them, scaled by 3/4; every other weight is the checkpoint's
    (the pyramid's are fresh: a classification checkpoint),
    and the log says what was done. Anything else that differs is still
    refused."""
    from xcit_dense.checkpoint import load_backbone_checkpoint
    path = tmp_path / 'timm.pth'
    torch.save(timm_nano.state_dict(), path)
    rgb = _load(path)
    first = rgb.patch_embed.proj[0][0].weight
    grey = _load(path, in_channels=1)
    x = torch.randn(1, 1, 64, 96)
    with torch.no_grad():  # (the pyramid is fresh in each: the taps)
        for out, ref in zip(grey.forward_taps(x),
                            rgb.forward_taps(x.expand(1, 3, 64, 96))):
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)
    four = XCiT(arch='nano_12_p16', in_channels=4)
    messages = []

    class Log:
        info = messages.append
    report = load_backbone_checkpoint(four, str(path), logger=Log)
    torch.testing.assert_close(four.patch_embed.proj[0][0].weight,
                               torch.cat([first, first[:, :1]], 1) * 0.75)
    for (name, a), b in zip(four.named_parameters(), rgb.parameters()):
        if name != 'patch_embed.proj.0.0.weight' and \
                not name.startswith('fpn'):
            assert torch.equal(a, b), name
    assert report['adapted'] == messages[1] == (
        "The stem's first convolution takes 4 image channels: its "
        'checkpoint weight is repeated from its 3 '
        "(timm's adapt_input_conv).")
    with pytest.raises(CheckpointError, match='shape mismatches'):
        _load(path, arch='tiny_12_p16', in_channels=1)


def test_pretrained_takes_mmengines_arguments(timm_nano, tmp_path):
    """``init_cfg`` as mmengine's ``Pretrained`` takes it: ``prefix`` (the
    weights under it, with or without its final dot: a Mean Teacher
    detector's ``'teacher.backbone.'``), ``map_location``; and as one entry
    of a list of initialisers, applied after the others (a ``Constant`` on
    the transposed convolutions stays where the classification checkpoint
    has no pyramid; one on the LayerNorms is overwritten by it)."""
    model = XCiT(arch='nano_12_p16')
    own = model.state_dict()
    path = tmp_path / 'mean_teacher.pth'
    torch.save({'state_dict': {
        **{f'teacher.backbone.{k}': v for k, v in own.items()},
        **{f'student.backbone.{k}': torch.zeros_like(v)
           for k, v in own.items()}}}, path)
    for prefix in ('teacher.backbone.', 'teacher.backbone'):
        loaded = XCiT(arch='nano_12_p16', init_cfg=dict(
            type='Pretrained', checkpoint=str(path), prefix=prefix,
            map_location='cpu'))
        loaded.init_weights()
        for k, v in loaded.state_dict().items():
            assert torch.equal(v, own[k]), k
    with pytest.raises(CheckpointError, match=re.escape(
            "No weights under the prefix 'backbone.': the checkpoint's "
            'names begin with student., teacher.')):
        XCiT(arch='nano_12_p16', init_cfg=dict(
            type='Pretrained', checkpoint=str(path),
            prefix='backbone')).init_weights()

    official = tmp_path / 'official.pth'
    FORMATS['official.pth'](timm_nano.state_dict(), official)
    model = XCiT(arch='nano_12_p16', init_cfg=[
        dict(type='Constant', layer='ConvTranspose2d', val=0.5, bias=0.),
        dict(type='Constant', layer='LayerNorm', val=2., bias=0.),
        dict(type='Pretrained', checkpoint=str(official))])
    model.init_weights()
    assert torch.all(model.fpn1[0].weight == 0.5)
    assert torch.equal(model.blocks[0].norm1.weight,
                       timm_nano.blocks[0].norm1.weight)


@pytest.mark.parametrize('init_cfg, message', [
    (dict(type='Pretrained', checkpoint='a.pth', prefx='backbone.'),
     r"'Pretrained' takes checkpoint .* checkpoint_key .*; got prefx"),
    (dict(type='Pretrained'), r"'Pretrained' needs a 'checkpoint'"),
    ([dict(type='Pretrained', checkpoint='a.pth'),
      dict(type='Pretrained', checkpoint='b.pth')],
     r"2 entries of type 'Pretrained'"),
    ('a.pth', r"init_cfg must be None, a dict with a 'type'"),
    ([dict(checkpoint='a.pth')], r"init_cfg must be None, a dict with a"),
    (dict(type='Pretrained', checkpoint='a.pth', prefix=3),
     r"prefix must be a string such as 'backbone\.', got 3")])
def test_bad_init_cfg_is_named(init_cfg, message):
    with pytest.raises(ValueError, match=message):
        XCiT(arch='nano_12_p16', init_cfg=init_cfg)


def test_pruned_blocks_dropped(timm_nano, tmp_path):
    path = tmp_path / 'timm.pth'
    torch.save(timm_nano.state_dict(), path)
    model = _load(path, out_indices=(1, 2, 3, 5))
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = timm_nano.forward_intermediates(x, indices=[1, 2, 3, 5],
                                              intermediates_only=True)
        for a, b in zip(model.forward_taps(x), ref):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_a_shallower_depth_than_the_checkpoint_says_how(timm_nano,
                                                          tmp_path):
    """``depth=4`` for a 12-block checkpoint: refused (strict), with the
    way to use its first blocks, which works."""
    path = tmp_path / 'timm.pth'
    torch.save(timm_nano.state_dict(), path)
    with pytest.raises(CheckpointError, match=r'The checkpoint has 12 '
                       r'blocks, this backbone depth 4: .*keep depth=12 '
                       r"\(the preset's\) and tap earlier blocks with "
                       r'out_indices'):
        _load(path, depth=4, out_indices=(0, 1, 2, 3))
    model = _load(path, out_indices=(0, 1, 2, 3))
    assert len(model.blocks) == 4


def test_own_checkpoint_roundtrip_with_pyramid(tmp_path):
    model = XCiT(arch='nano_12_p16').eval()
    path = tmp_path / 'detector.pth'
    torch.save({'meta': {'epoch': 1}, 'state_dict': {
        **{f'backbone.{k}': v for k, v in model.state_dict().items()},
        'neck.lateral_convs.0.conv.weight': torch.randn(4, 4)}}, path)
    loaded = _load(path).state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(loaded[k], v), k


def test_whole_pyramid_checkpoint_into_fewer_levels(tmp_path):
    """A 4-level detector's backbone imported into ``out_levels=(1, 2, 3)``
    (a DINO or RTMDet neck): the stride-4 resampler's weights are dropped
    with their reason, as the blocks after the last tap are; the rest
    loads."""
    from xcit_dense.checkpoint import load_backbone_checkpoint
    model = XCiT(arch='nano_12_p16').eval()
    path = tmp_path / 'detector.pth'
    torch.save({'state_dict': {f'backbone.{k}': v
                               for k, v in model.state_dict().items()}},
               path)
    loaded = XCiT(arch='nano_12_p16', out_levels=(1, 2, 3))
    messages = []

    class Log:
        info = messages.append
    report = load_backbone_checkpoint(loaded, str(path), logger=Log)
    saved = model.state_dict()
    for k, v in loaded.state_dict().items():
        assert torch.equal(saved[k], v), k
    fpn1 = {k: why for k, why in report['dropped'].items()
            if k.startswith('fpn1.')}
    assert fpn1 and set(fpn1.values()) == {
        'a pyramid level not returned (out_levels)'}
    assert any('fpn1' in m for m in messages), messages


def test_whole_model_of_more_levels_into_fewer_says_what_loads():
    """A whole detector of 4 levels as the ``load_from`` of a model whose
    backbone returns 3 (its neck and heads built for 3): refused, with the
    way to start from its backbone, which loads (the test above); another
    mismatch keeps the general advice."""
    from xcit_dense.checkpoint.published import check_model_weights
    model = {f'backbone.{k}': v for k, v in
             XCiT(arch='nano_12_p16', out_levels=(1, 2, 3)).state_dict()
             .items()}
    model['neck.lateral_convs.0.conv.weight'] = torch.zeros(8, 128, 1, 1)
    whole = dict(model, **{
        'backbone.fpn1.0.weight': torch.zeros(128, 128, 2, 2),
        'neck.lateral_convs.3.conv.weight': torch.zeros(8, 128, 1, 1)})
    with pytest.raises(CheckpointError) as info:
        check_model_weights(whole, model)
    assert "returns pyramid level 0, which this model's backbone does " \
        'not (out_levels)' in str(info.value)
    assert "init_cfg=dict(type='Pretrained', checkpoint=FILE, " \
        "prefix='backbone.')" in str(info.value)
    del whole['backbone.fpn1.0.weight']
    with pytest.raises(CheckpointError,
                       match='Check that the config matches the checkpoint'):
        check_model_weights(whole, model)


@pytest.mark.parametrize('fast', [True, False])
def test_checkpoint_saved_before_the_redesign(fast):
    """A checkpoint written by the single-class backbone (commit 565bbaa,
    tests/fixtures/xcit_before_redesign.pth: every key of stem, positional
    encoding, blocks and pyramid) loads strictly into today's module layout
    and gives the outputs that code gave (its levels were cropped to
    ceil(H/s) x ceil(W/s): ``out_sizes='ceil'``)."""
    path = REPO / 'tests/fixtures/xcit_before_redesign.pth'
    saved = torch.load(REPO / 'tests/fixtures/'
                       'xcit_before_redesign_outputs.pt', weights_only=True)
    model = XCiT(arch=None, patch_size=16, embed_dim=16, depth=4,
                 num_heads=2, out_indices=(0, 1, 2, 3), fast_path=fast,
                 out_sizes='ceil',
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    state = torch.load(path, weights_only=True)['state_dict']
    assert model.state_dict().keys() == state.keys()
    model.eval()
    with torch.no_grad():
        outs = model(saved['input'])
    for out, ref in zip(outs, saved['outputs']):
        torch.testing.assert_close(out, ref, rtol=0,
                                   atol=1e-5 * ref.abs().max().item())


def test_converter_tool(timm_nano, tmp_path):
    src, dst = tmp_path / 'dino.pth', tmp_path / 'backbone.pth'
    FORMATS['dino.pth'](timm_nano.state_dict(), src)
    proc = run_tool_here('tools/convert_checkpoint.py', src, dst,
                         cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert 'nano_12_p16' in proc.stdout  # inferred preset
    # into a log (no terminal): the progress bar's last frame only
    assert '\r' not in proc.stdout
    assert proc.stdout.count('copying [') == 1, proc.stdout
    saved = torch.load(dst, weights_only=True)
    assert set(saved) == {'state_dict', 'meta'}
    assert not any(k.startswith(('head', 'cls', 'backbone.', 'pos_embeder'))
                   for k in saved['state_dict'])
    model = _load(dst)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = timm_nano.forward_intermediates(x, indices=OUT_INDICES,
                                              intermediates_only=True)
        for a, b in zip(model.forward_taps(x), ref):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # a DST it cannot write: one paragraph before anything is read, and no
    # file left (written under a temporary name, then moved into place)
    for bad, message in [(tmp_path / 'out.txt', 'DST names the file to '
                          'write, ending in .pth'),
                         (src, 'DST is SRC'),
                         (dst / 'x.pth', 'is a file, not a folder')]:
        proc = run_tool_here('tools/convert_checkpoint.py', src, bad,
                             cwd=tmp_path)
        assert proc.returncode == 1 and 'Traceback' not in proc.stderr
        assert message in proc.stderr, proc.stderr
    # --config checks published detectors / segmentors, not a backbone
    proc = run_tool_here('tools/convert_checkpoint.py', src,
                         tmp_path / 'other.pth', '--config',
                         'mask_rcnn_xcit_s12_p16_3x_coco', cwd=tmp_path)
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert '--config is for published detectors' in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ['backbone.pth',
                                                           'dino.pth']


def test_an_onnx_file_is_named_as_such(tmp_path):
    import onnx
    from onnx import TensorProto, helper
    value = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1])
    out = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node('Identity', ['x'], ['y'])],
                              'exported', [value], [out])
    path = tmp_path / 'model.onnx'
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(CheckpointError, match='is an ONNX file .an exported '
                       'model'):
        read_checkpoint(str(path))
    # renamed, it is still told apart by its contents
    path.rename(tmp_path / 'model.pth')
    with pytest.raises(CheckpointError, match='is an ONNX file'):
        read_checkpoint(str(tmp_path / 'model.pth'))


def test_convert_state_dict_is_pure():
    sd = {'module.backbone.pos_embeder.token_projection.weight':
          torch.zeros(1), 'module.head.w': torch.zeros(1)}
    before = dict(sd)
    out, dropped = convert_state_dict(sd)
    assert sd == before
    assert list(out) == ['pos_embed.token_projection.weight']
    assert dropped == {'head.w': 'not part of the backbone'}


# ------------------------------------------------------------ bad files
def test_missing_weight_names_key(timm_nano, tmp_path):
    sd = dict(timm_nano.state_dict())
    del sd['blocks.4.attn.qkv.weight']
    path = tmp_path / 'missing.pth'
    torch.save(sd, path)
    with pytest.raises(CheckpointError,
                       match=r'missing backbone weights.*blocks\.4\.attn\.qkv'
                       r'\.weight'):
        _load(path)


def test_shape_mismatch_names_key(timm_nano, tmp_path):
    path = tmp_path / 'nano.pth'
    torch.save(timm_nano.state_dict(), path)
    with pytest.raises(CheckpointError, match=r'shape mismatches.*'
                       r'patch_embed\.proj\.0\.0\.weight: checkpoint '
                       r'\(16, 3, 3, 3\) vs model \(24, 3, 3, 3\)'):
        _load(path, arch='tiny_12_p16')


def test_deeper_checkpoint_is_unexpected(timm_nano, tmp_path):
    """A 24-block checkpoint (nano's blocks twice over, as XCiT-T24 is
    XCiT-T12's) into the 12 blocks of the preset."""
    sd = timm_nano.state_dict()
    sd.update({re.sub(r'^blocks\.(\d+)\.',
                      lambda m: f'blocks.{int(m.group(1)) + 12}.', k): v
               for k, v in sd.items() if k.startswith('blocks.')})
    path = tmp_path / 'deep.pth'
    torch.save(sd, path)
    with pytest.raises(CheckpointError, match=r'unexpected keys.*blocks\.12'):
        _load(path)


def test_partial_pyramid_is_an_error(tmp_path):
    model = XCiT(arch='nano_12_p16')
    sd = model.state_dict()
    del sd['fpn2.0.weight']
    path = tmp_path / 'partial.pth'
    torch.save({'state_dict': sd}, path)
    with pytest.raises(CheckpointError, match=r'missing.*fpn2\.0\.weight'):
        _load(path)


def test_truncated_file(timm_nano, tmp_path):
    path = tmp_path / 'full.pth'
    torch.save(timm_nano.state_dict(), path)
    data = path.read_bytes()
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match='truncated'):
        _load(cut)
    cut_st = tmp_path / 'cut.safetensors'
    save_file({k: v.contiguous() for k, v in timm_nano.state_dict().items()},
              str(tmp_path / 'full.safetensors'))
    cut_st.write_bytes((tmp_path / 'full.safetensors').read_bytes()[:1000])
    with pytest.raises(CheckpointError, match='truncated'):
        _load(cut_st)


def test_arbitrary_pickle_refused(timm_nano, tmp_path):
    path = tmp_path / 'pickled.pth'
    torch.save({'model': dict(timm_nano.state_dict()),
                'when': datetime.datetime(2021, 6, 17)}, path)
    with pytest.raises(CheckpointError, match=re.escape(
            'arbitrary unpickling') + '.*' + re.escape(
            'The unpickler: Unsupported global: GLOBAL datetime.datetime '
            'was not an allowed global by default.')):
        _load(path)


@pytest.mark.parametrize('content', [b'# xcit-dense\n\nThe XCiT backbone',
                                     bytes(range(256)) * 4,
                                     b'hi\n'])  # the unpickler's KeyError
def test_file_that_is_no_checkpoint_is_named_so(tmp_path, content):
    """A text file or other bytes given as a checkpoint: not a checkpoint
    (or a damaged one), not one that holds Python objects to unpickle."""
    path = tmp_path / 'README.md'
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match='not a PyTorch checkpoint') \
            as raised:
        _load(path)
    assert 'arbitrary unpickling' not in str(raised.value)
    # the unpickler's words alone, not PyTorch's advice on weights_only
    assert '\n' not in str(raised.value)
    assert 'weights_only' not in str(raised.value)


def test_missing_file_and_missing_checkpoint_key(timm_nano, tmp_path):
    with pytest.raises(FileNotFoundError, match='nowhere.pth'):
        _load(tmp_path / 'nowhere.pth')
    path = tmp_path / 'dino.pth'
    FORMATS['dino.pth'](timm_nano.state_dict(), path)
    with pytest.raises(CheckpointError, match="checkpoint_key 'ema'"):
        extract_state_dict(torch.load(path, weights_only=False), 'ema')
