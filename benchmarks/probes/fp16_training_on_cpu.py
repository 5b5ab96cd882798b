"""``tools/train.py`` with fp16 autocast and a dynamic loss scaler on the
CPU: what ``--amp`` does on a GPU (mmengine's ``AmpOptimWrapper``, which
needs one), to tell what fp16 arithmetic does to a model's training from
what CUDA's kernels do.

Everything autocast puts in fp16 on a GPU runs in fp16 here too (linear
layers, matrix products), except the convolutions: PyTorch's CPU has no
fast fp16 convolution backward (0.4 s a call at the demos' sizes, 14 s of
a Mask2Former demo step's 16), so they run in fp32. Ops that CUDA runs in
its own fp16 kernels and the CPU does not (mmcv's multi-scale deformable
attention, which falls back to ``grid_sample`` here, in fp32 under
autocast) are not what a GPU runs either. The loss scaler is PyTorch's
(``torch.amp.GradScaler('cpu')``, initial scale 2**16), unscaled before
the config's gradient clipping as ``AmpOptimWrapper`` does; its scale is
logged as ``loss_scale``.

    python -m benchmarks.probes.fp16_training_on_cpu CONFIG [tools/train.py
        options]

Compare its log and metrics with the same config trained in fp32
(``tools/train.py CONFIG``; the demos fix their seed).
"""
import os.path as osp
import runpy
import sys
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@OPTIM_WRAPPERS.register_module(force=True)  # run again in one process
class CPUFloat16OptimWrapper(AmpOptimWrapper):
    """``AmpOptimWrapper`` (its scaled backward, unscaled clipping and
    scaler step) with fp16 autocast and PyTorch's loss scaler on the CPU,
    where its own ``__init__`` asks for a GPU and mmengine's ``autocast``
    allows bf16 only."""

    def __init__(self, **kwargs):
        OptimWrapper.__init__(self, **kwargs)
        self._scale_update_param = None
        self.loss_scaler = torch.amp.GradScaler('cpu')
        self.cast_dtype = torch.float16

    def step(self, **kwargs):
        super().step(**kwargs)
        self.message_hub.update_scalar('train/loss_scale',
                                       self.loss_scaler.get_scale())

    @contextmanager
    def optim_context(self, model):
        with OptimWrapper.optim_context(self, model), torch.autocast(
                'cpu', dtype=self.cast_dtype):
            yield


_conv2d = F.conv2d


def conv2d_in_fp32(input, weight, bias=None, *args, **kwargs):
    """``F.conv2d`` in fp32 under the CPU's autocast (see above)."""
    if not torch.is_autocast_enabled('cpu'):
        return _conv2d(input, weight, bias, *args, **kwargs)
    with torch.autocast('cpu', enabled=False):
        return _conv2d(input.float(), weight.float(),
                       None if bias is None else bias.float(),
                       *args, **kwargs)


def main():
    F.conv2d = conv2d_in_fp32
    args = sys.argv[1:]
    option = 'optim_wrapper.type=CPUFloat16OptimWrapper'
    if '--cfg-options' in args:
        args.insert(args.index('--cfg-options') + 1, option)
    else:
        args += ['--cfg-options', option]
    sys.argv = ['tools/train.py', *args]
    try:
        runpy.run_path(osp.join(REPO, 'tools', 'train.py'),
                       run_name='__main__')
    finally:
        F.conv2d = _conv2d


if __name__ == '__main__':
    main()
