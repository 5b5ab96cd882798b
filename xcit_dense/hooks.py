"""Runner hooks of the ``xcit_dense`` scope."""
from mmengine.hooks import Hook
from mmengine.logging import print_log

from .checkpoint.published import (check_model_weights, convert_published,
                                   is_published)
from .errors import CheckpointError
from .registry import HOOKS


@HOOKS.register_module()
class CheckpointImportHook(Hook):
    """Loads whole-model checkpoints (``tools/test.py``, ``load_from``) the
    way this package loads backbones: published layouts converted in memory,
    every key checked.

    On mmengine's ``after_load_checkpoint`` (called by
    ``Runner.load_checkpoint`` and ``Runner.resume`` with the checkpoint
    just read), a checkpoint in the layout of the published XCiT detectors
    and segmentors (mmdet 2.11 / mmseg 0.11) is converted to ours, each
    change logged, and compared with the model strictly: a missing,
    unexpected or differently shaped weight is an error naming the keys.
    Loading with ``load_from`` (fine-tuning) may change the number of
    classes: the class-dependent output layers that differ in shape are then
    left freshly initialised and named in the log. Resuming from a published
    checkpoint is refused (it holds no optimizer state of ours).
    """

    priority = 'VERY_HIGH'

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        published = is_published(checkpoint)
        if published and runner._resume:
            raise CheckpointError(
                'Cannot resume from a published XCiT checkpoint (mmdet 2 / '
                'mmseg 0 layout): it holds no optimizer or scheduler state '
                'of this toolkit. Fine-tune from it with load_from=FILE and '
                'without --resume, or evaluate it with tools/test.py.')
        if published:
            converted, changes = convert_published(checkpoint)
            checkpoint.clear()
            checkpoint.update(converted)
            print_log('Converted a published XCiT checkpoint to the mmdet '
                      '3 / mmseg 1 layout: ' + '; '.join(changes) + '.',
                      logger='current')
        model = runner.model
        while hasattr(model, 'module'):  # DDP, test-time augmentation
            model = model.module
        state_dict = checkpoint.get('state_dict', checkpoint)
        state_dict = {k[len('module.'):] if k.startswith('module.') else k: v
                      for k, v in state_dict.items()}
        weights, reinit = check_model_weights(
            state_dict, model.state_dict(),
            allow_new_classes=not runner._resume
            and runner._load_from is not None)
        if reinit:
            print_log(
                'Fine-tuning to other classes: the class-dependent layers '
                f'{", ".join(reinit)} differ in shape from the checkpoint '
                'and stay freshly initialised.', logger='current')
        if 'state_dict' in checkpoint:
            checkpoint['state_dict'] = weights
        else:
            checkpoint.clear()
            checkpoint.update(weights)
