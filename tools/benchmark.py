"""Benchmark dense backbones and detectors: latency, memory and FLOPs by size.

Every measurement runs in a fresh process, so its peak memory is its own: on
the CPU the peak resident set of that process (model and libraries included,
plus "activation memory" = peak minus the resident set before the first step),
on CUDA ``torch.cuda.max_memory_allocated``. Warm-up runs are excluded (the
first call's time is reported separately: it includes ``torch.compile``), the
median of the timed runs is reported, threads are stated. FLOPs come from
mmengine's counter (fvcore's convention: one multiply-add counts as one FLOP,
so "GMAC") on the published design (for XCiT: the straightforward path, the
same for every variant); the XCiT fast path executes fewer (XCA from second
moments), counted separately with ``torch.utils.flop_counter`` on its
standard-operator backend. Achieved GFLOP/s counts 2 FLOPs per executed
multiply-add and is shown next to the machine's measured fp32 (and bf16)
matmul throughput.

    python tools/benchmark.py --models xcit_small_12_p16@reference \\
        xcit_small_12_p16 swin_t vit_s16 --sizes 512x512 800x1344 \\
        --batch 1 2 --out-dir work_dirs/benchmark

Models:
  xcit_<preset>[@variant+variant]  the XCiT backbone with its pyramid;
      variants:
      reference  the published design computed the straightforward way
                 (``XCiT(fast_path=False)``: every module's straightforward
                 computation -- timm's arithmetic, NCHW round trips,
                 positional encoding recomputed), the baseline of the
                 side-by-side ratios;
      compile    ``compile_cfg=True`` (torch.compile, Inductor);
      bf16       ``autocast_dtype='bfloat16'`` (float16 on CUDA): the
                 backbone under autocast, fp32 maps out; the output
                 difference to fp32 is reported;
      cp         ``with_cp=True`` (gradient checkpointing);
      amp        mixed precision as mmengine's ``AmpOptimWrapper`` runs it:
                 the whole step under ``torch.autocast`` (float16 on CUDA,
                 bfloat16 on the CPU);
      onnxruntime, openvino  inference only, fp32: the model exported to ONNX
                 at the measured size by ``tools/export_onnx.py``'s code
                 (verified against PyTorch; export time reported apart, in a
                 process of its own) and run by onnxruntime / OpenVINO
                 (f32 precision hint) with the same threads.
  swin_t, r50        mmdet's Swin-T and ResNet-50 backbones;
  vit_s16, vit_b16   timm's ViT-S/16 and ViT-B/16, global attention, position
                     embeddings resized to the input;
  mask_rcnn_xcit_s12[@variant], mask_rcnn_swin_t[@amp]   whole Mask R-CNN
      detectors (our configs/coco/mask_rcnn_xcit_s12.py, its backbone as the
      recipe sets it: ``compile_cfg='auto'``, compiled on CUDA; and mmdet's
      Swin-T 1x config): infer = ``model.predict`` on preprocessed inputs
      with the box score threshold at 0 so that 100 detections per image
      reach the mask head; train = one ``loss`` + backward with 5
      ground-truth boxes and masks per image. Variants: reference (backbone
      ``fast_path=False``, eager: the straightforward baseline), amp.
  upernet_xcit_s12[@variant]  the whole UperNet XCiT-S12/16 segmentor
      (configs/ade20k/upernet_xcit_s12.py, 150 classes): inference as
      exported, image in, logits and labels at the image's size out
      (``xcit_dense.deploy.SegmentorGraph``); train = one ``loss`` +
      backward of the mmseg model (backbone as the recipe sets it) on random
      labels. Variants reference, compile (inference), amp, onnxruntime,
      openvino.

Writes ``results.json``, ``results.md`` (tables, and the ratios of every XCiT
variant to its ``@reference`` measured in the same run) and ``results.png``
(inference time and memory against pixel count, log-log).
"""
import argparse
import json
import os
import os.path as osp
import resource
import statistics
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

PEERS = ('swin_t', 'r50', 'vit_s16', 'vit_b16')
DETECTORS = {
    'mask_rcnn_xcit_s12': osp.join(ROOT, 'configs/coco/mask_rcnn_xcit_s12.py'),
    'mask_rcnn_swin_t': 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
}
SEGMENTORS = {
    'upernet_xcit_s12': osp.join(ROOT, 'configs/ade20k/upernet_xcit_s12.py'),
}
RUNTIMES = ('onnxruntime', 'openvino')
XCIT_VARIANTS = ('reference', 'compile', 'bf16', 'cp', 'amp') + RUNTIMES
SEGMENTOR_VARIANTS = ('reference', 'compile', 'amp') + RUNTIMES
DETECTOR_VARIANTS = ('reference', 'amp')


def parse_model(name: str):
    """``'xcit_small_12_p16@compile+bf16'`` -> (base name, set of variants);
    raises ValueError on unknown names."""
    base, _, suffix = name.partition('@')
    variants = set(filter(None, suffix.split('+')))
    if base.startswith('xcit_') or base in SEGMENTORS:
        allowed = SEGMENTOR_VARIANTS if base in SEGMENTORS else XCIT_VARIANTS
        if base.startswith('xcit_'):
            from xcit_dense import ARCH_SETTINGS
            if base[len('xcit_'):] not in ARCH_SETTINGS:
                raise ValueError(f'unknown XCiT preset in {name!r}; presets:'
                                 f' {", ".join(ARCH_SETTINGS)}')
        unknown = variants - set(allowed)
        if unknown:
            raise ValueError(f'unknown variant(s) {sorted(unknown)} in '
                             f'{name!r}; allowed: {", ".join(allowed)}')
        if {'reference', 'compile'} <= variants:
            raise ValueError('the reference path is not compiled')
        if variants & set(RUNTIMES) and len(variants) > 1:
            raise ValueError(f'{name!r}: a runtime ({", ".join(RUNTIMES)}) '
                             'runs the exported fp32 graph; it takes no '
                             'other variant')
        return base, variants
    if base in DETECTORS:
        allowed = DETECTOR_VARIANTS if base == 'mask_rcnn_xcit_s12' \
            else ('amp',)
        if variants - set(allowed):
            raise ValueError(f'unknown variant(s) '
                             f'{sorted(variants - set(allowed))} in '
                             f'{name!r}; allowed: {", ".join(allowed)}')
        return base, variants
    if base in PEERS and not variants:
        return base, variants
    raise ValueError(
        f'unknown model {name!r}; use xcit_<preset>[@variant+...] (variants: '
        f'{", ".join(XCIT_VARIANTS)}), '
        f'{", ".join(SEGMENTORS)}[@variant] (variants: '
        f'{", ".join(SEGMENTOR_VARIANTS)}) or one of '
        f'{", ".join(PEERS + tuple(DETECTORS))}')


def build_backbone(base: str, variants: set, device: str):
    """A backbone by benchmark name, random weights."""
    import torch
    if base.startswith('xcit_'):
        from xcit_dense import XCiT
        amp_dtype = 'bfloat16' if torch.device(device).type == 'cpu' \
            else 'float16'
        return XCiT(arch=base[len('xcit_'):], with_cp='cp' in variants,
                    compile_cfg=True if 'compile' in variants else None,
                    autocast_dtype=amp_dtype if 'bf16' in variants else None,
                    fast_path='reference' not in variants)
    if base in ('swin_t', 'r50'):
        from mmdet.registry import MODELS
        from mmengine.registry import init_default_scope
        init_default_scope('mmdet')
        if base == 'swin_t':
            return MODELS.build(dict(
                type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                num_heads=[3, 6, 12, 24], window_size=7,
                out_indices=(0, 1, 2, 3)))
        return MODELS.build(dict(type='ResNet', depth=50,
                                 out_indices=(0, 1, 2, 3)))
    import timm
    arch = {'vit_s16': 'vit_small_patch16_224',
            'vit_b16': 'vit_base_patch16_224'}[base]
    model = timm.create_model(arch, pretrained=False, num_classes=0,
                              dynamic_img_size=True)
    model.forward = model.forward_features
    return model


def build_detector(base: str, variants: set):
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    from mmengine.hub import get_config
    from mmengine.registry import init_default_scope
    register_all_modules()
    from mmdet.registry import MODELS

    import xcit_dense  # noqa: F401  (registers the backbone)
    path = DETECTORS[base]
    cfg = get_config(path) if '::' in path else Config.fromfile(path)
    init_default_scope('mmdet')
    cfg.model.backbone.init_cfg = None  # random weights, no download
    cfg.model.test_cfg.rcnn.score_thr = 0.0  # 100 detections per image
    if 'reference' in variants:
        cfg.model.backbone.update(fast_path=False, compile_cfg=None)
    return MODELS.build(cfg.model)


def build_segmentor(base: str, variants: set, device: str):
    """The mmseg model of a segmentor config (for training steps), random
    weights; SyncBN as BatchNorm on the CPU."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules
    register_all_modules()
    import xcit_dense  # noqa: F401  (registers the backbone)
    from xcit_dense.runner import replace_syncbn
    cfg = Config.fromfile(SEGMENTORS[base])
    init_default_scope('mmseg')
    cfg.model.backbone.init_cfg = None  # random weights, no download
    if 'reference' in variants:
        cfg.model.backbone.update(fast_path=False, compile_cfg=None)
    if device == 'cpu':
        replace_syncbn(cfg.model)
    return MODELS.build(cfg.model)


def build_segmentor_graph(base: str, variants: set):
    """The whole segmentor as exported (image in, logits and labels out),
    random weights (seeded by the caller)."""
    from mmengine.config import Config

    from xcit_dense.deploy import SegmentorGraph
    from xcit_dense.inference import init_model
    cfg = Config.fromfile(SEGMENTORS[base])
    cfg.model.backbone.init_cfg = None  # random weights, no download
    cfg.model.backbone.fast_path = 'reference' not in variants
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
    from xcit_dense.deploy import FeatureGraph
    holder = torch.nn.Module()
    holder.backbone = build_backbone(base, {'reference'}, 'cpu').eval()
    return FeatureGraph(holder, with_neck=False)


def onnx_file(args, model: str, size) -> str:
    return osp.join(args.out_dir, 'onnx',
                    f'{model.partition("@")[0]}_{size[0]}x{size[1]}.onnx')


def export_worker(args) -> dict:
    """Export (and verify) the model at the size, in this process."""
    import torch
    torch.set_num_threads(args.threads)
    from xcit_dense.deploy import export_onnx
    base, _ = parse_model(args.model)
    path = onnx_file(args, args.model, args.size)
    start = time.perf_counter()
    rows = export_onnx(build_exportable(base), path, args.batch, *args.size,
                       log=lambda _: None)
    return dict(export_s=time.perf_counter() - start, onnx_file=path,
                export_max_rel_diff=max(r.get('max_rel_diff', 0.)
                                        for r in rows))


def runtime_session(runtime: str, path: str, threads: int):
    """A callable ``f(numpy input) -> list of numpy outputs`` running the
    ONNX file on ``runtime``."""
    if runtime == 'onnxruntime':
        from xcit_dense.deploy.onnx_export import onnxruntime_session
        session = onnxruntime_session(path, threads)
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: x})
    import openvino as ov
    compiled = ov.Core().compile_model(
        path, 'CPU', {'INFERENCE_NUM_THREADS': threads,
                      'INFERENCE_PRECISION_HINT': 'f32'})
    request = compiled.create_infer_request()

    def run(x):
        results = request.infer([x])  # one inference, all outputs
        return [results[o] for o in compiled.outputs]
    return run


def _rss_gib() -> float:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**30


def _matmul(args, dtype_name):
    import torch
    dtype = getattr(torch, dtype_name)
    n = args.matmul_size
    a = torch.randn(n, n, device=args.device).to(dtype)
    b = torch.randn(n, n, device=args.device).to(dtype)
    times = []
    for i in range(2 + max(args.repeat, 5)):
        _sync(args)
        start = time.perf_counter()
        a @ b
        _sync(args)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


def _sync(args):
    if args.device == 'cuda':
        import torch
        torch.cuda.synchronize()


def _outputs(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def worker(args) -> dict:
    """One measurement in this (fresh) process."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model == 'matmul':
        return dict(fp32_gflops_per_s=_matmul(args, 'float32'),
                    bf16_gflops_per_s=_matmul(args, 'bfloat16'))
    if args.mode == 'export':
        return export_worker(args)
    base, variants = parse_model(args.model)
    h, w = args.size
    result = dict(model=args.model, h=h, w=w, batch=args.batch,
                  mode=args.mode, threads=args.threads, device=args.device)
    detector = base in DETECTORS
    segmentor_loss = base in SEGMENTORS and args.mode == 'train'
    runtime = next(iter(variants & set(RUNTIMES)), None)
    if runtime is not None:  # the exported file; no PyTorch model yet
        model = None
        session = runtime_session(runtime, onnx_file(args, args.model,
                                                     args.size), args.threads)
    elif segmentor_loss:
        model = build_segmentor(base, variants, args.device).to(args.device)
        model.train()
    elif base in SEGMENTORS:
        torch.manual_seed(0)
        model = build_segmentor_graph(base, variants).to(args.device)
    else:
        model = (build_detector(base, variants) if detector else
                 build_backbone(base, variants, args.device)).to(args.device)
        model.train(args.mode == 'train')

    if segmentor_loss:
        inputs, samples = _segmentation_batch(model, args.batch, h, w)

        def forward():
            return model.loss(inputs, samples)
    elif runtime is not None or base in SEGMENTORS:
        x = example_input_for(base, args)
        x_np = x.numpy()

        def forward():
            return session(x_np) if runtime is not None else model(x)
    elif detector:
        from mmdet.testing import demo_mm_inputs
        packed = demo_mm_inputs(batch_size=args.batch,
                                image_shapes=(3, h, w), num_classes=80,
                                num_items=[5] * args.batch, with_mask=True)
        for sample in packed['data_samples']:
            sample.set_metainfo(dict(scale_factor=(1.0, 1.0),
                                     ori_shape=(h, w)))
        data = model.data_preprocessor(packed, training=args.mode == 'train')
        inputs, samples = data['inputs'], data['data_samples']

        def forward():
            if args.mode == 'train':
                return model.loss(inputs, samples)
            return model.predict(inputs, samples)
    else:
        x = torch.randn(args.batch, 3, h, w, device=args.device)

        def forward():
            return model(x)

    if 'amp' in variants:  # as mmengine's AmpOptimWrapper.optim_context
        unscaled = forward
        amp_dtype = torch.float16 if args.device == 'cuda' else torch.bfloat16

        def forward():
            with torch.autocast(args.device, dtype=amp_dtype):
                return unscaled()
    if args.mode == 'infer':
        def step():
            with torch.no_grad():
                return forward()
    else:
        def step():
            model.zero_grad(set_to_none=True)
            out = forward()
            if detector or segmentor_loss:
                loss = model.parse_losses(out)[0]
            else:
                loss = sum(o.float().sum() for o in _outputs(out))
            loss.backward()

    if args.device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base_mem = torch.cuda.memory_allocated() / 2**30
    else:
        base_mem = _rss_gib()
    times = []
    for i in range(args.warmup + args.repeat):
        _sync(args)
        start = time.perf_counter()
        out = step()
        _sync(args)
        if i == 0:
            result['first_call_s'] = time.perf_counter() - start
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    if args.device == 'cuda':
        peak = torch.cuda.max_memory_allocated() / 2**30
        result['memory'] = 'cuda max allocated'
    else:  # ru_maxrss is in KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        result['memory'] = 'peak RSS of the process'
    result['peak_mem_gib'] = peak
    result['activation_mem_gib'] = peak - base_mem
    # counted after the peak memory is read: the counters trace the model
    if runtime is not None or (base in SEGMENTORS and not segmentor_loss):
        result['seconds'] = statistics.median(times)
        result['images_per_s'] = args.batch / result['seconds']
        result.update(_diff_to_reference(base, out, x))
        return result
    if args.mode == 'infer' and not detector and base not in SEGMENTORS:
        result.update(_count_gmac(model, base, variants, x[:1], args.device))
    result['seconds'] = statistics.median(times)
    result['images_per_s'] = args.batch / result['seconds']
    if 'gmac_per_image' in result:
        gmac = result.get('executed_gmac_per_image',
                          result['gmac_per_image'])
        result['achieved_gflops_per_s'] = (
            2 * gmac * args.batch / result['seconds'])
    if args.mode == 'infer' and base.startswith('xcit_') and \
            'reference' not in variants:
        # output difference to the straightforward fp32 computation (the
        # same weights in a model built with fast_path=False)
        reference = build_backbone(base, {'reference'}, args.device)
        reference.load_state_dict(model.state_dict())
        with torch.no_grad():
            refs = reference.to(args.device).eval()(x)
        diffs = [((o.float() - r).abs().max() / r.abs().max()).item()
                 for o, r in zip(_outputs(out), refs)]
        result['max_rel_diff_vs_reference'] = max(diffs)
    return result


def _segmentation_batch(model, batch: int, h: int, w: int):
    """Preprocessed random images and labels (150 classes, some pixels
    ignored) for a segmentor's ``loss``."""
    import torch
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    samples = []
    for _ in range(batch):
        sample = SegDataSample(metainfo=dict(img_shape=(h, w),
                                             ori_shape=(h, w),
                                             pad_shape=(h, w)))
        label = torch.randint(0, model.decode_head.num_classes, (1, h, w))
        label[:, :8] = 255
        sample.gt_sem_seg = PixelData(data=label)
        samples.append(sample)
    data = model.data_preprocessor(dict(
        inputs=[torch.randint(0, 255, (3, h, w), dtype=torch.uint8)
                for _ in range(batch)], data_samples=samples), training=True)
    return data['inputs'], data['data_samples']


def example_input_for(base: str, args):
    """The input of a runtime / segmentor measurement: the first one the
    export verification uses (pixel values for segmentors)."""
    from xcit_dense.deploy.onnx_export import random_input
    return random_input(args.batch, 3, *args.size,
                        images=base in SEGMENTORS)


def _diff_to_reference(base: str, out, x) -> dict:
    """Largest difference of the (first, float) outputs to the
    straightforward fp32 PyTorch computation with the same weights, relative
    to its largest value."""
    import torch

    from xcit_dense.models.policy import fast_path
    reference = build_exportable(base)
    with torch.no_grad(), fast_path(False):
        refs = reference(x)
    outs = [torch.as_tensor(o) for o in _outputs(out)]
    diffs = [((o.float() - r).abs().max() / r.abs().max()).item()
             for o, r in zip(outs, refs) if r.is_floating_point()]
    return dict(max_rel_diff_vs_reference=max(diffs))


def _count_gmac(model, base: str, variants: set, x, device: str) -> dict:
    """Multiply-adds per image: ``gmac_per_image`` of the published design
    (mmengine's counter; every XCiT variant computes the same maths, so it
    is counted on the straightforward path, whose operators the counter
    knows -- not the oneDNN custom operators, checkpointing or compiled
    code) and, for the XCiT fast path, ``executed_gmac_per_image``."""
    import torch
    from mmengine.analysis import FlopAnalyzer
    fast = base.startswith('xcit_') and 'reference' not in variants
    counted = build_backbone(base, {'reference'}, device).to(device).eval() \
        if fast else model
    with torch.no_grad():
        flops = FlopAnalyzer(counted, x)
        flops.unsupported_ops_warnings(False)
        flops.uncalled_modules_warnings(False)
        counts = dict(gmac_per_image=flops.total() / 1e9)
    if fast:
        counts['executed_gmac_per_image'] = _executed_gmac(base, x)
    return counts


def _executed_gmac(base: str, x) -> float:
    """Multiply-adds the XCiT fast path executes on ``x`` (inference), counted
    by ``torch.utils.flop_counter`` on its standard-operator backend (the
    counter does not see the oneDNN custom operators; the arithmetic is the
    same)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from xcit_dense.models.ops import onednn
    model = build_backbone(base, set(), str(x.device)).to(x.device).eval()
    onednn.set_fused_kernels(False)
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        onednn.set_fused_kernels(True)
    return counter.get_total_flops() / 2e9  # the counter: 2 per multiply-add


_EXPORTED = {}  # (base, size, batch) -> the export's row


def trainable(name: str) -> bool:
    """Measured in training too: not a runtime (segmentors train as mmseg
    models; their compile variant is the exported graph's, inference
    only)."""
    base, variants = parse_model(name)
    if base in SEGMENTORS and 'compile' in variants:
        return False
    return not variants & set(RUNTIMES)


def measure(model, size, batch, mode, args) -> dict:
    base, variants = parse_model(model) if model != 'matmul' else (None, ())
    if set(variants) & set(RUNTIMES) and mode == 'infer':
        # exported (and verified) in a process of its own, so that the
        # runtime's process holds only what the runtime needs; once per
        # model, size and batch for all runtimes and rounds
        key = (base, size, batch)
        if key not in _EXPORTED:
            _EXPORTED[key] = _run_worker(model, size, batch, 'export', args)
        exported = _EXPORTED[key]
        if 'error' in exported:
            return dict(exported, model=model)
        row = _run_worker(model, size, batch, mode, args)
        row.update({k: exported[k] for k in ('export_s',
                                             'export_max_rel_diff')})
        return row
    return _run_worker(model, size, batch, mode, args)


def _run_worker(model, size, batch, mode, args) -> dict:
    cmd = [sys.executable, osp.abspath(__file__), '--worker',
           '--model', model, '--size', f'{size[0]}x{size[1]}',
           '--batch', str(batch), '--mode', mode, '--device', args.device,
           '--threads', str(args.threads), '--repeat', str(args.repeat),
           '--warmup', str(args.warmup), '--matmul-size',
           str(args.matmul_size), '--out-dir', args.out_dir]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    stub = dict(model=model, h=size[0], w=size[1], batch=batch, mode=mode)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(stub, error=f'timeout ({args.timeout:.0f} s)')
    if proc.returncode != 0:
        killed = proc.returncode < 0 or 'MemoryError' in proc.stderr or \
            'out of memory' in proc.stderr
        reason = ('out of memory' if killed else
                  (proc.stderr.strip().splitlines() or ['failed'])[-1])
        return dict(stub, error=reason)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fmt(value, spec):
    return '' if value is None else format(value, spec)


def ratio_rows(results, against: str = 'reference'):
    """Speed-up and memory ratios at the same size, batch and mode: each XCiT
    variant against its ``@reference`` (``against='reference'``), or each
    runtime row against the eager PyTorch row of its model (``'eager'``)."""
    def key(r):
        return (r['model'].partition('@')[0], r['h'], r['w'], r['batch'],
                r['mode'])

    def is_baseline(r):
        return r['model'].endswith('@reference') if against == 'reference' \
            else '@' not in r['model']

    def compared(r):
        return against == 'reference' or \
            r['model'].partition('@')[2] in RUNTIMES

    refs = {key(r): r for r in results if 'error' not in r and is_baseline(r)}
    rows = []
    for r in results:
        ref = refs.get(key(r))
        if ref is None or r is ref or 'error' in r or not compared(r):
            continue
        rows.append(dict(
            model=r['model'], size=f'{r["h"]}x{r["w"]}', batch=r['batch'],
            mode=r['mode'], speedup=ref['seconds'] / r['seconds'],
            peak_mem_ratio=r['peak_mem_gib'] / ref['peak_mem_gib'],
            activation_mem_ratio=(r['activation_mem_gib'] /
                                  ref['activation_mem_gib']),
            diff=r.get('max_rel_diff_vs_reference'),
            export_s=r.get('export_s')))
    return rows


def scaling_rows(results, small=(800, 1344), large=(1600, 2688)):
    times = {}
    for r in results:
        if 'error' not in r:
            times[(r['model'], r['batch'], r['mode'], r['h'], r['w'])] = \
                r['seconds']
    rows = []
    for (model, batch, mode, h, w), t in times.items():
        if (h, w) == large and (model, batch, mode, *small) in times:
            rows.append((model, batch, mode,
                         t / times[(model, batch, mode, *small)]))
    return rows


def write_table(results, matmul, args, path):
    lines = [
        f'{args.threads} threads, device {args.device}; median of '
        f'{args.repeat} runs after {args.warmup} warm-up'
        + (f', median over {args.rounds} interleaved rounds' if
           args.rounds > 1 else '') + '; fp32 unless '
        f'"@bf16" / "@amp"; machine matmul ({args.matmul_size}^2): fp32 '
        f'{matmul["fp32_gflops_per_s"]:.0f} GFLOP/s, bf16 '
        f'{matmul["bf16_gflops_per_s"]:.0f} GFLOP/s. Memory: '
        + ('peak resident set of a fresh process per measurement (model '
           'and libraries included); "act." = that peak minus the resident '
           'set before the first step.' if args.device == 'cpu' else
           'torch.cuda.max_memory_allocated; "act." = that minus the memory '
           'allocated before the first step.'), '',
        '| model | input | batch | mode | time (s) | images/s | first call '
        '(s) | peak mem (GiB) | act. mem (GiB) | GMAC/image | executed '
        'GMAC/image | achieved GFLOP/s |',
        '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- '
        '| --- |'
    ]
    for r in results:
        size = f'{r["h"]}x{r["w"]}'
        head = f'| {r["model"]} | {size} | {r["batch"]} | {r["mode"]} | '
        if 'error' in r:
            lines.append(head + f'{r["error"]} | | | | | | | |')
            continue
        gmac = r.get('gmac_per_image')
        lines.append(
            head + f'{r["seconds"]:.3f} | {r["images_per_s"]:.2f} | '
            f'{r["first_call_s"]:.1f} | {r["peak_mem_gib"]:.2f} | '
            f'{r["activation_mem_gib"]:.2f} | '
            f'{_fmt(gmac, ".1f")} | '
            f'{_fmt(r.get("executed_gmac_per_image", gmac), ".1f")} | '
            f'{_fmt(r.get("achieved_gflops_per_s"), ".0f")} |')
    rows = ratio_rows(results)
    if rows:
        lines += [
            '', 'Against the straightforward computation (`@reference`), '
            'same run:', '',
            '| model | input | batch | mode | speed-up | peak mem ratio | '
            'act. mem ratio | max output diff (rel. to max) |',
            '| --- | --- | --- | --- | --- | --- | --- | --- |']
        for r in rows:
            lines.append(
                f'| {r["model"]} | {r["size"]} | {r["batch"]} | {r["mode"]} '
                f'| {r["speedup"]:.2f}x | {r["peak_mem_ratio"]:.2f} | '
                f'{r["activation_mem_ratio"]:.2f} | '
                f'{_fmt(r["diff"], ".1e")} |')
    rows = ratio_rows(results, against='eager')
    if rows:
        lines += [
            '', 'Runtimes against our eager PyTorch path (fast path on), '
            'same run (> 1: the runtime is faster):', '',
            '| model | input | batch | speed-up over eager | peak mem ratio | '
            'max output diff (rel. to max) | export + verification (s) |',
            '| --- | --- | --- | --- | --- | --- | --- |']
        for r in rows:
            lines.append(
                f'| {r["model"]} | {r["size"]} | {r["batch"]} | '
                f'{r["speedup"]:.2f}x | {r["peak_mem_ratio"]:.2f} | '
                f'{_fmt(r["diff"], ".1e")} | {_fmt(r["export_s"], ".0f")} |')
    scaling = scaling_rows(results)
    if scaling:
        lines += ['', 'Time at 1600x2688 over time at 800x1344 (4.0 is '
                  'linear in pixels):', '',
                  '| model | batch | mode | ratio |',
                  '| --- | --- | --- | --- |']
        lines += [f'| {m} | {b} | {mode} | {t:.2f} |'
                  for m, b, mode, t in scaling]
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def plot(results, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.4))
    series = {}
    for r in results:
        if 'error' not in r and r['mode'] == 'infer' and r['batch'] == 1 \
                and r['model'] not in DETECTORS:
            series.setdefault(r['model'], []).append(
                (r['h'] * r['w'], r['seconds'], r['peak_mem_gib']))
    for name, points in sorted(series.items()):
        points.sort()
        px = [p[0] / 1e6 for p in points]
        style = '--' if name.endswith('@reference') else '-'
        ax_t.plot(px, [p[1] for p in points], style, marker='o', label=name)
        ax_m.plot(px, [p[2] for p in points], style, marker='o', label=name)
    if series:
        lo = min(p[0] for s in series.values() for p in s) / 1e6
        hi = max(p[0] for s in series.values() for p in s) / 1e6
        ref = min(s[0][1] for s in series.values())
        ax_t.plot([lo, hi], [ref, ref * hi / lo], ':', color='grey',
                  label='linear in pixels')
        ax_t.legend(fontsize=7)
    from matplotlib.ticker import NullFormatter
    pixels = sorted({p[0] / 1e6 for s in series.values() for p in s})
    for ax, label in ((ax_t, 'forward time (s)'),
                      (ax_m, 'peak memory (GiB)')):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        if pixels:  # one labelled tick per measured size
            ticks = [v for i, v in enumerate(pixels)
                     if i == 0 or v > 1.2 * pixels[i - 1]]
            ax.set_xticks(ticks, [f'{v:.2g}' for v in ticks])
        ax.set_yticks(*_log_ticks(ax))
        ax.set_xlabel('pixels (millions)')
        ax.set_ylabel(label)
        ax.grid(True, which='both', alpha=0.3)
    fig.suptitle('Backbone inference, batch 1')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _log_ticks(ax):
    """Readable major ticks (1, 2, 5 x 10^k) within the y range."""
    lo, hi = ax.get_ylim()
    ticks = [m * 10**k for k in range(-3, 4) for m in (1, 2, 5)
             if lo <= m * 10**k <= hi]
    return ticks, [f'{t:g}' for t in ticks]


def parse_size(text):
    try:
        h, w = text.lower().split('x')
        return int(h), int(w)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'size must be HxW (e.g. 800x1344), got {text!r}')


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        epilog='See the module docstring (or README) for the model names.')
    parser.add_argument('--models', nargs='+',
                        default=['xcit_small_12_p16@reference',
                                 'xcit_small_12_p16', 'xcit_small_12_p8',
                                 *PEERS])
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        default=[(512, 512), (800, 1344), (1024, 1024),
                                 (1600, 2688)])
    parser.add_argument('--batch', nargs='+', type=int, default=[1, 2])
    parser.add_argument('--modes', nargs='+', choices=['infer', 'train'],
                        default=['infer', 'train'])
    parser.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    parser.add_argument('--threads', type=int, default=os.cpu_count())
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--rounds', type=int, default=1,
                        help='measure the whole list this many times, '
                        'interleaved (fresh processes), and report the '
                        'round with the median time')
    parser.add_argument('--timeout', type=float, default=900,
                        help='seconds per measurement')
    parser.add_argument('--matmul-size', type=int, default=4096,
                        help='N of the N x N reference matmul')
    parser.add_argument('--out-dir', default='work_dirs/benchmark')
    # internal: one measurement in a fresh process
    parser.add_argument('--worker', action='store_true',
                        help=argparse.SUPPRESS)
    parser.add_argument('--model', help=argparse.SUPPRESS)
    parser.add_argument('--size', type=parse_size, help=argparse.SUPPRESS)
    parser.add_argument('--mode', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.batch = args.batch[0]
        print(json.dumps(worker(args)))
        return
    for name in args.models:  # fail early on unknown names
        try:
            parse_model(name)
        except ValueError as err:
            parser.error(str(err))
    if args.warmup < 1:
        parser.error('--warmup must be at least 1 (the first call is '
                     'reported separately, never timed)')
    if args.device == 'cuda':
        import torch
        if not torch.cuda.is_available():
            parser.error('--device cuda: no CUDA device is available')
    elif any(parse_model(n)[0] in DETECTORS and 'amp' in parse_model(n)[1]
             for n in args.models):
        parser.error("a detector's @amp needs a GPU (--device cuda): "
                     "mmcv's CPU ops (RoIAlign, NMS) take fp32 only")

    os.makedirs(args.out_dir, exist_ok=True)
    matmul = measure('matmul', (0, 0), 1, 'infer', args)
    if 'error' in matmul:
        raise SystemExit(f'matmul measurement failed: {matmul["error"]}')
    print(f'matmul, {args.threads} threads: fp32 '
          f'{matmul["fp32_gflops_per_s"]:.0f} GFLOP/s, bf16 '
          f'{matmul["bf16_gflops_per_s"]:.0f} GFLOP/s', flush=True)
    runs = {}  # (model, size, batch, mode) -> one result per round
    for rnd in range(args.rounds):
        for name in args.models:
            for size in args.sizes:
                for batch in args.batch:
                    for mode in args.modes:
                        if mode == 'train' and not trainable(name):
                            continue
                        r = measure(name, size, batch, mode, args)
                        r['round'] = rnd
                        runs.setdefault((name, size, batch, mode),
                                        []).append(r)
                        print(json.dumps(r), flush=True)
                        # written as it goes: a cut-short run keeps its rows
                        write_outputs(runs, matmul, args)
    print(f'wrote {args.out_dir}/results.md, results.png, results.json')


def combine(rounds):
    """One row from the rounds of a measurement: the round with the median
    time (a failed round only if every round failed)."""
    ok = sorted((r for r in rounds if 'error' not in r),
                key=lambda r: r['seconds'])
    if not ok:
        return rounds[-1]
    row = dict(ok[(len(ok) - 1) // 2])
    row['rounds'] = len(ok)
    return row


def write_outputs(runs, matmul, args):
    results = [combine(rounds) for rounds in runs.values()]
    with open(osp.join(args.out_dir, 'results.json'), 'w') as f:
        json.dump(dict(matmul=matmul, threads=args.threads,
                       device=args.device, argv=sys.argv[1:],
                       results=results,
                       all_rounds=[r for rs in runs.values() for r in rs]),
                  f, indent=1)
    write_table(results, matmul, args, osp.join(args.out_dir, 'results.md'))
    plot(results, osp.join(args.out_dir, 'results.png'))


if __name__ == '__main__':
    main()
