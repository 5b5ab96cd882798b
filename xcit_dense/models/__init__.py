from .xcit import ARCH_SETTINGS, XCiT

__all__ = ['ARCH_SETTINGS', 'XCiT']
