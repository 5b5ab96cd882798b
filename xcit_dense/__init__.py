"""xcit-dense: the XCiT backbone for dense prediction on OpenMMLab 2.x."""
from .safe_globals import register_mmengine_safe_globals

register_mmengine_safe_globals()

from . import training  # noqa: E402,F401  (loops, atomic file backend)
from .checkpoint import load_backbone_checkpoint  # noqa: E402
from .errors import (  # noqa: E402
    CheckpointError,
    DataError,
    ExportError,
    UserError,
    XCiTDenseError,
)
from .hooks import CheckpointImportHook, PreemptionHook  # noqa: E402
from .inference import init_model  # noqa: E402
from .models import ARCH_SETTINGS, XCiT, fast_path, set_fast_path  # noqa: E402
from .optim import NoDecayOptimWrapperConstructor  # noqa: E402
from .precision import AutocastPartsHook, Float32PartsHook  # noqa: E402

__version__ = '0.1.0'
__all__ = [
    'ARCH_SETTINGS', 'AutocastPartsHook', 'CheckpointError',
    'CheckpointImportHook', 'DataError',
    'ExportError', 'Float32PartsHook', 'NoDecayOptimWrapperConstructor',
    'PreemptionHook',
    'UserError', 'XCiT', 'XCiTDenseError', 'fast_path',
    'init_model', 'load_backbone_checkpoint', 'set_fast_path',
    '__version__'
]
