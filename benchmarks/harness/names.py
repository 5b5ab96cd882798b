"""The benchmark's model names: ``xcit_<preset>[@variant+...]``, the peer
backbones, whole detectors and segmentors (see ``tools/benchmark.py``)."""
import os.path as osp
from typing import Optional, Tuple

from xcit_dense.deploy.runtimes import RUNTIMES

PEERS = ('swin_t', 'r50', 'vit_s16', 'vit_b16')
DETECTORS = {
    'mask_rcnn_xcit_s12': 'configs/coco/mask_rcnn_xcit_s12.py',
    'mask_rcnn_swin_t': 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
}
SEGMENTORS = {
    'upernet_xcit_s12': 'configs/ade20k/upernet_xcit_s12.py',
}
XCIT_VARIANTS = ('reference', 'always', 'compile', 'graphs', 'bf16', 'cp',
                 'amp', 'published') + RUNTIMES
SEGMENTOR_VARIANTS = ('reference', 'always', 'eager', 'compile', 'amp',
                      'iter') + RUNTIMES + ('int8', )
DETECTOR_VARIANTS = ('reference', 'always', 'eager', 'amp', 'bf16',
                     'iter') + RUNTIMES + ('int8', )


#: the repository's root, whose configs/ the benchmark builds
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def config_path(path: str) -> str:
    """A benchmark config: ``mmdet::`` names as they are, ours from the
    repository's configs/ (whatever the working directory)."""
    return path if '::' in path else osp.join(REPO, path)


def parse_model(name: str):
    """``'xcit_small_12_p16@compile+bf16'`` -> (base name, set of variants);
    raises ValueError on unknown names."""
    base, at, suffix = name.partition('@')
    variants = set(suffix.split('+')) if at else set()
    if base.startswith('xcit_') or base in SEGMENTORS:
        allowed = SEGMENTOR_VARIANTS if base in SEGMENTORS else XCIT_VARIANTS
        if base.startswith('xcit_'):
            from xcit_dense.models import ARCH_SETTINGS
            if base[len('xcit_'):] not in ARCH_SETTINGS:
                raise ValueError(f'unknown XCiT preset in {name!r}; presets:'
                                 f' {", ".join(ARCH_SETTINGS)}')
        _check_known(name, variants, allowed)
        if {'reference', 'compile'} <= variants:
            raise ValueError('the reference path is not compiled')
        if {'compile', 'graphs'} <= variants:
            raise ValueError("'compile' and 'graphs' exclude each other "
                             "(compile_cfg=dict(mode='reduce-overhead') "
                             "graphs the compiled forward)")
        if {'reference', 'always'} <= variants:
            raise ValueError("'reference' and 'always' exclude each other")
        if 'published' in variants and variants - {'published', 'amp'}:
            raise ValueError(
                f"{name!r}: 'published' is the published code as it is "
                f"written; it takes 'amp' alone")
        _check_runtime(name, variants)
        return base, variants
    if base in DETECTORS:
        allowed = DETECTOR_VARIANTS if base == 'mask_rcnn_xcit_s12' \
            else ('amp', 'iter')
        _check_known(name, variants, allowed)
        if {'reference', 'always'} <= variants:
            raise ValueError("'reference' and 'always' exclude each other")
        _check_runtime(name, variants)
        return base, variants
    if base in PEERS and not variants:
        return base, variants
    raise ValueError(f'unknown model {name!r}; use {usage()}')


def usage() -> str:
    """The model names, with the variants each takes."""
    return (f'xcit_<preset>[@variant+...] (variants: '
            f'{", ".join(XCIT_VARIANTS)}), '
            f'mask_rcnn_xcit_s12[@variant+...] (variants: '
            f'{", ".join(DETECTOR_VARIANTS)}), mask_rcnn_swin_t[@amp+iter], '
            f'{", ".join(SEGMENTORS)}[@variant+...] (variants: '
            f'{", ".join(SEGMENTOR_VARIANTS)}), or one of the peer '
            f'backbones {", ".join(PEERS)} (no variants)')


def _check_known(name: str, variants: set, allowed) -> None:
    """Every variant is one of ``allowed``; none is empty (a name ending in
    '@' or '+', or '++')."""
    if '' in variants:
        raise ValueError(f"empty variant in {name!r} (a name after each '@' "
                         f"and '+'); allowed: {', '.join(allowed)}")
    unknown = variants - set(allowed)
    if unknown:
        raise ValueError(f'unknown variant(s) {sorted(unknown)} in '
                         f'{name!r}; allowed: {", ".join(allowed)}')


def _check_runtime(name: str, variants: set) -> None:
    """A runtime runs the exported graph, fp32 or (``int8``) quantized; it
    takes no other variant, and ``int8`` needs a runtime."""
    runtimes = variants & set(RUNTIMES)
    if 'iter' in variants and (runtimes or 'int8' in variants):
        raise ValueError(f"{name!r}: 'iter' is a whole training iteration; "
                         f"a runtime ({', '.join(RUNTIMES)}) runs inference")
    if 'int8' in variants and not runtimes:
        raise ValueError(f'{name!r}: int8 is a quantized export; name the '
                         f'runtime that runs it ({", ".join(RUNTIMES)})')
    if runtimes and len(variants - {'int8'}) > 1:
        raise ValueError(f'{name!r}: a runtime ({", ".join(RUNTIMES)}) '
                         'runs the exported graph (fp32, or int8); it takes '
                         'no other variant')


def bf16_on_cpu(name: str, device: str) -> bool:
    """Whether the row computes in bf16 on the CPU: ``@bf16``, and ``@amp``
    (there bf16 autocast)."""
    return device == 'cpu' and bool(parse_model(name)[1] & {'bf16', 'amp'})


def refuse_emulated_bf16(models, device: str) -> Optional[str]:
    """One paragraph refusing the rows of ``models`` that compute in bf16
    on a CPU without native bf16
    (:func:`~xcit_dense.precision.cpu_has_native_bf16`), where they would
    time PyTorch's emulation of bf16 (XCiT-S12/16 at 256x384: 8.5x fp32's
    time on an AMD EPYC with AVX2 alone); None where none is refused."""
    from xcit_dense import precision
    emulated = [n for n in models if bf16_on_cpu(n, device)]
    if not emulated or precision.cpu_has_native_bf16():
        return None
    return (f'{", ".join(emulated)}: bf16 on the CPU (@bf16, and @amp, '
            'bf16 autocast there), and this CPU has no native bf16 (none of '
            f'{", ".join(precision.NATIVE_BF16_FEATURES)} in '
            'torch.cpu.get_capabilities()), where PyTorch emulates bf16 at '
            'several times the time of fp32: the rows would time the '
            'emulation. Measure them on a CPU with native bf16 (AVX-512 '
            'BF16, AMX, Arm BF16) or with --device cuda, or leave them out '
            'of --models.')


def single_mode(name: str) -> Optional[Tuple[str, str]]:
    """The one mode (``'infer'`` or ``'train'``) ``name`` is measured in
    and why, or None where it is measured in both."""
    base, variants = parse_model(name)
    if 'iter' in variants:
        return 'train', ("'iter' is a whole training iteration, measured in "
                         "training only")
    if variants & set(RUNTIMES):
        return 'infer', (f'a runtime ({", ".join(RUNTIMES)}) runs the '
                         'exported graph, in inference only')
    if base in SEGMENTORS and 'compile' in variants:
        return 'infer', ("a segmentor's 'compile' is its exported graph's, "
                         "measured in inference only (it trains as the mmseg "
                         "model)")
    return None


def trainable(name: str) -> bool:
    """Measured in training too: not a runtime (segmentors train as mmseg
    models; their compile variant is the exported graph's, inference
    only)."""
    return (single_mode(name) or ('train', ))[0] == 'train'


def inferable(name: str) -> bool:
    """Measured in inference too: not a training iteration (``iter``)."""
    return (single_mode(name) or ('infer', ))[0] == 'infer'
