"""Where the backbone compiled with dynamic image sizes differs from eager,
by part.

On the H200 (PyTorch 2.11) Inductor's compiled training forward of a tiny
XCiT-N12 with the images' height and width marked dynamic differed from
eager by 1.1e-3 of the largest value in level 0 or 1 (TF32 off), where the
static compilation is within 1e-4 (``tests/test_cuda.py``,
``test_compiled_backbone_matches_eager``); dynamo and AOTAutograd alone
(``--backend aot_eager``) give eager's outputs to 3e-7. This probe compiles,
one after the other, with H and W marked dynamic (``mark_dynamic``) as
multi-scale training varies them, in training mode, TF32 off, the fast
paths that pay only for large inputs taken at any size (as the test
does), with the backbone's compile options (``inductor_fixes``):

* ``whole``: the backbone's forward (``compile_cfg=dict(dynamic=None)``,
  as the test), its levels and the largest gradient difference;
* ``taps``: the stem, the positional encoding and the blocks, to the
  block outputs the levels are made of;
* ``resampler<i>``: each level's resampler alone (the pyramid's
  transposed convolutions, BatchNorm and GELU, or pooling), on the eager
  taps; and for each up-sampler its straightforward computation
  (``resampler<i>, straightforward``: ``nn.ConvTranspose2d``,
  ``nn.BatchNorm2d``, ``nn.GELU`` as PyTorch's modules, compiled and
  eager alike), which tells our fast path under the compiler (its token
  GEMMs, BatchNorm on a channels-last view) from PyTorch's own modules
  under dynamic shapes (pytorch/pytorch#180740 reports a training-mode
  BatchNorm accuracy regression with Inductor on CUDA under dynamic shapes
  only);

each at ``--sizes`` (one compilation serves them), against the same part
run eagerly on the same inputs: the largest difference as a fraction of
the eager output's largest value (or of 1 where that is smaller), of the
outputs and of the inputs' and parameters' gradients of a weighted sum
(``call_s``: the compiled call's seconds, the first size's with its
compilation). A bias before a training-mode BatchNorm has a gradient that
is zero in exact arithmetic: its rounding noise (about 3e-5 to 7e-5 of 1 on
the CPU, ``fpn1.0.bias``) may be the largest. On the CPU with
``--backend aot_eager`` every row is within 7e-5 (2-core Intel Xeon, 30 s).
Run on a CUDA machine::

    python -m benchmarks.gpu.compile_probe --out DIR \\
        [--sizes 64x96 128x64 96x160] [--backend inductor]

Writes one JSON line per part and size to ``DIR/compile_probe.jsonl`` as
it goes (``--device cpu`` runs it on the CPU, where Inductor's code is
C++, not Triton).
"""
import argparse
import copy
import json
import os
import os.path as osp
import time

import torch

from xcit_dense import XCiT
from xcit_dense.models.execution.compile import inductor_fixes
from xcit_dense.models.ops import onednn, second_moments
from xcit_dense.models.pyramid import TransposedConvUpsampler


def relative(out, ref):
    """The largest difference as a fraction of ``ref``'s largest value, or
    of 1 where that is smaller (as the tests compare)."""
    return ((out.float() - ref.float()).abs().max() /
            max(ref.float().abs().max().item(), 1.0)).item()


def step(function, inputs, params, mark=False):
    """``function``'s outputs and the gradients of a weighted sum of them
    with respect to ``inputs`` (leaves; with ``mark`` their height and
    width marked dynamic) and ``params``."""
    inputs = [i.detach().requires_grad_() for i in inputs]
    for leaf in inputs if mark else ():
        torch._dynamo.mark_dynamic(leaf, 2)
        torch._dynamo.mark_dynamic(leaf, 3)
    for p in params:
        p.grad = None
    outs = function(*inputs)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    loss = sum((o.float() * torch.linspace(-1, 1, o.numel(),
                                           device=o.device).view_as(o)).sum()
               for o in outs)
    loss.backward()
    grads = [i.grad for i in inputs] + [p.grad for p in params]
    return [o.detach() for o in outs], grads


class Params(list):
    """A module's parameters, with their names (for the rows)."""

    def __init__(self, module):
        self.names = [n for n, _ in module.named_parameters()]
        super().__init__(p for _, p in module.named_parameters())


def compare(name, size, function, compiled, inputs, params,
            compiled_params=None):
    """One row: ``compiled`` against ``function`` on ``inputs``
    (``params``: :class:`Params` of ``function``, and of ``compiled``
    unless it has its own, ``compiled_params``, in the same order)."""
    start = time.perf_counter()
    outs, grads = step(compiled, inputs, compiled_params or params,
                       mark=True)
    seconds = time.perf_counter() - start
    refs, ref_grads = step(function, inputs, params)
    names = [f'input{i}' for i in range(len(inputs))] + params.names
    worst = max((relative(g, r), n) for g, r, n in
                zip(grads, ref_grads, names)
                if g is not None and r is not None)
    return dict(part=name, size=size,
                outputs=[relative(o, r) for o, r in zip(outs, refs)],
                worst_gradient=worst[0], worst_gradient_of=worst[1],
                call_s=round(seconds, 3))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', required=True)
    parser.add_argument('--sizes', nargs='+',
                        default=['64x96', '128x64', '96x160'])
    parser.add_argument('--backend', default='inductor')
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--parts', nargs='+',
                        default=['whole', 'taps', 'resamplers'],
                        choices=['whole', 'taps', 'resamplers'])
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = osp.join(args.out, 'compile_probe.jsonl')
    # TF32 off; the fast paths that pay only for large inputs taken at any
    # size, as the test's fixture does (fast_paths_at_any_size); all put
    # back at the end
    saved = (torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32, second_moments.pays,
             onednn.pays)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    second_moments.pays = lambda x: True
    onednn.pays = lambda backend, x: True
    try:
        probe(args, results)
    finally:
        (torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_tf32, second_moments.pays,
         onednn.pays) = saved
        torch._dynamo.reset()


def probe(args, results):
    """The rows of ``args.parts``, written to ``results``."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = XCiT('nano_12_p16', depth=4, out_indices=(0, 1, 2, 3),
                 compile_cfg=None).to(device).train()
    sizes = [tuple(int(v) for v in s.split('x')) for s in args.sizes]
    images = [torch.randn(2, 3, h, w, device=device) for h, w in sizes]
    environment = dict(torch=torch.__version__, backend=args.backend,
                       device=(torch.cuda.get_device_name()
                               if device.type == 'cuda' else 'cpu'))

    def write(row):
        row.update(environment)
        print(json.dumps(row), flush=True)
        with open(results, 'a') as f:
            f.write(json.dumps(row) + '\n')

    def run(name, function, inputs_by_size, params):
        torch._dynamo.reset()
        compiled = torch.compile(function, **inductor_fixes(
            dict(backend=args.backend, dynamic=None)))
        for (h, w), inputs in zip(sizes, inputs_by_size):
            try:
                row = compare(name, f'{h}x{w}', function, compiled,
                              inputs, params)
            except Exception as error:  # a row says why it failed
                row = dict(part=name, size=f'{h}x{w}',
                           error=f'{type(error).__name__}: {error}'[:500])
            write(row)

    if 'whole' in args.parts:
        torch._dynamo.reset()
        compiled_model = copy.deepcopy(model)
        compiled_model.compile_cfg = dict(dynamic=None, backend=args.backend)
        for (h, w), x in zip(sizes, images):
            row = compare('whole', f'{h}x{w}', model, compiled_model,
                          [x], Params(model), Params(compiled_model))
            row.update(compile_failure=compiled_model.compile_failure)
            write(row)
    if 'taps' in args.parts:
        run('taps', model.forward_taps, [[x] for x in images], Params(model))
    if 'resamplers' in args.parts:
        with torch.no_grad():
            taps = [model.forward_taps(x) for x in images]
        for level, resampler in enumerate(model.resamplers):
            inputs = [[t[level]] for t in taps]
            run(f'resampler{level}', resampler, inputs, Params(resampler))
            if isinstance(resampler, TransposedConvUpsampler):
                plain = copy.deepcopy(resampler)
                plain.use_fast_path = False
                run(f'resampler{level}, straightforward', plain, inputs,
                    Params(plain))


if __name__ == '__main__':
    main()
