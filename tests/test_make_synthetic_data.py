"""tools/make_synthetic_data.py: what it refuses, and a folder regenerated
holding exactly the new dataset."""
import json
import os

import pytest

from tool_runs import run_tool_here

TOOL = 'tools/make_synthetic_data.py'


@pytest.mark.parametrize('args, message', [
    (['--num-train', '-1'], "--num-train: expected a positive integer"),
    (['--num-train', '0'], "--num-train: expected a positive integer"),
    (['--num-val', '0'], "--num-val: expected a positive integer"),
    (['--seed', '-1'], '--seed: expected a whole number >= 0'),
])
def test_counts_and_seeds_out_of_range_are_refused(tmp_path, args, message):
    proc = run_tool_here(TOOL, 'coco', tmp_path / 'data', *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / 'data').exists()


def test_folders_that_cannot_be_written_are_one_paragraph(tmp_path):
    a_file = tmp_path / 'a_file'
    a_file.write_text('')
    for out, message in ((a_file, 'is a file'),
                         ('/proc/xcit_dense', 'cannot be written'),
                         ('', 'out_dir is empty')):
        proc = run_tool_here(TOOL, 'coco', out, '--num-train', '1')
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith('error: ') and message in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, names in os.walk(root) for f in names)


def test_regenerating_leaves_exactly_the_new_dataset(tmp_path):
    out = tmp_path / 'ade'
    sizes = ['--num-train', '3', '--num-val', '2']
    assert run_tool_here(TOOL, 'ade20k', out, *sizes).returncode == 0
    (out / 'notes.txt').write_text('mine')  # the user's, kept
    (out / 'images' / 'training' / 'photo.jpg').write_text('mine')
    proc = run_tool_here(TOOL, 'ade20k', out, '--num-train', '1',
                         '--num-val', '1')
    assert proc.returncode == 0, proc.stderr
    assert _files(out) == [
        'annotations/training/train_00000.png',
        'annotations/validation/valid_00000.png',
        'images/training/photo.jpg', 'images/training/train_00000.jpg',
        'images/validation/valid_00000.jpg', 'notes.txt', 'settings.json']
    settings = json.loads((out / 'settings.json').read_text())
    assert settings['kind'] == 'ade20k' and settings['num_train'] == 1
    # the same settings again: nothing is rewritten (make demo's rerun)
    stamp = (out / 'settings.json').stat().st_mtime_ns
    assert run_tool_here(TOOL, 'ade20k', out, '--num-train', '1',
                         '--num-val', '1').returncode == 0
    assert (out / 'settings.json').stat().st_mtime_ns == stamp
    # the other kind into this folder is refused, the folder untouched
    before = _files(out)
    proc = run_tool_here(TOOL, 'coco', out, '--num-train', '1',
                         '--num-val', '1')
    assert proc.returncode == 1 and 'holds a synthetic ade20k' in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert _files(out) == before
