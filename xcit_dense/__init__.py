"""xcit-dense: the XCiT backbone for dense prediction on OpenMMLab 2.x."""
from .serialization import register_mmengine_safe_globals

register_mmengine_safe_globals()

from .checkpoint import CheckpointError, load_backbone_checkpoint  # noqa: E402
from .models import ARCH_SETTINGS, XCiT  # noqa: E402
from .optim import NoDecayOptimWrapperConstructor  # noqa: E402

__version__ = '0.1.0'
__all__ = [
    'ARCH_SETTINGS', 'CheckpointError', 'NoDecayOptimWrapperConstructor',
    'XCiT', 'load_backbone_checkpoint', '__version__'
]
