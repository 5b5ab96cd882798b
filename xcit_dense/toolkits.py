"""The toolkit a config belongs to (its ``default_scope``: mmdet or mmseg),
made ready as that toolkit's own tools make it ready before they build
anything from a config."""
import importlib
from types import ModuleType

from .errors import UserError

TOOLKITS = ('mmdet', 'mmseg')


def type_name(part) -> str:
    """The registered name a config part's ``type`` gives, without its
    scope: ``'mmengine.OptimWrapper'`` and ``'OptimWrapper'`` are both
    ``'OptimWrapper'``; a class given as the type, its name; empty for a
    part without a type."""
    kind = part.get('type', '') if part else ''
    return getattr(kind, '__name__', str(kind)).split('.')[-1]


def check_toolkit(scope: str) -> str:
    """``scope`` when it is one of :data:`TOOLKITS`; a :class:`UserError`
    paragraph otherwise."""
    if scope not in TOOLKITS:
        raise UserError(f'The config has default_scope={scope!r}; tools of '
                        'this project take mmdet or mmseg configs.')
    return scope


def use_toolkit(scope: str) -> ModuleType:
    """Register every module of ``scope`` (its ``utils.register_all_modules``),
    make it mmengine's default scope and return its ``registry`` module
    (``MODELS``, ``DATASETS``, ``VISUALIZERS`` ...)."""
    check_toolkit(scope)
    from mmengine.registry import init_default_scope
    importlib.import_module(f'{scope}.utils').register_all_modules(
        init_default_scope=False)
    init_default_scope(scope)
    return importlib.import_module(f'{scope}.registry')
