"""Deployment: the graphs that are exported (:mod:`.graphs`), their export
to ONNX verified against PyTorch (:mod:`.onnx_export`), and running an
exported file on onnxruntime or OpenVINO (:mod:`.runtimes`; a whole
segmentor on an image: :mod:`.exported_segmentor`)."""
from ..errors import ExportError
from .exported_segmentor import ExportedSegmentor
from .graphs import FeatureGraph, SegmentorGraph, graph_for
from .onnx_export import (
    check_requirements,
    export_onnx,
    random_input,
    verify_onnx,
)
from .runtimes import (
    RUNTIMES,
    onnxruntime_session,
    read_metadata,
    runtime_session,
)

__all__ = ['ExportError', 'ExportedSegmentor', 'FeatureGraph', 'RUNTIMES',
           'SegmentorGraph', 'check_requirements', 'export_onnx',
           'graph_for', 'onnxruntime_session', 'random_input',
           'read_metadata', 'runtime_session', 'verify_onnx']
