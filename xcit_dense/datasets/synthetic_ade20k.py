"""A small synthetic ADE20K-format semantic-segmentation dataset, made by code.

Layout as ADE20K: ``images/{training,validation}/*.jpg`` and
``annotations/{training,validation}/*.png``. Label maps hold 0 for "ignore"
(thin unlabeled outlines around objects, as ADE20K's unlabeled pixels) and
1..5 for the classes below, so ``reduce_zero_label=True`` maps them to
0..4 with 255 ignored. Each image: a textured background, sometimes a band of
stripes, and a few discs, squares and triangles in random colours. The same
``seed`` always gives the same files.
"""
import os
import os.path as osp
from typing import Dict

import cv2
import numpy as np

from . import generate_once
from .drawing import shape_polygon, textured_background

CLASSES = ('background', 'disc', 'square', 'triangle', 'stripes')
VERSION = 1
_SHAPES = {2: 'circle', 3: 'square', 4: 'triangle'}


def make_sample(rng: np.random.Generator, h: int, w: int):
    """One image and its label map (0 ignore, 1..5 classes)."""
    img = textured_background(rng, h, w)
    label = np.ones((h, w), np.uint8)
    if rng.random() < 0.5:  # a band of stripes
        y0 = int(rng.integers(0, h // 2))
        y1 = y0 + int(rng.integers(h // 8, h // 3))
        period = rng.uniform(3, 6)
        stripes = 127 + 127 * np.sign(np.sin(np.arange(w) / period))
        img[y0:y1] = 0.5 * img[y0:y1] + 0.5 * stripes[None, :, None]
        label[y0:y1] = 5
    for _ in range(int(rng.integers(1, 5))):
        value = int(rng.integers(2, 5))
        r = rng.uniform(0.08, 0.2) * min(h, w)
        cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
        pts = np.round(shape_polygon(_SHAPES[value], cx, cy, r,
                              rng.uniform(0, 2 * np.pi)) * 8).astype(np.int32)
        cv2.fillPoly(img, [pts], rng.uniform(0, 255, 3).tolist(),
                     lineType=cv2.LINE_AA, shift=3)
        cv2.fillPoly(label, [pts], value, shift=3)
        cv2.polylines(label, [pts], True, 0, thickness=1, shift=3)
    img = np.clip(img + rng.normal(0, 4, img.shape), 0, 255)
    return img.astype(np.uint8), label


def make_synthetic_ade20k(out_dir: str, num_train: int = 300,
                          num_val: int = 60, seed: int = 0,
                          size=(128, 128)) -> Dict[str, str]:
    """Write both splits (skipped when already there with these settings)."""
    settings = dict(kind='ade20k', version=VERSION, num_train=num_train,
                    num_val=num_val, seed=seed, size=list(size))
    splits = dict(training=(num_train, seed), validation=(num_val, seed + 1))

    def write():
        for split, (num, split_seed) in splits.items():
            rng = np.random.default_rng(split_seed)
            for sub in ('images', 'annotations'):
                os.makedirs(osp.join(out_dir, sub, split), exist_ok=True)
            for i in range(num):
                img, label = make_sample(rng, *size)
                name = f'{split[:5]}_{i:05d}'
                cv2.imwrite(osp.join(out_dir, 'images', split, name + '.jpg'),
                            img, [cv2.IMWRITE_JPEG_QUALITY, 95])
                cv2.imwrite(osp.join(out_dir, 'annotations', split,
                                     name + '.png'), label)

    generate_once(out_dir, settings, write,
                  [osp.join(out_dir, sub, s) for s in splits
                   for sub in ('images', 'annotations')])
    return {s: osp.join(out_dir, 'images', s) for s in splits}
