"""The CPU's oneDNN calls against the number of tokens: the MLP's and LPI's
fast paths on oneDNN (fused epilogues in inference) and the same fast paths
on PyTorch's standard operators, which ``onednn.pays`` takes for inputs of
fewer than ``onednn.MIN_VALUES`` values (each oneDNN call costs more before
its arithmetic, which larger calls repay).

Times a block's MLP and LPI branches (``residual_forward``: pre-norm, the
branch, layer scale, residual) of a randomly initialised backbone on
(batch, H*W, C) tokens of square grids, each backend in turn
(``use_fast_path='always'``, oneDNN at any size, and
``fast_path(fused_kernels=False)``) for ``--rounds`` rounds, the fastest
round of each, fp32, in inference and in training (forward and backward);
prints the ratio (standard operators / oneDNN: above 1 oneDNN is faster)
and the backend the package takes::

    python -m benchmarks.probes.onednn_size [--arch nano_12_p16]
        [--grids 4 8 12 16 20 24 32 48] [--batch 2] [--threads 2]
"""

import torch

from benchmarks.harness.measure import timed
from benchmarks.probes import parse_branch_args
from xcit_dense import XCiT, fast_path
from xcit_dense.models.ops import onednn


def main(argv=None) -> None:
    args, timing = parse_branch_args(
        __doc__.split('\n\n')[0], 'nano_12_p16', 'grids',
        [4, 8, 12, 16, 20, 24, 32, 48], argv)
    block = XCiT(args.arch).blocks[0]
    channels = block.mlp.fc1.in_features
    print(f'XCiT {args.arch} MLP + LPI branches, C = {channels}, batch '
          f'{args.batch}, {args.threads} threads')
    for mode in ('inference', 'training'):
        training = mode == 'training'
        block.train(training)
        print(f'\nfp32 {mode}: grid, tokens of the batch, values, standard '
              'ms, oneDNN ms, ratio, taken')
        for side in args.grids:
            rows = args.batch * side * side
            x = torch.randn(args.batch, side * side, channels,
                            requires_grad=training)

            def run():
                with torch.set_grad_enabled(training):
                    y = block.mlp.residual_forward(
                        x, block.norm2, block.gamma2, block.drop_path2)
                    y = block.local_mp.residual_forward(
                        y, side, side, block.norm3, block.gamma3,
                        block.drop_path3)
                    if training:
                        y.sum().backward()

            ms = {}
            for _ in range(args.rounds):
                for backend in ('standard', 'oneDNN'):
                    setting = 'always' if backend == 'oneDNN' else True
                    block.mlp.use_fast_path = setting
                    block.local_mp.use_fast_path = setting
                    with fast_path(fused_kernels=backend == 'oneDNN'):
                        ms.setdefault(backend, []).append(
                            timed(run, timing)['seconds'] * 1e3)
            block.mlp.use_fast_path = block.local_mp.use_fast_path = True
            with torch.set_grad_enabled(training):
                taken = onednn.select_backend(x, stochastic=False,
                                              by_size=True)
            standard, fused = min(ms['standard']), min(ms['oneDNN'])
            print(f'{side:3d}x{side:<3d} {rows:6d} {x.numel():8d} '
                  f'{standard:9.2f} '
                  f'{fused:9.2f} {standard / fused:6.2f} '
                  f'{"standard" if taken == "torch" else "oneDNN"}',
                  flush=True)


if __name__ == '__main__':
    main()
