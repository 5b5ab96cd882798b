"""xcit-dense: the XCiT backbone for dense prediction on OpenMMLab 2.x."""
from .startup import collections_paused

with collections_paused():  # torch, timm and mmengine come in here
    from .safe_globals import register_mmengine_safe_globals

    register_mmengine_safe_globals()

    from . import training  # noqa: F401  (loops, atomic file backend)
    from .checkpoint import load_backbone_checkpoint
    from .errors import (
        CheckpointError,
        DataError,
        ExportError,
        UserError,
        XCiTDenseError,
    )
    from .hooks import CheckpointImportHook, PreemptionHook
    from .inference import init_model
    from .models import ARCH_SETTINGS, XCiT, fast_path, set_fast_path
    from .optim import NoDecayOptimWrapperConstructor
    from .precision import AutocastPartsHook, Float32PartsHook

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
