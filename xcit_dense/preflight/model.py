"""Pre-flight checks of the model config: the XCiT backbone's arguments (it
is built on the meta device), the channels and maps the neck or heads take
from it, and the modules mmengine's ``efficient_conv_bn_eval`` traces."""
from typing import Iterator, Mapping, Optional, Tuple

import torch.nn as nn

from ..errors import UserError
from ..toolkits import type_name


def check_backbone(cfg) -> Optional[nn.Module]:
    """Validate an XCiT backbone config before anything is built: the
    backbone is constructed on PyTorch's meta device (no memory, no weights
    initialised or loaded, 0.1 to 0.2 s), so every argument meets the
    constructor's own checks, an unknown argument included. Returns that
    meta-device backbone (None for another backbone)."""
    backbone = (cfg.get('model') or {}).get('backbone') or {}
    if type_name(backbone) != 'XCiT':
        return None
    pretrained = cfg.model.get('pretrained')
    if pretrained is not None:
        raise UserError(
            f'model.pretrained={pretrained!r} would initialise the XCiT '
            'backbone (mmseg\'s EncoderDecoder hands it to the backbone; '
            'mmseg\'s ResNet base configs set it). Set model.pretrained='
            'None (--cfg-options model.pretrained=None), and give XCiT\'s '
            'weights, if any, as model.backbone.init_cfg=dict('
            "type='Pretrained', checkpoint=PATH_OR_URL).")
    import torch

    from ..models import XCiT
    arguments = {k: v for k, v in backbone.items()
                 if k != 'type' and not k.startswith('_')}
    try:
        with torch.device('meta'):
            return XCiT(**arguments)
    except (ValueError, TypeError) as e:
        raise UserError(f'Bad backbone in the config (model.backbone): {e}')


def _consumers(model: Mapping) -> Iterator[Tuple[str, Mapping, bool]]:
    """The parts of a model config that take the backbone's maps: (the
    key to set, as ``--cfg-options`` names it, its config, whether it takes
    every map). The neck where there is one (the first of a list: mmdet's),
    else the heads: mmseg's
    decode and auxiliary heads (a map each, or those of ``in_index``),
    mmdet's Mask2Former ``panoptic_head`` (every map)."""
    neck = model.get('neck')
    if neck:
        if isinstance(neck, (list, tuple)):
            yield 'model.neck.0', neck[0], True
        else:
            yield 'model.neck', neck, True
        return
    for key in ('decode_head', 'auxiliary_head', 'panoptic_head'):
        heads = model.get(key)
        listed = isinstance(heads, (list, tuple))
        for i, head in enumerate(heads if listed else [heads]):
            if isinstance(head, Mapping):
                yield (f'model.{key}.{i}' if listed else f'model.{key}',
                       head, key == 'panoptic_head')


def check_channels(cfg, backbone: Optional[nn.Module]) -> None:
    """The neck (or, without one, the heads) must take the XCiT
    ``backbone``'s maps as it gives them: ``embed_dim`` channels each, one
    per ``out_levels`` entry; else the run would end at its first forward
    in a convolution's shape error (a preset changed with
    ``--cfg-options model.backbone.arch=...``, the neck left as it was)."""
    if backbone is None:
        return
    from ..models.presets import preset_widths
    channels, maps = backbone.embed_dim, len(backbone.out_levels)
    strides = ', '.join(map(str, backbone.out_strides))
    for key, part, every in _consumers(cfg.get('model') or {}):
        _check_index(key, part, maps, strides)
        low = part.get('c1_in_channels')  # DeepLabV3+'s low-level map
        if isinstance(low, int) and low != channels:
            raise UserError(
                f'{key}.c1_in_channels is {low}, but the backbone\'s maps '
                f'have {channels} channels (its embed_dim). Set it to '
                f'match, e.g. --cfg-options "{key}.c1_in_channels='
                f'{channels}"')
        given = part.get('in_channels')
        listed = isinstance(given, (list, tuple))
        values = list(given) if listed else [given]
        if not all(isinstance(v, int) for v in values):
            continue
        index = part.get('in_index')
        indexed = isinstance(index, (list, tuple))
        taken = maps if every else (len(index) if indexed else 1)
        # a list of in_channels has one entry per map taken (mmseg asserts
        # as many as in_index names)
        if values == [channels] * len(values) and (
                not listed or len(values) == taken or
                not (every or indexed)):
            continue
        expected = [channels] * taken if listed or taken > 1 else channels
        # a neck built for three levels without a selector of its own
        hint = (' (a neck built for the strides 8, 16, 32 takes them with '
                'model.backbone.out_levels=(1, 2, 3))'
                if every and listed and len(values) < maps else '')
        raise UserError(
            f'{key}.in_channels is {given!r}, but the backbone '
            f'(model.backbone) gives {maps} maps of {channels} channels '
            f'(its embed_dim; the presets\' widths: {preset_widths()}), '
            f'at strides {strides}{hint}. Set it to match, e.g. '
            f'--cfg-options "{key}.in_channels='
            f'{str(expected).replace(" ", "")}"')


def _check_index(key: str, part: Mapping, maps: int, strides: str) -> None:
    """mmseg's ``in_index`` (and DeepLabV3+'s ``c1_in_index``) must name
    maps the backbone gives (else an IndexError at the first forward)."""
    for name in ('in_index', 'c1_in_index'):
        index = part.get(name)
        values = list(index) if isinstance(index, (list, tuple)) else [index]
        if index is None or not all(isinstance(v, int) for v in values):
            continue
        if any(not -maps <= v < maps for v in values):
            raise UserError(
                f'{key}.{name} is {index!r}, but the backbone gives {maps} '
                f'maps (indices 0 to {maps - 1}: strides {strides}).')


def check_traced(cfg, backbone: Optional[nn.Module]) -> None:
    """mmengine's ``efficient_conv_bn_eval = [...]`` traces each module it
    names with ``torch.fx`` when training starts, and the run ends in
    fx's traceback where a module cannot be traced: the XCiT backbone and
    its blocks check their input and choose their computation at run
    time. Each name inside the backbone is traced here, on the meta-device
    ``backbone``, first."""
    names = cfg.get('efficient_conv_bn_eval')
    if backbone is None or not names:
        return
    import torch.fx
    for name in [names] if isinstance(names, str) else names:
        part, _, below = name.partition('.')
        if part != 'backbone':
            continue  # another part's: mmengine's and mmdet's to answer
        try:
            module = backbone.get_submodule(below)
        except AttributeError:
            module, problem = None, 'the backbone has no such module'
        if module is not None:
            try:
                traced = torch.fx.symbolic_trace(module)
                problem = _transposed_then_normalised(traced, name)
            except Exception as e:  # fx's own errors
                problem = (f'mmengine traces it with torch.fx, which cannot '
                           f'({type(e).__name__}: {e}): XCiT and its blocks '
                           f'check their input and choose their computation '
                           f'at run time')
        if problem is None:
            continue
        raise UserError(
            f'efficient_conv_bn_eval names {name!r}, but {problem}. Name '
            f'the stem\'s convolutions and BatchNorms instead, '
            f'efficient_conv_bn_eval=[\'backbone.patch_embed.proj\'], or '
            f'leave the backbone out: in eval mode its stem and pyramid '
            f'fold BatchNorm into their convolutions themselves (off CUDA\'s '
            f'eager path).')


def _transposed_then_normalised(traced, name: str) -> Optional[str]:
    """Where ``traced`` (the module ``name``) has a transposed convolution
    followed by BatchNorm (the pyramid's up-samplers), which mmengine's
    ``efficient_conv_bn_eval`` fuses wrongly (its fused function calls the
    convolution's ``_conv_forward``, which a transposed one does not
    implement: it returns None), the reason; else None."""
    modules = dict(traced.named_modules())
    for node in traced.graph.nodes:
        source = node.args[0] if node.args else None
        if node.op == 'call_module' and isinstance(
                modules[node.target], nn.modules.batchnorm._BatchNorm) and \
                getattr(source, 'op', None) == 'call_module' and \
                isinstance(modules[source.target],
                           nn.modules.conv._ConvTransposeNd):
            return (f'mmengine\'s fusion of a convolution and its BatchNorm '
                    f'computes nothing for the transposed convolution '
                    f'{name}.{source.target} followed by BatchNorm '
                    f'{name}.{node.target} (it calls _conv_forward, which '
                    f'transposed convolutions do not implement), and the '
                    f'first validation would end in a TypeError')
    return None
