"""Everything the package knows about checkpoint files and their layouts.

* :mod:`.files`: reading local files and http(s) URLs (downloaded once into
  torch's hub cache) without arbitrary unpickling;
* :mod:`.backbone`: importing image-classification checkpoints (official,
  timm, DINO) and our own into the XCiT backbone, strictly.
"""
from ..errors import CheckpointError
from .backbone import (
    CLASSIFICATION_ONLY,
    backbone_weights,
    convert_state_dict,
    extract_state_dict,
    infer_settings,
    load_backbone_checkpoint,
    match_state_dict,
)
from .files import cached_path, is_url, local_checkpoint, read_checkpoint

__all__ = [
    'CLASSIFICATION_ONLY', 'CheckpointError', 'backbone_weights',
    'cached_path',
    'convert_state_dict', 'extract_state_dict', 'infer_settings', 'is_url',
    'load_backbone_checkpoint', 'local_checkpoint', 'match_state_dict',
    'read_checkpoint'
]
