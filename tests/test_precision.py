"""AutocastPartsHook (xcit_dense/precision.py): the named parts of a model
run in bf16 in validation and testing, everything between them and their
outputs in fp32; training untouched; tools/test.py with the hook in a
config."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from xcit_dense import AutocastPartsHook, UserError

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
