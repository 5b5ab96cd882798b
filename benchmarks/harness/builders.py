"""The models and inputs the benchmark measures, random weights (seeded by
the caller): XCiT backbones and their peers, whole detectors and segmentors
from our configs and mmdet's."""
import functools

from xcit_dense.toolkits import type_name

from .names import DETECTORS, SEGMENTORS, config_path


def build_backbone(base: str, variants: set):
    """A backbone by benchmark name, random weights."""
    if base.startswith('xcit_'):
        from xcit_dense.models import XCiT
        return XCiT(arch=base[len('xcit_'):], with_cp='cp' in variants,
                    compile_cfg=True if 'compile' in variants else None,
                    autocast_dtype='bfloat16' if 'bf16' in variants else None,
                    fast_path=False if 'reference' in variants else
                    'always' if 'always' in variants else True,
                    cuda_graphs='train' if 'graphs' in variants else False)
    if base in ('swin_t', 'r50'):
        from xcit_dense.toolkits import use_toolkit
        models = use_toolkit('mmdet').MODELS
        if base == 'swin_t':
            return models.build(dict(
                type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                num_heads=[3, 6, 12, 24], window_size=7,
                out_indices=(0, 1, 2, 3)))
        return models.build(dict(type='ResNet', depth=50,
                                 out_indices=(0, 1, 2, 3)))
    import timm
    arch = {'vit_s16': 'vit_small_patch16_224',
            'vit_b16': 'vit_base_patch16_224'}[base]
    model = timm.create_model(arch, pretrained=False, num_classes=0,
                              dynamic_img_size=True)
    model.forward = model.forward_features
    return model


def recipe_backbone(backbone: dict, variants: set) -> None:
    """A recipe's XCiT backbone config (a peer's, such as Swin-T, left as
    it is) for a detector's or segmentor's row: as the recipe sets it
    (``compile_cfg='auto'``, ``cuda_graphs='auto'``), or ``reference``: the
    straightforward computation eagerly; ``always``: every fast path;
    ``eager``: without CUDA graphs."""
    if type_name(backbone) != 'XCiT':
        return
    if 'reference' in variants:
        backbone.update(fast_path=False, compile_cfg=None, cuda_graphs=False)
    if 'always' in variants:
        backbone.update(fast_path='always')
    if 'eager' in variants:
        backbone.update(cuda_graphs=False)


def recipe_config(base: str):
    """The config of a detector's or segmentor's benchmark name: ours from
    configs/, mmdet's (``mmdet::``) from the installed mmdet; a copy of
    the file read once per process (a measurement reads it for the model
    and again for an ``@iter`` row's optimizer wrapper)."""
    import copy
    return copy.deepcopy(_read_recipe_config(base))


@functools.lru_cache(maxsize=None)
def _read_recipe_config(base: str):
    from mmengine.config import Config
    from mmengine.hub import get_config
    path = config_path({**DETECTORS, **SEGMENTORS}[base])
    return get_config(path) if '::' in path else Config.fromfile(path)


def optim_wrapper_config(optim_wrapper, amp: bool, device: str) -> dict:
    """A copy of a config's ``optim_wrapper`` (its constructor and
    parameter groups as the recipe sets them) at a precision: with ``amp``
    on CUDA mmengine's ``AmpOptimWrapper`` (fp16, the loss scale dynamic
    unless the recipe sets one), as ``tools/train.py --amp`` sets it, else a
    plain ``OptimWrapper`` (fp32; on the CPU, where mmengine's AMP cannot
    run, a caller's autocast is around it). A wrapper of another type is
    kept."""
    import copy
    wrapper = copy.deepcopy(dict(optim_wrapper))
    if type_name(wrapper) in ('', 'OptimWrapper', 'AmpOptimWrapper'):
        if amp and device == 'cuda':
            wrapper['type'] = 'AmpOptimWrapper'
            wrapper.setdefault('loss_scale', 'dynamic')
        else:
            from xcit_dense.runner import without_amp
            without_amp(wrapper)
    return wrapper


def build_optim_wrapper(base: str, model, amp: bool, device: str):
    """The recipe's optimizer wrapper for ``model``, built as mmengine's
    Runner builds it from the config's ``optim_wrapper`` (ours merges the
    parameter groups of the same options, mmdet's Swin-T recipe keeps one
    per parameter), its precision the row's (:func:`optim_wrapper_config`).
    """
    from mmengine.optim import build_optim_wrapper as build

    from xcit_dense.toolkits import use_toolkit
    wrapper = optim_wrapper_config(recipe_config(base).optim_wrapper, amp,
                                   device)
    use_toolkit('mmdet' if base in DETECTORS else 'mmseg')
    return build(model, wrapper)


def build_detector(base: str, variants: set):
    from xcit_dense.toolkits import use_toolkit
    cfg = recipe_config(base)
    models = use_toolkit('mmdet').MODELS
    cfg.model.backbone.init_cfg = None  # random weights, no download
    cfg.model.test_cfg.rcnn.score_thr = 0.0  # 100 detections per image
    recipe_backbone(cfg.model.backbone, variants)
    model = models.build(cfg.model)
    if 'bf16' in variants:  # the networks in bf16, all between them fp32
        import torch

        from xcit_dense.precision import DETECTOR_PARTS, autocast_part
        for name in DETECTOR_PARTS:
            autocast_part(model.get_submodule(name), torch.bfloat16)
    return model


def sharpen_classifiers(detector):
    """Random weights score every class of every RoI alike, below the
    score threshold; multiplying the RPN's and the box head's classifier
    weights spreads the scores, so that an exported detector is checked on,
    and runs through, confident detections (100 per image at 800x1344)."""
    import torch
    with torch.no_grad():
        detector.roi_head.bbox_head.fc_cls.weight.mul_(4)
        detector.rpn_head.rpn_cls.weight.mul_(5)
    return detector


def build_detector_graph(base: str):
    """The whole detector as exported (image in, detections out), random
    weights (seeded by the caller), classifiers sharpened."""
    from xcit_dense.deploy import DetectorGraph
    from xcit_dense.inference import init_model
    cfg = recipe_config(base)
    cfg.model.backbone.init_cfg = None  # random weights, no download
    return DetectorGraph(sharpen_classifiers(init_model(cfg, None)))


def build_segmentor(base: str, variants: set, device: str):
    """The mmseg model of a segmentor config (for training steps), random
    weights; SyncBN as BatchNorm on the CPU."""
    from xcit_dense.runner import replace_syncbn
    from xcit_dense.toolkits import use_toolkit
    cfg = recipe_config(base)
    models = use_toolkit('mmseg').MODELS
    cfg.model.backbone.init_cfg = None  # random weights, no download
    recipe_backbone(cfg.model.backbone, variants)
    if device == 'cpu':
        replace_syncbn(cfg.model)
    return models.build(cfg.model)


def build_segmentor_graph(base: str, variants: set):
    """The whole segmentor as exported (image in, logits and labels out),
    random weights (seeded by the caller)."""
    from xcit_dense.deploy import SegmentorGraph
    from xcit_dense.inference import init_model
    cfg = recipe_config(base)
    cfg.model.backbone.init_cfg = None  # random weights, no download
    cfg.model.backbone.fast_path = 'always' if 'always' in variants \
        else 'reference' not in variants
    if 'compile' in variants:
        cfg.model.backbone.compile_cfg = True
    return SegmentorGraph(init_model(cfg, None))


def build_exportable(base: str):
    """What the runtimes run: the XCiT pyramid or the whole segmentor, with
    the weights every process builds from seed 0."""
    import torch
    torch.manual_seed(0)
    if base in SEGMENTORS:
        return build_segmentor_graph(base, {'reference'})
    if base in DETECTORS:
        return build_detector_graph(base)
    from xcit_dense.deploy import FeatureGraph
    holder = torch.nn.Module()
    holder.backbone = build_backbone(base, {'reference'}).eval()
    return FeatureGraph(holder, with_neck=False)


def segmentation_data(model, batch: int, h: int, w: int) -> dict:
    """Random images and labels (150 classes, some pixels ignored) as a
    segmentor's data loader gives them (``train_step``'s input), at ``h`` x
    ``w`` (the data preprocessor set to pad to that, not to the recipe's
    crop size)."""
    import torch
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    model.data_preprocessor.size = (h, w)
    samples = []
    for _ in range(batch):
        sample = SegDataSample(metainfo=dict(img_shape=(h, w),
                                             ori_shape=(h, w),
                                             pad_shape=(h, w)))
        label = torch.randint(0, model.decode_head.num_classes, (1, h, w))
        label[:, :8] = 255
        sample.gt_sem_seg = PixelData(data=label)
        samples.append(sample)
    return dict(inputs=[torch.randint(0, 255, (3, h, w), dtype=torch.uint8)
                        for _ in range(batch)], data_samples=samples)


def example_input(base: str, batch: int, size):
    """The input of a runtime / segmentor measurement: the first one the
    export verification uses (pixel values for whole models)."""
    from xcit_dense.deploy import random_input
    return random_input(batch, 3, *size,
                        images=base in SEGMENTORS or base in DETECTORS)
