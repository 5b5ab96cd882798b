"""Pre-flight checks: every input a run reads (data, evaluator files, the
backbone's arguments, checkpoints) is checked before anything is written,
and a problem is one paragraph (:class:`~xcit_dense.errors.UserError`)."""
from ..checkpoint.published import is_published, refuse_resume
from ..checkpoint.resume import checkpoint_to_resume
from .checkpoints import (
    check_checkpoint,
    check_fits,
    check_pretrained,
    read_checked,
)
from .data import check_datasets, check_evaluators
from .model import check_backbone, check_channels, check_traced

__all__ = [
    'check_backbone', 'check_channels', 'check_checkpoint', 'check_datasets',
    'check_evaluators', 'check_fits', 'check_inputs', 'check_pretrained',
    'check_traced', 'read_checked'
]


def check_inputs(cfg, training: bool) -> None:
    """Fail early, before a work dir is written, on missing or bad inputs.

    Checkpoints given as URLs are downloaded here (once) and the config is
    pointed at the local copy, which is then read without arbitrary
    unpickling like any other file."""
    backbone = check_backbone(cfg)
    check_channels(cfg, backbone)
    check_datasets(cfg, ('train', 'val') if training else ('test', ))
    check_evaluators(cfg, ('val', ) if training else ('test', ))
    if training:
        check_traced(cfg, backbone)
        check_pretrained(cfg, backbone)
        checkpoint = None
        if cfg.get('resume') and not cfg.get('load_from'):
            # --resume without a path: the newest complete checkpoint of the
            # work dir (none: the run starts from the beginning)
            cfg.load_from, checkpoint = checkpoint_to_resume(cfg.work_dir)
        elif cfg.get('load_from'):
            what = ('checkpoint to resume from' if cfg.get('resume') else
                    'checkpoint to start from (load_from)')
            cfg.load_from, checkpoint = read_checked(cfg.load_from, what)
        if checkpoint is not None and cfg.get('resume') and \
                is_published(checkpoint):
            refuse_resume(cfg.load_from)
        if checkpoint is not None:
            # fine-tuning (load_from alone) may change the classes
            check_fits(cfg, checkpoint,
                       allow_new_classes=not cfg.get('resume'))
