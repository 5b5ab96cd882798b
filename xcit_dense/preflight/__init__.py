"""Pre-flight checks: every input a run reads (data, evaluator files, the
backbone's arguments, checkpoints) is checked before anything is written,
and a problem is one paragraph (:class:`~xcit_dense.errors.UserError`)."""
import copy
import os.path as osp
from typing import Iterator, Mapping, Optional, Tuple

import torch.nn as nn

from .checkpoint import (
    backbone_weights,
    is_url,
    local_checkpoint,
    read_checkpoint,
)
from .checkpoint.published import is_published, refuse_resume
from .checkpoint.resume import checkpoint_to_resume
from .errors import CheckpointError, UserError
from .toolkits import type_name


def _datasets(cfg) -> Iterator[Tuple[str, dict]]:
    """(split, dataset config) of every dataloader, wrappers unwrapped."""
    for split in ('train', 'val', 'test'):
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        stack = [loader.get('dataset')]
        while stack:
            ds = stack.pop()
            if not ds:
                continue
            if 'dataset' in ds:
                stack.append(ds['dataset'])
            elif 'datasets' in ds:
                stack.extend(ds['datasets'])
            else:
                yield split, ds


def check_datasets(cfg, splits) -> None:
    """Every annotation file and image / label directory must exist."""
    for split, ds in _datasets(cfg):
        if split not in splits:
            continue
        root = ds.get('data_root') or ''
        where = (f'the {split} dataset ({ds.get("type")}, data_root='
                 f'{root!r})')
        hint = (f'Generate or download the data, or point the config at it, '
                f'e.g. --cfg-options {split}_dataloader.dataset.data_root='
                '/path/to/data')
        if root and not osp.isdir(root):
            raise UserError(f'The data root of {where} does not exist: '
                            f'{root}. {hint}')
        ann = ds.get('ann_file')
        if ann:
            path = ann if osp.isabs(ann) else osp.join(root, ann)
            # mmseg's ann_file is optional and may name a split list.
            if not osp.isfile(path):
                raise UserError(f'The annotation file of {where} does not '
                                f'exist: {path}. {hint}')
        prefix = ds.get('data_prefix') or {}
        for key, rel in prefix.items():
            path = rel if osp.isabs(rel) else osp.join(root, rel)
            if rel and not osp.isdir(path):
                raise UserError(f'The {key} directory of {where} does not '
                                f'exist: {path}. {hint}')


def check_evaluators(cfg, splits) -> None:
    """Annotation files the evaluators read (mmdet's CocoMetric) must
    exist."""
    for split in splits:
        evaluators = cfg.get(f'{split}_evaluator') or []
        for evaluator in (evaluators if isinstance(evaluators, (list, tuple))
                          else [evaluators]):
            ann = (evaluator or {}).get('ann_file')
            if ann and not osp.isfile(ann):
                raise UserError(
                    f'The annotation file of the {split} evaluator '
                    f'({evaluator.get("type")}) does not exist: {ann}. Point '
                    f'the config at it, e.g. --cfg-options {split}_evaluator.'
                    'ann_file=/path/to/annotations.json')


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

    from .models import XCiT
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
    from .models.presets import preset_widths
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


def check_pretrained(cfg, backbone: Optional[nn.Module]) -> None:
    """The backbone's ``Pretrained`` checkpoint (its ``init_cfg``, a dict or
    an entry of a list) must be readable (a URL is downloaded here, once,
    and the config pointed at the local copy) and, where the backbone is
    XCiT, hold its weights under the entry's ``prefix`` with their names
    and shapes (checked against the meta-device ``backbone``, as the
    strict import will check them)."""
    from .models.presets import init_cfgs
    init = ((cfg.get('model') or {}).get('backbone') or {}).get('init_cfg')
    for entry in init_cfgs(init):
        if entry.get('type') != 'Pretrained':
            continue
        what = 'pretrained checkpoint'
        entry['checkpoint'], contents = read_checked(entry.get('checkpoint'),
                                                     what)
        if backbone is None:
            continue
        try:
            backbone_weights(backbone, contents, entry.get('checkpoint_key'),
                             entry.get('prefix'))
        except CheckpointError as e:
            raise UserError(
                f'The {what} {entry["checkpoint"]} cannot initialise the '
                f'backbone (model.backbone.init_cfg): {e}')


def read_checked(path: str, what: str) -> Tuple[str, Mapping]:
    """The local path of the checkpoint at ``path`` (a file or an http(s)
    URL, downloaded once into torch's hub cache) and its contents; a missing
    or unreadable one is a :class:`UserError` naming ``what`` it is."""
    hint = (' Pass a local file or an http(s) URL, e.g. --cfg-options '
            'model.backbone.init_cfg.checkpoint=PATH_OR_URL.'
            if 'pretrained' in what else '')
    if not is_url(path) and not osp.isfile(str(path)):
        raise UserError(f'The {what} does not exist: {path}.{hint}')
    try:
        local = local_checkpoint(path)
        return local, read_checkpoint(local)
    except CheckpointError as e:
        raise UserError(f'The {what} cannot be used: {e}')


def check_checkpoint(path: str, what: str) -> str:
    """Check the checkpoint at ``path`` (see :func:`read_checked`) and
    return its local path."""
    return read_checked(path, what)[0]


def check_inputs(cfg, training: bool) -> None:
    """Fail early, before a work dir is written, on missing or bad inputs.

    Checkpoints given as URLs are downloaded here (once) and the config is
    pointed at the local copy, which is then read without arbitrary
    unpickling like any other file."""
    backbone = check_backbone(cfg)
    check_channels(cfg, backbone)
    check_datasets(cfg, ('train', 'val') if training else ('test', ))
    check_evaluators(cfg, ('val', ) if training else ('test', ))
    if training:
        check_traced(cfg, backbone)
        check_pretrained(cfg, backbone)
        checkpoint = None
        if cfg.get('resume') and not cfg.get('load_from'):
            # --resume without a path: the newest complete checkpoint of the
            # work dir (none: the run starts from the beginning)
            cfg.load_from, checkpoint = checkpoint_to_resume(cfg.work_dir)
        elif cfg.get('load_from'):
            what = ('checkpoint to resume from' if cfg.get('resume') else
                    'checkpoint to start from (load_from)')
            cfg.load_from, checkpoint = read_checked(cfg.load_from, what)
        if checkpoint is not None and cfg.get('resume') and \
                is_published(checkpoint):
            refuse_resume(cfg.load_from)
        if checkpoint is not None:
            # fine-tuning (load_from alone) may change the classes
            check_fits(cfg, checkpoint,
                       allow_new_classes=not cfg.get('resume'))


def check_fits(cfg, checkpoint: Mapping, allow_new_classes: bool) -> None:
    """The weights of ``checkpoint`` (ours or published) must fit the
    config's model as the runner will check them when it loads them
    (:class:`~xcit_dense.hooks.CheckpointImportHook`), so that a checkpoint
    of another model ends the run before its work dir is written. The model
    is built on PyTorch's meta device (no memory, no weights; 0.2 to 2 s);
    one that cannot be built there is checked when the runner loads it."""
    import warnings

    import torch

    from .checkpoint.published import model_weights
    from .toolkits import use_toolkit
    model = cfg.get('model') or {}
    if str(model.get('type', '')).endswith('TTAModel'):
        model = model.get('module') or {}
    # a copy: some models edit their config as they build (mmdet's
    # DeformableDETR sets its head's arguments), and the runner builds it
    model = copy.deepcopy(model)
    try:
        registry = use_toolkit(cfg.get('default_scope'))
        # the runner builds it again and says what it warns about
        with warnings.catch_warnings(), torch.device('meta'):
            warnings.simplefilter('ignore')
            state = registry.MODELS.build(model).state_dict()
    except Exception:  # noqa: BLE001 (any error of any model's code)
        return
    try:
        model_weights(checkpoint, state, allow_new_classes,
                      log=lambda _: None)
    except CheckpointError as e:
        raise UserError(str(e)) from e
