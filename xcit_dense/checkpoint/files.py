"""Reading checkpoint files, local or at an http(s) URL, without arbitrary
unpickling.

URLs are downloaded once, with a progress bar, into the cache mmdet, mmseg and
mmengine use for URL checkpoints (``torch.hub.get_dir()/checkpoints``, i.e.
``$TORCH_HOME/hub/checkpoints``, named after the URL's file name) and then
read like any local file. mmengine would read a URL with
``torch.load(weights_only=False)``; the tools therefore hand mmengine the
cached file instead of the URL (:func:`local_checkpoint`).
"""
import argparse
import os
import os.path as osp
import pickle
from typing import Mapping
from urllib.error import URLError
from urllib.parse import urlparse

import torch

from ..errors import CheckpointError

# Types besides tensors found in official and DINO training checkpoints
# (their 'args' entry); safe to rebuild, so allowed while reading.
_CHECKPOINT_SAFE_GLOBALS = [argparse.Namespace]


def is_url(path) -> bool:
    return isinstance(path, str) and path.startswith(('http://', 'https://'))


def cached_path(url: str) -> str:
    """Where :func:`local_checkpoint` keeps the download of ``url``."""
    name = osp.basename(urlparse(url).path)
    if not name:
        raise CheckpointError(f'The checkpoint URL {url} names no file.')
    return osp.join(torch.hub.get_dir(), 'checkpoints', name)


def local_checkpoint(path: str, progress: bool = True) -> str:
    """The local file for ``path``: itself, or for an http(s) URL the cached
    download (fetched once; a download is written to a temporary file and
    moved into place, so an interrupted one leaves nothing behind)."""
    if not is_url(path):
        return path
    target = cached_path(path)
    if osp.isfile(target):
        return target
    os.makedirs(osp.dirname(target), exist_ok=True)
    print(f'Downloading {path} to {target}', flush=True)
    try:
        torch.hub.download_url_to_file(path, target, progress=progress)
    except (URLError, OSError, ValueError) as e:
        raise CheckpointError(
            f'Cannot download the checkpoint {path}: {e}. Check the URL and '
            'the network, or download the file yourself and pass its local '
            'path.') from e
    return target


#: what ``torch.load(weights_only=True)``'s unpickler says of a pickle that
#: names Python objects beyond tensors and containers (a class, a function
#: to call); anything else it refuses (an unknown opcode: a text file, say)
#: is no pickle of a checkpoint at all, or a damaged one
_PYTHON_OBJECTS = ('GLOBAL', 'add_safe_globals', 'Trying to call reduce',
                   'must be imported to load')


def _holds_python_objects(error: pickle.UnpicklingError) -> bool:
    """Whether ``torch.load(weights_only=True)`` refused a file for the
    Python objects its pickle names (which ``weights_only=False`` would
    build), not for being no checkpoint."""
    return any(sign in str(error) for sign in _PYTHON_OBJECTS)


def _unpickler_detail(error: pickle.UnpicklingError) -> str:
    """What the unpickler itself refused, its first sentence (PyTorch wraps
    it in a page of advice on ``weights_only``)."""
    _, found, after = str(error).partition('WeightsUnpickler error:')
    lines = [line.strip() for line in (after if found else str(error)
                                       ).splitlines()]
    detail = next((line for line in lines if line), type(error).__name__)
    return detail.split('. ')[0]


def _is_onnx(path: str) -> bool:
    """Whether ``path`` is an ONNX model (an exported network: a protobuf
    ``ModelProto``, whose first field is its IR version), not a
    checkpoint."""
    with open(path, 'rb') as f:
        if f.read(1) != b'\x08':
            return False
    try:
        import onnx
        model = onnx.load(path, load_external_data=False)
    except Exception:  # no onnx here, or bytes that only began like one
        return path.endswith('.onnx')
    return model.ir_version > 0 and len(model.graph.node) > 0


def _not_a_checkpoint(path: str, detail: str) -> CheckpointError:
    """The error for a file torch.load cannot read: an ONNX model named
    as such, anything else as no checkpoint (``detail``: what failed)."""
    if _is_onnx(path):
        return CheckpointError(
            f'{path} is an ONNX file (an exported model, e.g. by '
            'tools/export_onnx.py), not a checkpoint: it holds the network '
            'for a runtime, not weights to load. Give the .pth checkpoint '
            'it was exported from (tools/demo.py and tools/test.py run the '
            '.onnx file itself).')
    return CheckpointError(f'Cannot read {path}: {detail}')


def read_checkpoint(path: str) -> Mapping:
    """Read a checkpoint file (or URL, see :func:`local_checkpoint`) without
    arbitrary unpickling.

    ``.safetensors`` files are read with safetensors; anything else with
    ``torch.load(weights_only=True)`` on the CPU.
    """
    path = local_checkpoint(path)
    if not osp.isfile(path):
        raise FileNotFoundError(f'Checkpoint file not found: {path}')
    if path.endswith('.safetensors'):
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(path, device='cpu')
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(
                f'Cannot read {path} as safetensors (truncated or not a '
                f'safetensors file): {e}') from e
    try:
        with torch.serialization.safe_globals(_CHECKPOINT_SAFE_GLOBALS):
            return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        if _holds_python_objects(e):
            raise CheckpointError(
                f'{path} stores Python objects that need arbitrary '
                'unpickling (torch.load(weights_only=False)), which '
                'xcit-dense refuses because it can run code from the file. '
                'If you trust the file, re-save only its tensors, e.g. '
                "torch.save(torch.load(path, weights_only=False)['model'], "
                f'new_path). The unpickler: {_unpickler_detail(e)}.') from e
        raise _not_a_checkpoint(
            path, f'not a PyTorch checkpoint or truncated (the unpickler: '
            f'{_unpickler_detail(e)})') from e
    except Exception as e:
        # a file of any bytes: the legacy format's unpickler fails as they
        # lead it (a memo KeyError for "hi\n"), or RuntimeError, EOFError,
        # BadZipFile, OSError
        raise _not_a_checkpoint(
            path, f'the file is truncated or not a PyTorch checkpoint '
            f'({type(e).__name__}: {e})') from e
