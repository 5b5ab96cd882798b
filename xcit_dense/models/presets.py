"""XCiT presets and the checks of the backbone's arguments."""
import inspect
import numbers
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

# name: (embed_dim, depth, num_heads, eta), as in timm's ``xcit_<name>_p*``
# entry points and the XCiT paper (Table 1).
_SIZES: Dict[str, Tuple[int, int, int, float]] = {
    'nano_12': (128, 12, 4, 1.0),
    'tiny_12': (192, 12, 4, 1.0),
    'small_12': (384, 12, 8, 1.0),
    'tiny_24': (192, 24, 4, 1e-5),
    'small_24': (384, 24, 8, 1e-5),
    'medium_24': (512, 24, 8, 1e-5),
    'large_24': (768, 24, 16, 1e-5),
}
PATCH_SIZES = (8, 16)
ARCH_SETTINGS: Dict[str, dict] = {
    f'{name}_p{patch}': dict(
        patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads,
        eta=eta)
    for name, (dim, depth, heads, eta) in _SIZES.items()
    for patch in (16, 8)
}
DEFAULT_ARCH = 'small_12_p16'
#: Strides of the four pyramid levels.
OUT_STRIDES: Tuple[int, ...] = (4, 8, 16, 32)
#: Layouts of the levels' sizes (``out_sizes``; see :mod:`.pyramid`).
OUT_SIZES = ('published', 'ceil')
# Blocks tapped for the four pyramid levels (published detection configs).
DEFAULT_OUT_INDICES = {12: (3, 5, 7, 11), 24: (7, 11, 15, 23)}
AUTOCAST_DTYPES = (None, 'bfloat16', 'float16')


def preset_widths() -> str:
    """The presets' widths (embed_dim), for messages: 'nano 128, tiny
    192, ...'."""
    widths = {name.split('_')[0]: dim for name, (dim, *_) in _SIZES.items()}
    return ', '.join(f'{name} {dim}' for name, dim in widths.items())


def resolve_arch(arch: Optional[str], **overrides) -> dict:
    """Preset settings with the explicit (non-None) overrides applied."""
    if arch is None:
        settings = {}
    elif isinstance(arch, str) and arch in ARCH_SETTINGS:
        settings = dict(ARCH_SETTINGS[arch])
    else:
        raise ValueError(
            f'Unknown XCiT arch {arch!r}; allowed: '
            f'{", ".join(ARCH_SETTINGS)} (or None with explicit '
            'patch_size, embed_dim, depth, num_heads)')
    settings.update({k: v for k, v in overrides.items() if v is not None})
    settings.setdefault('eta', 1.0 if settings.get('depth', 0) <= 12
                        else 1e-5)
    missing = [k for k in ('patch_size', 'embed_dim', 'depth', 'num_heads')
               if k not in settings]
    if missing:
        raise ValueError(f'arch=None needs explicit {", ".join(missing)}')
    if settings['patch_size'] not in PATCH_SIZES:
        raise ValueError(
            f'patch_size must be one of {PATCH_SIZES} (the convolutional '
            f'stem of XCiT), got {settings["patch_size"]!r}')
    for key in ('embed_dim', 'depth', 'num_heads'):
        if not is_int(settings[key]) or settings[key] < 1:
            raise ValueError(f'{key} must be a positive int, got '
                             f'{settings[key]!r}')
        settings[key] = int(settings[key])
    if not is_number(settings['eta']) or not settings['eta'] > 0:
        raise ValueError(
            f"eta must be a number > 0 (the layer scales' initial value: "
            f'1.0 up to depth 12, 1e-5 deeper), got {settings["eta"]!r}')
    if settings['embed_dim'] % settings['num_heads']:
        raise ValueError(
            f'embed_dim ({settings["embed_dim"]}) must be divisible by '
            f'num_heads ({settings["num_heads"]})')
    return settings


def check_outputs(out_indices: Optional[Sequence[int]],
                  out_levels: Sequence[int], out_sizes: str,
                  depth: int) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """The tapped block indices (defaulted for ``depth``) and the levels
    returned, validated with the levels' sizes."""
    check_out_sizes(out_sizes)
    return check_out_indices(out_indices, depth), check_out_levels(
        out_levels)


def check_out_indices(out_indices: Optional[Sequence[int]],
                      depth: int) -> Tuple[int, ...]:
    """Validate (or default) the four tapped block indices."""
    if out_indices is None:
        out_indices = DEFAULT_OUT_INDICES.get(depth) or tuple(
            # the same relative positions as the published depth-12 taps
            round((i + 1) * depth / 12) - 1 for i in (3, 5, 7, 11))
    n = len(OUT_STRIDES)
    indices = _increasing_ints(out_indices, depth)
    if indices is None or len(indices) != n:
        raise ValueError(
            f'out_indices must be {n} strictly increasing block indices '
            f'in [0, {depth - 1}] (depth {depth}), one per pyramid level '
            f'of strides {OUT_STRIDES}; got {out_indices!r}')
    return indices


def check_out_levels(out_levels: Sequence[int]) -> Tuple[int, ...]:
    """Validate the pyramid levels returned (indices into
    :data:`OUT_STRIDES`)."""
    n = len(OUT_STRIDES)
    levels = _increasing_ints(out_levels, n)
    if not levels:
        raise ValueError(
            f'out_levels must be strictly increasing pyramid levels in '
            f'[0, {n - 1}] (strides {OUT_STRIDES}: (1, 2, 3) for strides '
            f'8, 16, 32), got {out_levels!r}')
    return levels


def check_out_sizes(out_sizes: str) -> None:
    """Validate the layout of the levels' sizes."""
    if not isinstance(out_sizes, str) or out_sizes not in OUT_SIZES:
        raise ValueError(
            f"out_sizes must be 'published' (the levels' sizes of the "
            f"published backbone: the token grid up-sampled, or max-pooled "
            f"rounding down, uncropped) or 'ceil' (ours: exactly "
            f"ceil(H / s) x ceil(W / s) at stride s); got {out_sizes!r}")


def _increasing_ints(value, end: int) -> Optional[Tuple[int, ...]]:
    """``value`` (a sequence, or one int) as a tuple of strictly
    increasing ints in ``[0, end)``; None where it is not one."""
    items = tuple(value) if hasattr(value, '__iter__') and \
        not isinstance(value, (str, bytes)) else (value, )
    if not all(is_int(i) and 0 <= i < end for i in items) or \
            any(a >= b for a, b in zip(items, items[1:])):
        return None
    return tuple(int(i) for i in items)


def check_training_args(frozen_stages: int, last_block: int,
                        compile_cfg: Union[bool, str, dict, None],
                        autocast_dtype: Optional[str],
                        init_cfg: Union[dict, Sequence[dict], None],
                        cuda_graphs: Union[bool, str] = False,
                        drop_path_rate: float = 0.) -> None:
    """The remaining arguments of :class:`~xcit_dense.XCiT` (the dropout
    rates: :func:`check_layer_args`)."""
    if not is_number(drop_path_rate) or not 0 <= drop_path_rate <= 1:
        raise ValueError(
            f'drop_path_rate must be in [0, 1] (the probability that a '
            f"block's residual branches are dropped for a sample, the same "
            f'in every block), got {drop_path_rate!r}')
    if not is_int(frozen_stages) or \
            not -1 <= frozen_stages <= last_block + 1:
        raise ValueError(
            f'frozen_stages must be an int in [-1, {last_block + 1}] (-1: '
            f'none, 0: stem, k: stem and the first k blocks), got '
            f'{frozen_stages!r}')
    if compile_cfg is not None and compile_cfg != 'auto' and \
            not isinstance(compile_cfg, (bool, dict)):
        raise ValueError(
            f"compile_cfg must be None, a bool, 'auto' (compiled where the "
            f'fast-path policy lists the device: none today) or a dict of '
            f'torch.compile arguments, got {compile_cfg!r}')
    if isinstance(compile_cfg, dict):
        check_compile_cfg(compile_cfg)
    if autocast_dtype not in AUTOCAST_DTYPES:
        raise ValueError(
            f'autocast_dtype must be one of {AUTOCAST_DTYPES}, got '
            f'{autocast_dtype!r}')
    if not isinstance(cuda_graphs, bool) and \
            cuda_graphs not in ('train', 'auto'):
        raise ValueError(f"cuda_graphs must be True (inference on CUDA "
                         f"replayed from CUDA graphs), 'train' (training "
                         f"steps too), 'auto' (where the policy says they "
                         f"pay, for inputs that recur) or False, got "
                         f"{cuda_graphs!r}")
    check_init_cfg(init_cfg)


def is_int(value) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and \
        not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number (numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_layer_args(in_channels: int, mlp_ratio: float, qkv_bias: bool,
                     use_pos_embed: bool, drop_rate: float,
                     attn_drop_rate: float, norm_eval: bool,
                     with_cp: bool) -> None:
    """The arguments of :class:`~xcit_dense.XCiT` that its layers take:
    the input's channels, the MLP's width ratio, the switches and the
    dropout rates."""
    if not is_int(in_channels) or in_channels < 1:
        raise ValueError(
            f'in_channels must be a positive int (the channels of the '
            f'images: 3 for RGB; a 3-channel checkpoint loads into other '
            f'counts too), got {in_channels!r}')
    if not is_number(mlp_ratio) or not mlp_ratio > 0:
        raise ValueError(
            f"mlp_ratio must be a number > 0 (the MLP's hidden width per "
            f'channel: 4 in every preset), got {mlp_ratio!r}')
    for name, value in (('qkv_bias', qkv_bias),
                        ('use_pos_embed', use_pos_embed),
                        ('norm_eval', norm_eval), ('with_cp', with_cp)):
        if not isinstance(value, bool):
            raise ValueError(f'{name} must be True or False, got {value!r}')
    for name, value in (('drop_rate', drop_rate),
                        ('attn_drop_rate', attn_drop_rate)):
        if not is_number(value) or not 0 <= value <= 1:
            raise ValueError(f'{name} must be a probability in [0, 1], got '
                             f'{value!r}')


def check_norm_cfg(norm_cfg: dict) -> None:
    """``norm_cfg`` is an mmcv norm config: a dict with a ``type`` (what
    the type builds is checked where each norm is built:
    :func:`.norms.norm_layer`)."""
    if not isinstance(norm_cfg, dict) or 'type' not in norm_cfg:
        raise ValueError(
            f"norm_cfg must be a dict with a 'type', as mmcv's "
            f"build_norm_layer takes it (dict(type='BN'), the published "
            f"models'; 'SyncBN', 'GN' with num_groups, 'IN'), got "
            f'{norm_cfg!r}')


#: the arguments of this PyTorch's ``torch.compile`` besides the model
COMPILE_ARGUMENTS = tuple(name for name in inspect.signature(
    torch.compile).parameters if name != 'model')


def check_compile_cfg(compile_cfg: dict) -> None:
    """A dict ``compile_cfg`` names only ``torch.compile``'s arguments (a
    misspelt one would fail every forward)."""
    unknown = sorted(set(compile_cfg) - set(COMPILE_ARGUMENTS))
    if unknown:
        raise ValueError(
            f"compile_cfg takes torch.compile's arguments "
            f"({', '.join(COMPILE_ARGUMENTS)}); got "
            f"{', '.join(map(repr, unknown))}")


#: what an ``init_cfg`` of type ``'Pretrained'`` takes: mmengine's arguments
#: (``checkpoint``, ``prefix``, ``map_location``) and, for DINO files,
#: ``checkpoint_key``
PRETRAINED_KEYS = ('type', 'checkpoint', 'prefix', 'map_location',
                   'checkpoint_key')


def init_cfgs(init_cfg: Union[dict, Sequence[dict], None]) -> List[dict]:
    """``init_cfg`` as a list, as mmengine's modules take it (None, one
    dict or a list of them)."""
    if init_cfg is None:
        return []
    return list(init_cfg) if isinstance(init_cfg, (list, tuple)) \
        else [init_cfg]


def pretrained_as_init_cfg(pretrained: Optional[str], init_cfg):
    """``init_cfg`` of the deprecated ``pretrained`` argument, as mmdet's and
    mmseg's backbones take it (a warning; not both)."""
    if pretrained is None:
        return init_cfg
    if not isinstance(pretrained, str):
        raise TypeError(f'pretrained must be a checkpoint path or URL (str) '
                        f'or None, got {pretrained!r}')
    if init_cfg is not None:
        raise ValueError(
            f'init_cfg and pretrained={pretrained!r} cannot be set at the '
            'same time; pretrained is deprecated: give '
            'init_cfg=dict(type=\'Pretrained\', checkpoint=...) alone (an '
            'mmseg model passes its model-level pretrained to the backbone: '
            'set model.pretrained=None)')
    warnings.warn('XCiT: pretrained is deprecated, give init_cfg=dict('
                  'type=\'Pretrained\', checkpoint=...) instead',
                  DeprecationWarning)
    return dict(type='Pretrained', checkpoint=pretrained)


def split_pretrained(init_cfg) -> Tuple[List[dict], Optional[dict]]:
    """``init_cfg``'s entries other than ``'Pretrained'``, and the arguments
    of :func:`~xcit_dense.checkpoint.load_backbone_checkpoint` that its
    ``'Pretrained'`` entry gives (None without one)."""
    given = init_cfgs(init_cfg)
    others = [c for c in given if c['type'] != 'Pretrained']
    for cfg in given:
        if cfg['type'] == 'Pretrained':
            args = {k: v for k, v in cfg.items() if k != 'type'}
            return others, dict(path=args.pop('checkpoint'), **args)
    return others, None


def check_init_cfg(init_cfg: Union[dict, Sequence[dict], None]) -> None:
    """``init_cfg`` as mmengine takes it (None, a dict with a ``type``, or
    a list of them), with at most one ``'Pretrained'``, which names its
    ``checkpoint`` and takes only :data:`PRETRAINED_KEYS`."""
    if not isinstance(init_cfg, (dict, list, tuple, type(None))) or not all(
            isinstance(c, dict) and 'type' in c for c in init_cfgs(init_cfg)):
        raise ValueError(
            f"init_cfg must be None, a dict with a 'type' (one of "
            f"mmengine's initialisers: 'Pretrained', 'TruncNormal', "
            f"'Constant', ...) or a list of such dicts, got {init_cfg!r}")
    pretrained = [c for c in init_cfgs(init_cfg)
                  if c['type'] == 'Pretrained']
    if len(pretrained) > 1:
        raise ValueError(
            f"init_cfg has {len(pretrained)} entries of type 'Pretrained'; "
            f'one checkpoint initialises the backbone')
    for cfg in pretrained:
        unknown = sorted(set(cfg) - set(PRETRAINED_KEYS))
        if unknown:
            raise ValueError(
                f"init_cfg of type 'Pretrained' takes checkpoint (a file "
                f"or an http(s) URL), prefix (only the weights under it, "
                f"as mmengine's: 'backbone.' of a detector), map_location "
                f"(mmengine's; the weights end in the backbone's "
                f"parameters either way) and checkpoint_key ('teacher' or "
                f"'student' of a DINO file); got {', '.join(unknown)}")
        if not cfg.get('checkpoint'):
            raise ValueError(
                "init_cfg of type 'Pretrained' needs a 'checkpoint': a "
                "file or an http(s) URL")
        if not isinstance(cfg.get('prefix', ''), str):
            raise ValueError(
                f"init_cfg's prefix must be a string such as 'backbone.', "
                f"got {cfg['prefix']!r}")


def normalized_compile_cfg(compile_cfg: Union[bool, str, dict, None]
                           ) -> Union[str, dict, None]:
    """``compile_cfg`` as the backbone keeps it: ``None`` (eager), ``'auto'``
    or a dict of ``torch.compile`` arguments (``{}`` for ``True``)."""
    if compile_cfg is None or compile_cfg is False:
        return None
    if compile_cfg is True:
        return {}
    return compile_cfg if compile_cfg == 'auto' else dict(compile_cfg)
