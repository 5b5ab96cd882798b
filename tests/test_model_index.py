"""The model index (model-index.yml, configs/*/metafile.yml): the 24
published models with their configs, published metrics and weights, shipped
in the wheel as mmdet ships its own (xcit_dense/.mim), found by name."""
import os
import re
import shutil
import subprocess
import sys
import venv

import pytest
import yaml

from conftest import REPO

PUBLISHED = 'https://dl.fbaipublicfiles.com/xcit/'


def _index():
    with open(REPO / 'model-index.yml') as f:
        imports = yaml.safe_load(f)['Import']
    models = []
    for path in imports:
        with open(REPO / path) as f:
            models += yaml.safe_load(f)['Models']
    return models


def test_index_lists_the_24_published_models():
    models = [m for m in _index() if 'Weights' in m]
    assert len(models) == 24
    kinds = {m['In Collection'] for m in models}
    assert kinds == {'XCiT Mask R-CNN', 'XCiT UperNet', 'XCiT Semantic FPN'}
    for m in models:
        config = REPO / m['Config']
        assert config.is_file(), m['Config']
        assert config.stem == m['Name']
        size, patch = re.search(r'xcit_(\w\d+)_p(\d+)', m['Name']).groups()
        long = {'t12': 'tiny_12', 's12': 'small_12', 's24': 'small_24',
                'm24': 'medium_24'}[size]
        assert m['Metadata']['Pretrained'] == (
            f'{PUBLISHED}xcit_{long}_p{patch}_384_dist.pth')
        kind = {'XCiT Mask R-CNN': 'coco/maskrcnn',
                'XCiT UperNet': 'ade/upernet',
                'XCiT Semantic FPN': 'ade/sem_fpn'}[m['In Collection']]
        assert m['Weights'] == f'{PUBLISHED}{kind}_xcit_{long}_p{patch}.pth'
        # the config trains from that checkpoint and states the same metrics
        text = config.read_text()
        assert f'xcit_{long}_p{patch}_384_dist.pth' in text
        metrics = [v for r in m['Results'] for v in r['Metrics'].values()]
        stated = re.search(r'Published (?:box / mask AP|mIoU): ([\d./ ]+)',
                           text).group(1)
        assert [float(v) for v in stated.split(' / ')] == metrics, m['Name']


@pytest.mark.parametrize('collection', [
    'XCiT Cascade Mask R-CNN', 'XCiT Mask2Former (COCO instance)',
    'XCiT Mask2Former (ADE20K)'])
def test_index_lists_the_stronger_heads_without_results(collection):
    """Cascade Mask R-CNN and Mask2Former: 8 configs each by name, and no
    XCiT result exists for them: no metrics, no weights."""
    entries = [m for m in _index() if m['In Collection'] == collection]
    assert len(entries) == 8
    for m in entries:
        assert (REPO / m['Config']).is_file() and \
            (REPO / m['Config']).stem == m['Name']
        assert 'Results' not in m and 'Weights' not in m


def test_tools_take_a_model_name():
    """A published model's name and a stronger head's (loaded once, not
    once per collection above)."""
    from xcit_dense.cli import load_config
    from xcit_dense.model_index import config_file, model_for_weights
    cfg = load_config('upernet_xcit_s12_p8_160k_ade20k')
    assert cfg.model.backbone.arch == 'small_12_p8'
    cfg = load_config('cascade_mask_rcnn_xcit_m24_p8_3x_coco')
    assert cfg.model.backbone.arch == 'medium_24_p8'
    assert config_file('no_such_model') is None
    entry = model_for_weights(f'{PUBLISHED}coco/maskrcnn_xcit_small_12_p8.pth')
    assert entry['Name'] == 'mask_rcnn_xcit_s12_p8_3x_coco'


def test_installed_wheel_finds_its_configs(tmp_path):
    """`pip install .` ships configs, tools and the index in xcit_dense/.mim;
    a model builds from an installed config name in a fresh environment."""
    # built from a copy of the tracked files: pip builds in the source tree,
    # and setup.py would replace the checkout's editable .mim symlinks with
    # copies that go stale at the next new config
    source = tmp_path / 'source'
    tracked = subprocess.run(['git', '-C', str(REPO), 'ls-files', '-z'],
                             capture_output=True, text=True, check=True)
    for name in filter(None, tracked.stdout.split('\0')):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    env_dir = tmp_path / 'fresh'
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / 'bin' / 'python'
    site = subprocess.run(
        [str(python), '-c', 'import sysconfig; '
         'print(sysconfig.get_paths()["purelib"])'],
        capture_output=True, text=True, check=True).stdout.strip()
    # pip builds the wheel and installs it, in one process
    proc = subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '--no-deps',
         '--no-build-isolation', '--no-compile', '--target', site,
         str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # the stack (torch, mmdet, ...) from this environment, behind the wheel;
    # the source checkout is not on the path
    deps = [p for p in sys.path if p.endswith('site-packages')]
    (tmp_path / 'fresh_stack.pth').write_text('\n'.join(deps))
    os.replace(tmp_path / 'fresh_stack.pth', os.path.join(site,
                                                          'zz_stack.pth'))
    script = """
import os, xcit_dense
from xcit_dense.cli import load_config
from xcit_dense.model_index import index_root, models
from mmengine.registry import init_default_scope
assert index_root().endswith(os.path.join('xcit_dense', '.mim')), index_root()
assert sum('Weights' in m for m in models().values()) == 24
assert len(models()) == 48
cfg = load_config('mask_rcnn_xcit_t12_p16_3x_coco')
init_default_scope('mmdet')
from mmdet.registry import MODELS
model = MODELS.build(cfg.model)
print('built', type(model).__name__, type(model.backbone).__name__,
      xcit_dense.__file__)
"""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    proc = subprocess.run([str(python), '-c', script], cwd=tmp_path,
                          capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'built MaskRCNN XCiT' in proc.stdout
    assert str(site) in proc.stdout  # the installed package, not the source
    tools = os.path.join(site, 'xcit_dense', '.mim', 'tools', 'train.py')
    assert os.path.isfile(tools)
