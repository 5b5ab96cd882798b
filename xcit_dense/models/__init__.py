from .backbone import XCiT
from .policy import fast_path, set_fast_path
from .presets import ARCH_SETTINGS

__all__ = ['ARCH_SETTINGS', 'XCiT', 'fast_path', 'set_fast_path']
