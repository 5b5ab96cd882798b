"""Float32HungarianAssigner (xcit_dense/matching.py): Mask2Former's matcher
with its costs in fp32 under autocast, where mmdet's overflows in fp16 and
stops the run; mmdet's assignments bit for bit without autocast; the
Mask2Former recipes (COCO and ADE20K) match with it."""
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.structures import InstanceData

from conftest import REPO

COSTS = [dict(type='ClassificationCost', weight=2.0),
         dict(type='CrossEntropyLossCost', weight=5.0, use_sigmoid=True),
         dict(type='DiceCost', weight=5.0, pred_act=True, eps=1.0)]


def build(type_, match_costs=COSTS, scope='mmdet'):
    from mmdet.registry import TASK_UTILS

    import xcit_dense  # noqa: F401  (the xcit_dense scope)
    with DefaultScope.overwrite_default_scope(scope):
        return TASK_UTILS.build(dict(type=type_, match_costs=match_costs))


def instances(seed, background=-8.0):
    """100 queries predicting background (mask logits about
    ``background``) over the recipes' 12,544 points, and two objects, one
    over 80 % of them."""
    g = torch.Generator().manual_seed(seed)
    points = 12544
    pred = InstanceData(
        scores=torch.randn(100, 81, generator=g),
        masks=torch.randn(100, points, generator=g) * 2 + background)
    cover = torch.tensor([[0.8], [0.2]])
    gt = InstanceData(labels=torch.tensor([3, 7]), masks=(
        torch.rand(2, points, generator=g) < cover).float())
    return pred, gt


def assigned(result):
    return result.gt_inds.tolist(), result.labels.tolist()


def test_costs_in_fp32_under_fp16_autocast():
    mmdets = build('HungarianAssigner')
    ours = build('xcit_dense.Float32HungarianAssigner')
    pred, gt = instances(0)
    expected = assigned(mmdets.assign(pred, gt))
    with torch.autocast('cpu', dtype=torch.float16):
        # the object's column is infinite in fp16 (about 8 x 10,035 points)
        with pytest.raises(ValueError, match='cost matrix is infeasible'):
            mmdets.assign(pred, gt)
        assert assigned(ours.assign(pred, gt)) == expected
    for seed in range(3):  # without autocast: mmdet's, bit for bit
        pred, gt = instances(seed, background=0.0)
        assert (assigned(ours.assign(pred, gt))
                == assigned(mmdets.assign(pred, gt)))


@pytest.mark.parametrize('path, head, scope', [
    ('coco/mask2former_xcit_s12_p16_lsj_50e_coco.py', None, 'mmdet'),
    ('ade20k/mask2former_xcit_s12_p16_160k_ade20k.py', 'decode_head',
     'mmseg')])
def test_mask2former_recipes_match_in_fp32(path, head, scope):
    """The recipes' matcher, built as their heads build it (mmdet's or
    mmseg's scope), with the recipe's costs and points."""
    from xcit_dense.matching import Float32HungarianAssigner
    model = Config.fromfile(str(REPO / 'configs' / path)).model
    train_cfg = model[head].train_cfg if head else model.train_cfg
    assert train_cfg.num_points == 12544
    assigner = build(train_cfg.assigner.type, train_cfg.assigner.match_costs,
                     scope)
    assert type(assigner) is Float32HungarianAssigner
    assert [type(c).__name__ for c in assigner.match_costs] == [
        'ClassificationCost', 'CrossEntropyLossCost', 'DiceCost']
