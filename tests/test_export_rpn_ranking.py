"""The exported RPN ranks anchors by their logits, which runtimes compute
exactly, not by ``Sigmoid``, which onnxruntime saturates: a trained demo
detector lost a confident detection that way (xcit_dense/deploy/
detector_graph.py, ``objectness_logits``). Op-level and proposal-level
checks with RPN scores near 0, and a whole detector whose scores tie near
1.0 (one whose RPN scores near 0: tests/test_export_detector.py)."""
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from torchvision.ops import nms

from xcit_dense.deploy import DetectorGraph, export_onnx

from test_export_detector import MASK_RCNN
from test_export_onnx import build

BOXES = torch.tensor([[0., 0., 10., 10.], [0., 0., 10., 11.]])
LOGITS = torch.tensor([-40., -30.])  # box 1 is the better one


class Suppression(nn.Module):
    """NMS of two overlapping boxes ranked by their scores (``sigmoid``)
    and by their logits."""

    def forward(self, boxes, logits):
        return nms(boxes, logits.sigmoid(), 0.7), nms(boxes, logits, 0.7)


def run_exported(module, args, tmp_path):
    path = tmp_path / 'graph.onnx'
    torch.onnx.export(module, args, str(path), dynamo=True,
                      verbose=False).save(str(path))
    session = ort.InferenceSession(str(path),
                                   providers=['CPUExecutionProvider'])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, (a.numpy() for a in args))))


def test_runtime_sigmoid_ties_what_the_logits_keep_apart(tmp_path):
    """The op-level case: onnxruntime's Sigmoid makes both scores 0 and
    NMS keeps the first box; ranked by logit it keeps PyTorch's."""
    with torch.no_grad():
        assert nms(BOXES, LOGITS.sigmoid(), 0.7).tolist() == [1]
    by_sigmoid, by_logit = run_exported(Suppression(), (BOXES, LOGITS),
                                        tmp_path)
    assert by_sigmoid.tolist() == [0]  # what the old graph did
    assert by_logit.tolist() == [1]


class Proposals(nn.Module):
    """The exported detector's RPN proposals alone, verified like any
    other graph (shapes equal, values within 1e-4)."""
    output_names = ['proposals']
    takes_images = True

    def __init__(self, whole: DetectorGraph):
        super().__init__()
        self.whole = whole  # not 'graph': an exported module's attribute
        self.in_channels = whole.in_channels

    def metadata(self):
        return {}

    def exported_parts(self):
        return self.whole.exported_parts()

    def forward(self, image):
        feats = self.whole.model.extract_feat(self.whole.preprocess(image))
        return self.whole.proposals(feats, image.shape[-2:]),


@pytest.fixture
def detector(tmp_path):
    """The tiny Mask R-CNN, random weights."""
    return build(MASK_RCNN, tmp_path, 'mask_rcnn')[1].eval()


def test_proposals_of_a_hopeless_rpn_are_pytorchs(detector, tmp_path):
    """The model-level case: an RPN whose every logit is about -30 (scores
    near 1e-13, which onnxruntime's Sigmoid makes 0): the same proposals
    from the file as from PyTorch. (With free height and width, through
    tools/export_onnx.py: tests/test_export_detector.py, whose RPN scores
    most anchors below 1e-8.)"""
    with torch.no_grad():
        detector.rpn_head.rpn_cls.bias.fill_(-30)
    rows = export_onnx(Proposals(DetectorGraph(detector)),
                       str(tmp_path / 'p.onnx'), 1, 64, 64,
                       log=lambda _: None)
    assert rows[0]['shape'][0] > 200  # at 64x64: enough to suppress


def test_detector_whose_scores_tie_near_one_exports(detector, tmp_path):
    """RoI classifiers so sharp that many detections score within a hair of
    1.0 (ties which mmdet leaves to its sort), through the export's own
    verification against mmdet's predict. The other end, RPN scores near 0
    (the bug's side), is tests/test_export_detector.py's detector, exported
    with free height and width and checked on 7 images: ranked by Sigmoid,
    its export fails that verification."""
    with torch.no_grad():
        detector.rpn_head.rpn_cls.bias.zero_()
        detector.rpn_head.rpn_cls.weight.mul_(5)
        detector.roi_head.bbox_head.fc_cls.weight.mul_(40)
    rows = export_onnx(DetectorGraph(detector), str(tmp_path / 'd.onnx'), 1,
                       64, 64, log=lambda _: None)
    assert rows[0]['detections'] > 0 and rows[0]['matched'] > 0
