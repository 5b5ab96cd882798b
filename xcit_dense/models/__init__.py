from .backbone import XCiT
from .paths import explain_paths
from .policy import fast_path, set_fast_path
from .presets import ARCH_SETTINGS

__all__ = ['ARCH_SETTINGS', 'XCiT', 'explain_paths', 'fast_path',
           'set_fast_path']
