"""Pre-flight checks of the data a run reads: every dataset's files and
folders, and the evaluators' annotation files."""
import os.path as osp
from typing import Iterator, Tuple

from ..errors import UserError


def _datasets(cfg) -> Iterator[Tuple[str, dict]]:
    """(split, dataset config) of every dataloader, wrappers unwrapped."""
    for split in ('train', 'val', 'test'):
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        stack = [loader.get('dataset')]
        while stack:
            ds = stack.pop()
            if not ds:
                continue
            if 'dataset' in ds:
                stack.append(ds['dataset'])
            elif 'datasets' in ds:
                stack.extend(ds['datasets'])
            else:
                yield split, ds


def check_datasets(cfg, splits) -> None:
    """Every annotation file and image / label directory must exist."""
    for split, ds in _datasets(cfg):
        if split not in splits:
            continue
        root = ds.get('data_root') or ''
        where = (f'the {split} dataset ({ds.get("type")}, data_root='
                 f'{root!r})')
        hint = (f'Generate or download the data, or point the config at it, '
                f'e.g. --cfg-options {split}_dataloader.dataset.data_root='
                '/path/to/data')
        if root and not osp.isdir(root):
            raise UserError(f'The data root of {where} does not exist: '
                            f'{root}. {hint}')
        ann = ds.get('ann_file')
        if ann:
            path = ann if osp.isabs(ann) else osp.join(root, ann)
            # mmseg's ann_file is optional and may name a split list.
            if not osp.isfile(path):
                raise UserError(f'The annotation file of {where} does not '
                                f'exist: {path}. {hint}')
        prefix = ds.get('data_prefix') or {}
        for key, rel in prefix.items():
            path = rel if osp.isabs(rel) else osp.join(root, rel)
            if rel and not osp.isdir(path):
                raise UserError(f'The {key} directory of {where} does not '
                                f'exist: {path}. {hint}')


def check_evaluators(cfg, splits) -> None:
    """Annotation files the evaluators read (mmdet's CocoMetric) must
    exist."""
    for split in splits:
        evaluators = cfg.get(f'{split}_evaluator') or []
        for evaluator in (evaluators if isinstance(evaluators, (list, tuple))
                          else [evaluators]):
            ann = (evaluator or {}).get('ann_file')
            if ann and not osp.isfile(ann):
                raise UserError(
                    f'The annotation file of the {split} evaluator '
                    f'({evaluator.get("type")}) does not exist: {ann}. Point '
                    f'the config at it, e.g. --cfg-options {split}_evaluator.'
                    'ann_file=/path/to/annotations.json')
