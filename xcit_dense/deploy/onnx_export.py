"""Export a graph (:mod:`.graphs`, :mod:`.detector_graph`; chosen by
:func:`graph_for`) to ONNX and verify it with onnxruntime.

The export traces the straightforward computation of every module: it runs
inside ``fast_path(False)``, the switch the tests use, because the fast
paths call oneDNN operators that ONNX does not have. Nothing is written
under the requested name until onnxruntime has reproduced PyTorch's outputs
on every checked size.
"""
from contextlib import nullcontext
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from ..atomic_files import move_into_place, unverified_file
from ..errors import ExportError, UserError, first_line
from ..models.policy import fast_path
from .adaptive_pooling import DECOMPOSITIONS, AnySizePooling
from .detection_check import verify_detections
from .detector_graph import DetectorGraph
from .graphs import (
    FeatureGraph,
    SegmentorGraph,
    pools_to_cells,
    sizes_from_python,
)
from .runtimes import onnxruntime_session

#: largest difference allowed, relative to the largest value of the output
TOLERANCE = 1e-4
INPUT_NAME = 'input'
MIN_SIZE, MAX_SIZE = 32, 8192
#: the least opset PyTorch's ONNX exporter (dynamo) writes these graphs in
MIN_OPSET = 18


def check_requirements() -> None:
    """Exporting needs onnx, onnxscript (torch's exporter) and onnxruntime
    (the verification): the ``deploy`` extra."""
    import importlib
    for name in ('onnx', 'onnxscript', 'onnxruntime'):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise UserError(
                f'Exporting to ONNX needs {name}, which is not installed '
                f'({e}). Install the deploy extra: pip install -e ".[deploy]" '
                '(make install does).')


def verification_sizes(height: int, width: int, dynamic: bool
                       ) -> List[Tuple[int, int]]:
    """The export size and, for a graph with free height and width, an odd
    size (not a multiple of any stride) about 3/4 as large and a multiple of
    32 about half as large."""
    sizes = [(height, width)]
    if dynamic:
        sizes.append((max(MIN_SIZE + 1, height * 3 // 4) | 1,
                      max(MIN_SIZE + 1, width * 3 // 4) | 1))
        sizes.append((max(MIN_SIZE, height // 64 * 32),
                      max(MIN_SIZE, width // 64 * 32)))
    return list(dict.fromkeys(sizes))


def example_input(graph: nn.Module, batch: int, height: int, width: int,
                  seed: int = 0) -> torch.Tensor:
    """A deterministic input for ``graph``: pixel values (integers 0-255)
    for a graph that takes images, else normalised values (standard
    normal)."""
    return random_input(batch, graph.in_channels, height, width,
                        getattr(graph, 'takes_images', False), seed)


def graph_for(model: nn.Module, scope: str, backbone_only: bool = False,
              backbone_and_neck: bool = False) -> nn.Module:
    """The graph to export for a model built from an mmdet (``scope``
    ``'mmdet'``) or mmseg config: the backbone (``backbone_only``), a
    detector's backbone and neck (``backbone_and_neck``), else the whole
    segmentor or detector."""
    if backbone_only:
        return FeatureGraph(model, with_neck=False)
    if backbone_and_neck:
        return FeatureGraph(model, with_neck=getattr(model, 'with_neck',
                                                     False))
    if scope == 'mmseg':
        return SegmentorGraph(model)
    return DetectorGraph(model)


def random_input(batch: int, channels: int, height: int, width: int,
                 images: bool, seed: int = 0) -> torch.Tensor:
    """The input an export is verified with first (seeded): pixel values
    in [0, 255] for ``images`` (whole segmentors), else standard-normal
    values."""
    gen = torch.Generator().manual_seed(seed)
    if images:
        return torch.randint(0, 256, (batch, channels, height, width),
                             generator=gen).float()
    return torch.randn(batch, channels, height, width, generator=gen)


def check_detector_batch(batch: int) -> None:
    """A whole detector is exported for ``batch`` 1 only; one paragraph
    otherwise."""
    if batch != 1:
        raise UserError(f'A whole detector is exported for one image at a '
                        f'time (its number of detections varies per image); '
                        f'got batch {batch}. Run the file once per image, or '
                        'export the backbone and neck for batches.')


def export_onnx(graph: nn.Module, path: str, batch: int, height: int,
                width: int, dynamic: bool = False, opset: int = 18,
                log=print, images: Sequence[torch.Tensor] = ()
                ) -> List[Dict]:
    """Export ``graph`` for ``batch`` images of ``height x width`` (any
    height and width when ``dynamic``) to ``path``, verify it (see
    :func:`verify_onnx`; a whole detector also on ``images``) and only
    then move it into place. Returns the verification rows; raises
    :class:`ExportError` (and leaves no file) when the export fails or does
    not reproduce PyTorch."""
    graph.eval()
    if isinstance(graph, DetectorGraph):
        check_detector_batch(batch)
    with unverified_file(path, '.onnx') as partial:
        _export(graph, partial, example_input(graph, batch, height, width),
                dynamic, opset)
        log(f'exported {type(graph).__name__} (opset {opset}, '
            + ('dynamic height and width' if dynamic else
               f'{batch}x{graph.in_channels}x{height}x{width}') + ')')
        rows = verify_onnx(partial, graph, batch,
                           verification_sizes(height, width, dynamic), log,
                           images)
        move_into_place(partial, path)
        return rows


def _export(graph: nn.Module, path: str, example: torch.Tensor,
            dynamic: bool, opset: int) -> None:
    """``torch.export``, then ONNX with the graph's ``metadata()`` in the
    file's ``metadata_props``. Non-strict (Python runs, the tensor
    operations are recorded) except, with free height and width, for graphs
    that compute sizes as Python numbers (:func:`sizes_from_python`): dynamo
    keeps those symbolic. With free height and width, adaptive pooling to
    cells is computed for the actual size (:mod:`.adaptive_pooling`)."""
    shapes = None
    if dynamic:
        free = torch.export.Dim.DYNAMIC
        shapes = ({2: free(min=MIN_SIZE, max=MAX_SIZE),
                   3: free(min=MIN_SIZE, max=MAX_SIZE)}, )
    strict = dynamic and sizes_from_python(graph)
    pools = dynamic and pools_to_cells(graph)
    with fast_path(False), torch.no_grad():
        try:
            # traced with Python running, the pooling is replaced as it is
            # called; dynamo's graph is decomposed afterwards
            with AnySizePooling() if pools and not strict else nullcontext():
                program = torch.export.export(graph, (example, ),
                                              dynamic_shapes=shapes,
                                              strict=strict)
            if pools and strict:
                program = program.run_decompositions(DECOMPOSITIONS)
        except Exception as e:  # the exporter's errors have many types
            raise ExportError(f'torch.export cannot trace '
                              f'{type(graph).__name__}: {first_line(e)}'
                              ) from e
        try:
            onnx_program = torch.onnx.export(
                program, (example, ), input_names=[INPUT_NAME],
                output_names=list(graph.output_names), opset_version=opset,
                dynamo=True, verbose=False)
            # what the file records of its graph, written with it
            onnx_program.model.metadata_props.update(graph.metadata())
            written = onnx_program.model.opset_imports.get('')
            onnx_program.save(path, external_data=False)
        except Exception as e:
            raise ExportError(f'torch.onnx.export cannot translate '
                              f'{type(graph).__name__} to ONNX: '
                              f'{first_line(e)}') from e
    if written != opset:  # the exporter converts where it can, else not
        raise ExportError(f'Opset {opset} was asked for and PyTorch\'s '
                          f'exporter wrote opset {written} (it could not '
                          f'convert the graph); give --opset {written}.')


def verify_onnx(path: str, graph: nn.Module, batch: int,
                sizes: Sequence[Tuple[int, int]], log=print,
                images: Sequence[torch.Tensor] = ()) -> List[Dict]:
    """Run the ONNX file with onnxruntime and ``graph`` with PyTorch (the
    straightforward path, what was exported) on the same input at each size;
    every output must have PyTorch's shape and dtype and differ by at most
    :data:`TOLERANCE` of its largest value. Integer outputs (labels) must be
    equal except where PyTorch's two best logits are within that tolerance
    of each other. A whole detector is checked against mmdet's ``predict``
    (see :mod:`.detection_check`) on the input of each size and on
    ``images`` (pixel values ``(1, 3, H, W)``: a dataset's, or more
    synthetic ones). Returns one row per check and output."""
    try:
        session = onnxruntime_session(path)
    except Exception as e:  # an opset or operator it does not run
        raise ExportError(f'onnxruntime cannot load the exported file: '
                          f'{first_line(e)}') from e
    if isinstance(graph, DetectorGraph):
        checks = [example_input(graph, batch, height, width,
                                seed=height * width)
                  for height, width in sizes] + list(images)
        return verify_detections(session, graph, checks, log)
    names = [o.name for o in session.get_outputs()]
    rows = []
    for height, width in sizes:
        x = example_input(graph, batch, height, width, seed=height * width)
        with fast_path(False), torch.no_grad():
            refs = graph(x)
        outs = session.run(None, {INPUT_NAME: x.numpy()})
        logits = None
        for name, ref, out in zip(names, refs, outs):
            ref = ref.numpy()
            if np.issubdtype(ref.dtype, np.floating):
                logits = ref
            row, ok, message = _compare_output(name, (height, width), ref,
                                               out, logits)
            rows.append(row)
            log(f'  onnxruntime vs PyTorch at {height}x{width}, {name} '
                f'{tuple(ref.shape)}: {message}')
            if not ok:
                hint = '' if (height, width) == tuple(sizes[0]) else (
                    f' It matched at {sizes[0][0]}x{sizes[0][1]}: a module '
                    'computes with the input size as a Python number, which '
                    'the trace fixed at the export size.')
                raise ExportError(
                    f'The exported model is wrong: at {height}x{width} its '
                    f'output {name} differs from PyTorch by {message}; at '
                    f'most {TOLERANCE:g} of the largest value is allowed.'
                    + hint)
    return rows


def _compare_output(name: str, size: Tuple[int, int], ref: np.ndarray,
                    out: np.ndarray, logits: Optional[np.ndarray]
                    ) -> Tuple[Dict, bool, str]:
    """One output of onnxruntime against PyTorch's ``ref``: its row, whether
    it is within :data:`TOLERANCE` (labels: equal but for ties of
    ``logits``), and what the log says of it."""
    height, width = size
    row = dict(size=size, output=name, shape=tuple(ref.shape))
    if out.shape != ref.shape:
        raise ExportError(
            f'The exported model is wrong: at {height}x{width} its '
            f'output {name} has shape {tuple(out.shape)}, PyTorch '
            f'gives {tuple(ref.shape)}.')
    if np.issubdtype(ref.dtype, np.floating):
        scale = float(np.abs(ref).max()) or 1.0
        row['max_abs_diff'] = float(np.abs(out - ref).max())
        row['max_rel_diff'] = row['max_abs_diff'] / scale
        return row, row['max_rel_diff'] <= TOLERANCE, (
            f'{row["max_abs_diff"]:.2e} '
            f'({row["max_rel_diff"]:.2e} of the largest value)')
    row['differing'] = _label_mismatches(out, ref, logits)
    ok = row['differing'] == 0
    return row, ok, ('labels equal' if ok else
                     f'{row["differing"]} labels differ')


def _label_mismatches(out: np.ndarray, ref: np.ndarray,
                      logits: Optional[np.ndarray]) -> int:
    """Labels that differ where PyTorch's choice was not a tie (its best and
    second-best logits further apart than the tolerance)."""
    differ = out != ref
    if logits is None or not differ.any() or logits.shape[1] < 2:
        return int(differ.sum())
    top2 = np.sort(logits, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    tie = margin <= 2 * TOLERANCE * float(np.abs(logits).max())
    return int((differ & ~tie).sum())
