"""xcit-dense: the XCiT backbone for dense prediction on OpenMMLab 2.x.

Install the pinned stack with ``make install`` (it builds mmcv's compiled ops
against the pinned torch); ``pip install -e .`` alone expects torch, mmcv
(full, with ops) and the rest to be importable already.
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r"__version__ = '([^']+)'",
                    (HERE / 'xcit_dense' / '__init__.py').read_text()).group(1)


def requirements(name):
    lines = (HERE / 'requirements' / name).read_text().splitlines()
    return [ln.split('#')[0].strip() for ln in lines
            if ln.split('#')[0].strip()]


setup(
    name='xcit-dense',
    version=VERSION,
    description='XCiT (Cross-Covariance Image Transformer) backbone for '
    'detection and segmentation with mmdet 3 and mmsegmentation 1',
    long_description=(HERE / 'README.md').read_text(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    packages=find_packages(include=['xcit_dense', 'xcit_dense.*']),
    install_requires=requirements('runtime.txt'),
    extras_require={'tests': requirements('tests.txt')},
    license='Apache-2.0',
    classifiers=[
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)
