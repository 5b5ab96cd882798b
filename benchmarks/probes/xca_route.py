"""XCA's two CPU routes against the number of tokens: its straightforward
computation (four token GEMMs: q, k, v and the output projection) and the
second moments of its input (two token GEMMs and C x C products that cost
about 3 C^3 multiply-adds per image), which ``second_moments.pays`` takes
from ``MIN_TOKENS_PER_CHANNEL`` tokens per channel on.

Times a block's attention branch (``XCA.residual_forward``: pre-norm,
attention, layer scale, residual) of a randomly initialised backbone on
(batch, N, C) tokens, each route in turn (``use_fast_path`` ``False`` and
``'always'``) for ``--rounds`` rounds, the fastest round of each, in fp32
and under bf16 autocast, in inference and in training (forward and
backward); prints the ratio (straightforward / second moments: above 1 the
second moments are faster) and the route the package takes::

    python -m benchmarks.probes.xca_route [--arch small_12_p16]
        [--tokens 64 256 384 576 768 1024 1536 2048 4200] [--threads 2]
"""

import torch

from benchmarks.harness.measure import timed
from benchmarks.probes import parse_branch_args
from xcit_dense import XCiT
from xcit_dense.models.ops import second_moments


def main(argv=None) -> None:
    args, timing = parse_branch_args(
        __doc__.split('\n\n')[0], 'small_12_p16', 'tokens',
        [64, 256, 384, 576, 768, 1024, 1536, 2048, 4200], argv)
    block = XCiT(args.arch).blocks[0]
    attn, channels = block.attn, block.attn.qkv.in_features
    print(f'XCiT {args.arch} attention branch, C = {channels}, batch '
          f'{args.batch}, {args.threads} threads')
    for precision in ('fp32', 'bf16'):
        for mode in ('inference', 'training'):
            training = mode == 'training'
            print(f'\n{precision} {mode}: tokens (per channel), '
                  'straightforward ms, second moments ms, ratio, taken')
            for tokens in args.tokens:
                x = torch.randn(args.batch, tokens, channels,
                                requires_grad=training)
                autocast = torch.autocast('cpu', dtype=torch.bfloat16,
                                          enabled=precision == 'bf16')

                def run():
                    with autocast, torch.set_grad_enabled(training):
                        y = attn.residual_forward(x, block.norm1,
                                                  block.gamma1,
                                                  block.drop_path1)
                        if training:
                            y.float().sum().backward()

                ms = {}
                for _ in range(args.rounds):
                    for setting in (False, 'always'):
                        attn.use_fast_path = setting
                        ms.setdefault(setting, []).append(
                            timed(run, timing)['seconds'] * 1e3)
                with autocast, torch.set_grad_enabled(training):
                    taken = second_moments.pays(x)
                plain, moments = min(ms[False]), min(ms['always'])
                print(f'{tokens:6d} ({tokens / channels:5.2f} C) '
                      f'{plain:9.2f} {moments:9.2f} {plain / moments:6.2f} '
                      f'{"second moments" if taken else "straightforward"}',
                      flush=True)


if __name__ == '__main__':
    main()
