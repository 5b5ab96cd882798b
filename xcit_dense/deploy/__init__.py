"""Deployment: the graphs that are exported (:mod:`.graphs`), their export
to ONNX verified against PyTorch (:mod:`.onnx_export`), and running an
exported file on onnxruntime or OpenVINO (:mod:`.runtimes`; a whole
segmentor or detector on an image: :mod:`.exported_models`)."""
from ..errors import ExportError
from .detector_graph import DetectorGraph
from .exported_models import (
    ExportedDetector,
    ExportedModel,
    ExportedSegmentor,
    load_exported,
)
from .graphs import FeatureGraph, SegmentorGraph
from .masks import paste_masks
from .onnx_export import (
    check_requirements,
    export_onnx,
    graph_for,
    random_input,
    verify_onnx,
)
from .runtime_model import RuntimeModel
from .runtimes import (
    RUNTIMES,
    onnxruntime_session,
    read_metadata,
    runtime_session,
)

__all__ = ['DetectorGraph', 'ExportError', 'ExportedDetector',
           'ExportedModel', 'ExportedSegmentor', 'FeatureGraph', 'RUNTIMES',
           'RuntimeModel',
           'SegmentorGraph', 'check_requirements', 'export_onnx',
           'graph_for', 'load_exported', 'onnxruntime_session',
           'paste_masks', 'random_input', 'read_metadata', 'runtime_session',
           'verify_onnx']
