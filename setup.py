"""xcit-dense: the XCiT backbone for dense prediction on OpenMMLab 2.x.

Install the pinned stack with ``make install`` (it builds mmcv's compiled ops
against the pinned torch); ``pip install -e .`` alone expects torch, mmcv
(full, with ops) and the rest to be importable already.
"""
import os
import re
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r"__version__ = '([^']+)'",
                    (HERE / 'xcit_dense' / '__init__.py').read_text()).group(1)


def requirements(name):
    lines = (HERE / 'requirements' / name).read_text().splitlines()
    return [ln.split('#')[0].strip() for ln in lines
            if ln.split('#')[0].strip()]


def add_mim_extension():
    """Put the configs, tools and model index into ``xcit_dense/.mim``, where
    mim (and :mod:`xcit_dense.model_index`) find them, as mmdet does: copied
    when a wheel or sdist is built (``pip install .``), symlinked for an
    editable install (``pip install -e .``)."""
    if {'develop', 'editable_wheel'} & set(sys.argv):
        mode = 'symlink'
    elif {'bdist_wheel', 'sdist', 'build', 'install'} & set(sys.argv):
        mode = 'copy'
    else:
        return
    mim = HERE / 'xcit_dense' / '.mim'
    mim.mkdir(exist_ok=True)
    for name in ('configs', 'tools', 'model-index.yml'):
        src, dst = HERE / name, mim / name
        if dst.is_symlink() or dst.is_file():
            dst.unlink()
        elif dst.is_dir():
            shutil.rmtree(dst)
        if mode == 'symlink':
            os.symlink(os.path.relpath(src, mim), dst)
        elif src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(
                '__pycache__', '*.pyc'))
        else:
            shutil.copyfile(src, dst)


add_mim_extension()
setup(
    name='xcit-dense',
    version=VERSION,
    description='XCiT (Cross-Covariance Image Transformer) backbone for '
    'detection and segmentation with mmdet 3 and mmsegmentation 1',
    long_description=(HERE / 'README.md').read_text(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    packages=find_packages(include=['xcit_dense', 'xcit_dense.*']),
    include_package_data=True,  # xcit_dense/.mim, see MANIFEST.in
    install_requires=requirements('runtime.txt'),
    extras_require={'tests': requirements('tests.txt'),
                    'deploy': requirements('deploy.txt')},
    license='Apache-2.0',
    classifiers=[
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)
