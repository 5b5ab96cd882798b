"""Benchmark dense backbones and detectors: latency, memory and FLOPs by size.

Every row is measured in a fresh process, so its peak memory is its own: on
the CPU the peak resident set of that process (model and libraries included,
plus "activation memory" = peak minus the resident set before the first step),
on CUDA ``torch.cuda.max_memory_allocated`` plus the memory CUDA graphs'
private pools hold unallocated (their activations); ``--in-process``, for
quick runs, measures the rows one after another in the tool's process (the
same code timed; a row's peak memory includes what earlier rows left).
Warm-up runs are excluded (the first call's time is reported separately: it
includes ``torch.compile``), the median of the timed runs is reported,
threads are stated. FLOPs come from
mmengine's counter (fvcore's convention: one multiply-add counts as one FLOP,
so "GMAC") on the published design (for XCiT: the straightforward path, the
same for every variant); what an XCiT row's own variant executes (its
fast paths' routes: XCA from second moments where the policy says they
pay, at any size for ``@always``) is counted separately with
``torch.utils.flop_counter``, under which the fast paths run in standard
operators. A training row counts its whole step, forward
and backward, with ``torch.utils.flop_counter`` on one more step with every
fast path off (its grouped-convolution backward corrected: each gradient as
many multiply-adds as the forward). Achieved GFLOP/s counts 2 FLOPs per
executed multiply-add and is shown next to the machine's measured fp32 (and
bf16) matmul throughput.

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
      always     ``fast_path='always'``: every fast path, whatever the
                 policy says for the device (the default row follows it:
                 on the CPU and on CUDA, every fast path too);
      compile    ``compile_cfg=True`` (torch.compile, Inductor);
      graphs     ``cuda_graphs='train'``: inference and training steps on
                 CUDA replayed from a CUDA graph per input shape (a training
                 step from its third call: give --warmup 3 or more);
      bf16       ``autocast_dtype='bfloat16'``: the backbone under bf16
                 autocast (on CUDA too: no loss scaling, against ``amp``'s
                 float16), fp32 maps out; the output difference to fp32 is
                 reported;
      cp         ``with_cp=True`` (gradient checkpointing);
      published  the published detection backbone itself (facebookresearch/
                 xcit ``detection/backbone/xcit.py``, the file
                 ``--published-code`` names, run as it is written; with
                 ``amp`` alone), its own weight initialisation; inference
                 rows report its outputs' difference to our straightforward
                 computation on its weights; the baseline of a second ratio
                 table;
      amp        mixed precision as mmengine's ``AmpOptimWrapper`` runs it:
                 the whole step under ``torch.autocast`` (float16 on CUDA,
                 bfloat16 on the CPU);
      onnxruntime, openvino  inference only, fp32: the model exported to ONNX
                 at the measured size by ``tools/export_onnx.py``'s code
                 (verified against PyTorch; export time reported apart, in a
                 process of its own) and run by onnxruntime / OpenVINO
                 (f32 precision hint) with the same threads;
      (int8 quantizes a whole detector or segmentor, below, not a
                 backbone alone.)
  swin_t, r50        mmdet's Swin-T and ResNet-50 backbones;
  vit_s16, vit_b16   timm's ViT-S/16 and ViT-B/16, global attention, position
                     embeddings resized to the input;
  mask_rcnn_xcit_s12[@variant], mask_rcnn_swin_t[@amp+iter]   whole Mask R-CNN
      detectors (our configs/coco/mask_rcnn_xcit_s12.py, its backbone as the
      recipe sets it: ``compile_cfg='auto'``, eager today, and
      ``cuda_graphs='auto'``, on CUDA a step replayed from its third call
      at one size; and mmdet's
      Swin-T 1x config): infer = ``model.predict`` on preprocessed inputs
      with the box score threshold at 0 so that 100 detections per image
      reach the mask head; train = one ``loss`` + backward with 5
      ground-truth boxes and masks per image. Variants: reference (backbone
      ``fast_path=False``, eager: the straightforward baseline), always
      (backbone ``fast_path='always'``: on CUDA its Triton kernels), eager
      (backbone ``cuda_graphs=False``), amp, bf16
      (inference: ``AutocastPartsHook``'s parts in bf16, backbone, neck and
      heads, the post-processing between them in fp32), iter (train only:
      a whole iteration as mmengine's loop runs it, ``model.train_step``
      on the data loader's batch with the recipe's optimizer wrapper built
      as the Runner builds it: data preprocessor, loss, backward,
      optimizer step; with amp on CUDA mmengine's ``AmpOptimWrapper``, as
      ``tools/train.py --amp``), onnxruntime,
      openvino: the whole detector as exported
      (``xcit_dense.deploy.DetectorGraph``, one image, random weights with
      the classifiers sharpened so that 100 detections reach the mask head
      as in the PyTorch rows); int8 with a runtime (``@onnxruntime+int8``):
      that file quantized as ``tools/export_onnx.py --int8`` quantizes it,
      calibrated on 4 random images (speed only: accuracy is measured with
      the dataset, see docs/deploy.md).
  upernet_xcit_s12[@variant]  the whole UperNet XCiT-S12/16 segmentor
      (configs/ade20k/upernet_xcit_s12.py, 150 classes): inference as
      exported, image in, logits and labels at the image's size out
      (``xcit_dense.deploy.SegmentorGraph``); train = one ``loss`` +
      backward of the mmseg model (backbone as the recipe sets it) on random
      labels. Variants reference, always (backbone ``fast_path='always'``),
      eager (backbone ``cuda_graphs=False``), compile (inference), amp,
      iter (train only, as the detectors'), onnxruntime, openvino (+int8).

A model is measured in the modes of ``--modes`` that it has (a runtime's
rows are inference, an ``@iter`` row is training); a model that none of
them measures is refused before any measurement. So are ``@bf16`` rows,
and ``@amp`` rows on the CPU (bf16 autocast there), on a CPU without native
bf16 (AVX-512 BF16, AMX, Arm BF16), where they would time PyTorch's
emulation of bf16; there the reference matmul is fp32 alone.

Writes ``results.json`` (each row with the fingerprint of the code it
measured), ``results.md`` (tables, and the ratios of every XCiT
variant to its ``@reference`` measured in the same run, and to its
``@published`` where one was; with ``--rounds``, the ratio of the rows'
median rounds and each round's) and ``results.png``
(inference time and memory against pixel count, log-log). ``--record``
appends the run to the machine's file of ``benchmarks/results/``, from
which ``python -m benchmarks.tables`` regenerates the docs' tables.

The same command: ``python -m benchmarks.benchmark`` from the repository's
root.
"""
import argparse
import itertools
import json
import os

from benchmarks.harness import (
    inferable,
    parse_model,
    run_measurement,
    trainable,
    write_outputs,
)
from benchmarks.harness.matmul import (
    matmul_rates,
    matmul_summary,
)
from benchmarks.harness.names import (
    DETECTORS,
    PEERS,
    refuse_emulated_bf16,
    single_mode,
    usage,
)
from benchmarks.harness.published import load_published_code
from benchmarks.harness.record import record_runs
from benchmarks.results import RESULTS
from xcit_dense.cli import check_output, positive_int, run_cli
from xcit_dense.errors import UserError


def parse_size(text):
    try:
        h, w = text.lower().split('x')
        h, w = int(h), int(w)
    except ValueError:
        h = w = 0
    if min(h, w) < 1:
        raise argparse.ArgumentTypeError(
            f'size must be HxW with H, W >= 1 (e.g. 800x1344), got {text!r}')
    return h, w


def positive_seconds(text):
    """An argparse type: a number of seconds > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f'{text} is not a number of '
                                         'seconds > 0')
    return value


DEFAULT_MODELS = ['xcit_small_12_p16@reference', 'xcit_small_12_p16',
                  'xcit_small_12_p8', *PEERS]
DEFAULT_SIZES = [(512, 512), (800, 1344), (1024, 1024), (1600, 2688)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        epilog=f'Models: {usage()}. What each is: the docstring of '
        'benchmarks/benchmark.py (or docs/performance.md).')
    parser.add_argument(
        '--models', nargs='+', metavar='MODEL',
        default=DEFAULT_MODELS,
        help='what to measure, each row in a fresh process (unless '
        '--in-process): '
        'xcit_<preset>[@variant+...], a peer backbone, a detector or the '
        'segmentor (names and variants: below; default: '
        f'{" ".join(DEFAULT_MODELS)})')
    parser.add_argument('--sizes', nargs='+', type=parse_size,
                        metavar='HxW', default=DEFAULT_SIZES,
                        help='input sizes, height x width (default: '
                        f'{" ".join(f"{h}x{w}" for h, w in DEFAULT_SIZES)})')
    parser.add_argument('--batch', nargs='+', type=int, default=[1, 2],
                        help='batch sizes (default: 1 2)')
    parser.add_argument('--modes', nargs='+', choices=['infer', 'train'],
                        default=['infer', 'train'],
                        help='inference (no autograd) and/or a training '
                        'step, forward and backward (default: infer '
                        'train)')
    parser.add_argument('--device', choices=['cpu', 'cuda'], default='cpu',
                        help='where to measure (default: cpu)')
    parser.add_argument('--threads', type=positive_int,
                        default=os.cpu_count(),
                        help="PyTorch's (and the runtimes') threads per "
                        'measurement (default: the CPU count, %(default)s '
                        'here)')
    parser.add_argument('--repeat', type=int, default=3,
                        help='timed runs per measurement, of which the '
                        'median is reported (default: 3)')
    parser.add_argument('--warmup', type=int, default=1,
                        help='untimed runs before them, the first call '
                        'reported apart (default: 1)')
    parser.add_argument('--rounds', type=int, default=1,
                        help='measure the whole list this many times, '
                        'interleaved (fresh processes), and report the '
                        'round with the median time (default: 1)')
    parser.add_argument('--timeout', type=positive_seconds, default=900,
                        help='seconds per measurement (default: 900)')
    parser.add_argument('--in-process', action='store_true',
                        help='measure the rows one after another in this '
                        'process, not each in a fresh one: a quick run, '
                        'without the few seconds of imports per row and '
                        "without --timeout; each row's peak memory is then "
                        "the process's during its steps, what earlier rows "
                        'left included (default: a fresh process per row)')
    parser.add_argument('--matmul-size', type=positive_int, default=4096,
                        help='N of the N x N reference matmul (default: '
                        '4096)')
    add_output_options(parser)
    return parser


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """Where the run is written, and the published code it may run."""
    parser.add_argument('--out-dir', default='work_dirs/benchmark',
                        help='folder of results.md, results.json and '
                        'results.png (default: work_dirs/benchmark)')
    parser.add_argument('--published-code', metavar='XCIT_PY',
                        help="the published backbone's file for the "
                        "'@published' rows: detection/backbone/xcit.py of "
                        "github.com/facebookresearch/xcit")
    parser.add_argument('--record', nargs='?', const=str(RESULTS),
                        metavar='DIR',
                        help="append the run to this machine's results file "
                        'in DIR (without DIR: benchmarks/results/), one '
                        'run per code scope, each row with the fingerprint '
                        'of the code it measured; then python -m '
                        "benchmarks.tables regenerates the docs' tables "
                        '(default: not recorded)')


def check_args(parser, args) -> None:
    """Bad names and settings end with one line, before any measurement."""
    for name in args.models:
        try:
            parse_model(name)
        except ValueError as err:
            parser.error(str(err))
    for name in args.models:  # a model that no given mode measures
        only = single_mode(name)
        if only is not None and only[0] not in args.modes:
            parser.error(f'{name} measures nothing with --modes '
                         f'{" ".join(args.modes)}: {only[1]}; give --modes '
                         f'{only[0]} (or leave it out of --models)')
    published = [n for n in args.models if 'published' in parse_model(n)[1]]
    if published:
        if not args.published_code:
            parser.error(
                f'{published[0]} runs the published backbone as it is '
                f'written: give --published-code with the path of '
                f'detection/backbone/xcit.py of '
                f'https://github.com/facebookresearch/xcit (not part of this '
                f'package)')
        try:
            load_published_code(args.published_code)
        except UserError as error:
            parser.error(str(error))
    for name in ('batch', 'repeat', 'rounds'):
        values = getattr(args, name)
        if min(values if isinstance(values, list) else [values]) < 1:
            parser.error(f'--{name} must be at least 1, got {values}')
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
    emulated = refuse_emulated_bf16(args.models, args.device)
    if emulated:
        parser.error(emulated)


def main():
    parser = build_parser()
    args = parser.parse_args()
    check_args(parser, args)
    check_output(args.out_dir, '--out-dir', folder=True)
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        matmul = matmul_rates(args.device, args.matmul_size, args.repeat,
                              args.threads)
    except RuntimeError as error:  # no such device, out of its memory
        raise SystemExit(f'the reference matmul failed on {args.device}: '
                         f'{error}')
    print(f'matmul, {args.threads} threads: {matmul_summary(matmul)}',
          flush=True)
    runs = {}  # (model, size, batch, mode) -> one result per round
    for rnd, name, size, batch, mode in itertools.product(
            range(args.rounds), args.models, args.sizes, args.batch,
            args.modes):
        if (mode == 'train' and not trainable(name)) or \
                (mode == 'infer' and not inferable(name)):
            continue
        r = run_measurement(name, size, batch, mode, args)
        r['round'] = rnd
        runs.setdefault((name, size, batch, mode), []).append(r)
        print(json.dumps(r), flush=True)
        # written as it goes: a cut-short run keeps its rows
        doc = write_outputs(runs, matmul, args)
    print(f'wrote {args.out_dir}/results.md, results.png, results.json')
    if args.record:
        for path, run_id in record_runs(doc, args, args.record):
            print(f'recorded run {run_id} in {path}')


if __name__ == '__main__':
    run_cli(main)
