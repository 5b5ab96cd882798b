"""Where a detector's or segmentor's training iteration spends its time, by
part of the model.

On the H200 Mask R-CNN XCiT-S12/16's AMP training step (batch 2, 800x1344)
took 166.2 ms with the backbone's step replayed from a CUDA graph (26 ms
alone), where Mask R-CNN Swin-T's took 153.7 ms: the parts around the
backbone are paced by the CPU's launches. This probe times one benchmark
row's steps (``tools/benchmark.py`` names: ``mask_rcnn_xcit_s12@amp+iter``,
``mask_rcnn_swin_t@amp+iter``, ``upernet_xcit_s12@amp+iter``, ...), built
as the benchmark builds them, and splits each step at the parts of
:data:`PARTS` (the data preprocessor, the backbone's and neck's forward,
the heads' losses) and,
for a whole iteration (``@iter``), at its optimizer wrapper's backward and
step (a row without ``@iter`` has its backward in ``between``):

* ``cpu_<phase>_ms``: the CPU's time from the phase's start to its end
  (its Python and launches; a phase that waits for the GPU, a loss
  computed from the proposals' count say, includes the wait);
* ``gpu_<phase>_ms`` (CUDA): the GPU's time between the events recorded
  at the phase's start and end (where the GPU waits for the CPU, its span
  is the CPU's);
* ``between`` phases: whatever runs outside the parts (the detector's
  copy of the data samples for its RPN, the loss's sum, ``train_step``'s
  bookkeeping).

Medians over ``--repeat`` steps after 3 warm-up steps (a CUDA graph of the
backbone's step is captured on the third). Run::

    python -m benchmarks.gpu.iteration_probe --out DIR \\
        --models mask_rcnn_xcit_s12@amp+iter mask_rcnn_swin_t@amp+iter \\
        [--size 800x1344] [--device cuda]

Writes one JSON line per model to ``DIR/iteration_probe.jsonl`` as it goes.
Each model is measured in this process, one after the other. With
``--profile``, one more step of each under PyTorch's profiler, its parts as
ranges: ``DIR/<model>_profile.txt``, the operators (and the parts) by self
CPU time and, on CUDA, by self GPU time.
"""
import argparse
import functools
import json
import os
import os.path as osp
import statistics
import time

import torch

from benchmarks.harness.matmul import synchronize
from benchmarks.harness.names import parse_model
from benchmarks.harness.subjects import step_of, subject

WARMUP = 3


class Marks:
    """The CPU's clock and (on CUDA) an event at each mark of a step; while
    ``ranges`` is on, each part also a range of PyTorch's profiler, named
    as its phase."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.marks = []
        self.ranges = False
        self._open = []

    def __call__(self, name: str) -> None:
        event = None
        if self.device == 'cuda':
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.marks.append((name, time.perf_counter(), event))
        if self.ranges and name.endswith('>'):
            self._open.append(torch.profiler.record_function(name[:-1]))
            self._open[-1].__enter__()
        elif self.ranges and name.endswith('<'):
            self._open.pop().__exit__(None, None, None)


#: the parts timed: (the model's attribute, the method; ``'forward'``: its
#: forward, by hooks): the data preprocessor (the batch to the device,
#: normalised and padded; mmdet's pads the masks too), the backbone and
#: neck, mmdet's RPN (forward and loss), its RoI head's loss, mmseg's heads'
#: losses (where the model has them)
PARTS = (('data_preprocessor', 'forward'), ('backbone', 'forward'),
         ('neck', 'forward'),
         ('rpn_head', 'loss_and_predict'), ('roi_head', 'loss'),
         ('decode_head', 'loss'), ('auxiliary_head', 'loss'))


def _marked(owner, method: str, name: str, marks: Marks) -> None:
    """``owner.method`` marked at its start and end (on this instance, for
    the probe)."""
    original = getattr(owner, method)

    @functools.wraps(original)
    def marked(*args, **kwargs):
        marks(f'{name}>')
        out = original(*args, **kwargs)
        marks(f'{name}<')
        return out
    setattr(owner, method, marked)


def instrument(model, wrapper, marks: Marks) -> None:
    """Marks at the start and end of each part of :data:`PARTS` that the
    model has, and of the optimizer wrapper's backward and step (a whole
    iteration's)."""
    for name, method in PARTS:
        part = getattr(model, name, None)
        if not isinstance(part, torch.nn.Module):
            continue
        if method == 'forward':
            part.register_forward_pre_hook(
                lambda *_, name=name: marks(f'{name}>'))
            part.register_forward_hook(
                lambda *_, name=name: marks(f'{name}<'))
        else:
            _marked(part, method, f'{name}.{method}', marks)
    if wrapper is not None:
        for method in ('backward', 'step'):
            _marked(wrapper, method, f'optim_wrapper.{method}', marks)


def phases(marks) -> dict:
    """A step's marks as phases: each part between its start and end mark
    (a part called twice adds up), and 'between' for the rest."""
    cpu, gpu = {}, {}
    for (a, ta, ea), (b, tb, eb) in zip(marks, marks[1:]):
        name = a[:-1] if a.endswith('>') and b == a[:-1] + '<' \
            else 'between'
        cpu[name] = cpu.get(name, 0.0) + (tb - ta) * 1e3
        if ea is not None:
            gpu[name] = gpu.get(name, 0.0) + ea.elapsed_time(eb)
    return cpu, gpu


#: rows of each table of ``--profile``
PROFILE_ROWS = 30


def profiled(step, marks: Marks, device: str, path: str) -> None:
    """One more step under PyTorch's profiler, the parts as ranges of their
    own; writes to ``path`` its operators by self CPU time (the host's
    work, which paces a step whose GPU waits for it) and, on CUDA, by self
    GPU time, :data:`PROFILE_ROWS` rows each."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if device == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    synchronize(device)
    marks.marks.clear()  # the timed steps' medians are taken
    marks.ranges = True
    try:
        with profile(activities=activities) as prof:
            step()
            synchronize(device)
    finally:
        marks.ranges = False
    averages = prof.key_averages()
    orders = [('self CPU time', 'self_cpu_time_total')]
    if device == 'cuda':
        orders.append(('self GPU time', 'self_device_time_total'))
    with open(path, 'w') as f:
        for title, key in orders:
            f.write(f'# {title}\n')
            f.write(averages.table(sort_by=key, row_limit=PROFILE_ROWS))
            f.write('\n\n')


def probe(name: str, size, batch: int, device: str, repeat: int,
          profile_to: str = None) -> dict:
    base, variants = parse_model(name)
    args = argparse.Namespace(model=name, size=size, batch=batch,
                              mode='train', device=device, threads=None,
                              out_dir=None, published_code=None)
    torch.manual_seed(0)
    item = subject(args, base, variants)
    step = step_of(item, args, variants)
    marks = Marks(device)
    instrument(item.model, item.iteration, marks)
    cpu, gpu, wall = {}, {}, []
    for i in range(WARMUP + repeat):
        synchronize(device)
        marks.marks.clear()
        marks('start')
        step()
        marks('end')
        synchronize(device)
        if i < WARMUP:
            continue
        wall.append((marks.marks[-1][1] - marks.marks[0][1]) * 1e3)
        for into, got in zip((cpu, gpu), phases(marks.marks)):
            for phase, ms in got.items():
                into.setdefault(phase, []).append(ms)
    if profile_to is not None:
        profiled(step, marks, device, profile_to)
    row = dict(model=name, size=f'{size[0]}x{size[1]}', batch=batch,
               device=device, wall_ms=statistics.median(wall))
    for prefix, table in (('cpu', cpu), ('gpu', gpu)):
        for phase, values in table.items():
            row[f'{prefix}_{phase}_ms'] = statistics.median(values)
    backbone = getattr(item.model, 'backbone', None)
    graphs = getattr(backbone, 'training_graphs', None)
    if graphs is not None:
        row['training_graphs_captures'] = graphs.captures
    if item.iteration is not None:
        row['param_groups'] = len(item.iteration.optimizer.param_groups)
    if device == 'cuda':
        row.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', required=True)
    parser.add_argument('--models', nargs='+', required=True)
    parser.add_argument('--size', default='800x1344')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--repeat', type=int, default=10)
    parser.add_argument('--profile', action='store_true',
                        help='also one step under PyTorch\'s profiler per '
                        'model: DIR/<model>_profile.txt')
    args = parser.parse_args()
    size = tuple(map(int, args.size.split('x')))
    for name in args.models:  # bad names before anything is built
        try:
            parse_model(name)
        except ValueError as error:
            parser.error(str(error))
    os.makedirs(args.out, exist_ok=True)
    results = osp.join(args.out, 'iteration_probe.jsonl')
    open(results, 'w').close()
    for name in args.models:
        profile_to = osp.join(args.out, name.replace('@', '_').replace(
            '+', '_') + '_profile.txt') if args.profile else None
        row = probe(name, size, args.batch, args.device, args.repeat,
                    profile_to)
        print(json.dumps(row), flush=True)
        with open(results, 'a') as f:
            f.write(json.dumps(row) + '\n')
        if args.device == 'cuda':
            torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
