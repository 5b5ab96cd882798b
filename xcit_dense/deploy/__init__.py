"""Deployment: the graphs that are exported (:mod:`.graphs`) and their
export to ONNX, verified against PyTorch with onnxruntime
(:mod:`.onnx_export`)."""
from ..errors import ExportError
from .graphs import FeatureGraph, SegmentorGraph, graph_for
from .onnx_export import (
    check_requirements,
    export_onnx,
    onnxruntime_session,
    random_input,
    verify_onnx,
)

__all__ = ['ExportError', 'check_requirements', 'FeatureGraph',
           'SegmentorGraph', 'export_onnx', 'graph_for', 'onnxruntime_session',
           'random_input', 'verify_onnx']
