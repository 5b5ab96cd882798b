"""A small synthetic COCO-format instance-segmentation dataset, made by code.

Images show a few kinds of shapes (circle, square, triangle) in random
colours on a textured background; some overlap, the later one occluding the
earlier (annotations are the visible part, as in COCO), and some images have
no object at all. Annotations are COCO polygons. The same ``seed`` always
gives the same files.
"""
import json
import os
import os.path as osp
from typing import Dict, List

import cv2
import numpy as np
from shapely.geometry import Polygon

from . import generate_once
from .drawing import shape_polygon, textured_background

CLASSES = ('circle', 'square', 'triangle')
VERSION = 1  # bump when the generator changes


def make_image(rng: np.random.Generator, h: int, w: int,
               max_objects: int, empty_prob: float):
    """One image and its visible-part polygons ``[(class_id, polygon)]``."""
    img = textured_background(rng, h, w)
    n = 0 if rng.random() < empty_prob else int(rng.integers(1, max_objects
                                                              + 1))
    placed: List[tuple] = []  # (class_id, shapely polygon of visible part)
    for _ in range(n):
        for _attempt in range(20):
            cls = int(rng.integers(len(CLASSES)))
            r = rng.uniform(0.1, 0.22) * min(h, w)
            cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
            pts = shape_polygon(CLASSES[cls], cx, cy, r,
                                rng.uniform(0, 2 * np.pi))
            poly = Polygon(pts)
            # Occlusion may hide part of an earlier object, never most of
            # it, and must leave it in one piece without holes.
            visible = [(c, p.difference(poly)) for c, p in placed]
            if all(v.geom_type == 'Polygon' and not v.interiors
                   and v.area > 0.5 * p.area
                   for (_, v), (_, p) in zip(visible, placed)):
                placed = visible + [(cls, poly)]
                color = rng.uniform(0, 255, size=3)
                cv2.fillPoly(img, [np.round(pts * 8).astype(np.int32)],
                             color.tolist(), lineType=cv2.LINE_AA, shift=3)
                break
    img = np.clip(img + rng.normal(0, 4, size=img.shape), 0, 255)
    return img.astype(np.uint8), placed


def make_split(out_dir: str, split: str, num_images: int, seed: int,
               size=(128, 128), max_objects: int = 4,
               empty_prob: float = 0.1) -> str:
    """Write ``out_dir/<split>/*.png`` and ``annotations/<split>.json``."""
    rng = np.random.default_rng(seed)
    h, w = size
    os.makedirs(osp.join(out_dir, split), exist_ok=True)
    os.makedirs(osp.join(out_dir, 'annotations'), exist_ok=True)
    images, annotations = [], []
    for i in range(num_images):
        img, objects = make_image(rng, h, w, max_objects, empty_prob)
        name = f'{i:05d}.png'
        cv2.imwrite(osp.join(out_dir, split, name), img)
        images.append(dict(id=i, file_name=name, height=h, width=w))
        for cls, poly in objects:
            coords = np.asarray(poly.exterior.coords)[:-1]
            x0, y0, x1, y1 = poly.bounds
            annotations.append(dict(
                id=len(annotations) + 1, image_id=i, category_id=cls + 1,
                segmentation=[coords.round(2).ravel().tolist()],
                area=round(poly.area, 2),
                bbox=[round(x0, 2), round(y0, 2), round(x1 - x0, 2),
                      round(y1 - y0, 2)],
                iscrowd=0))
    ann_file = osp.join(out_dir, 'annotations', f'{split}.json')
    with open(ann_file, 'w') as f:
        json.dump(dict(
            info=dict(description='xcit-dense synthetic shapes',
                      version=VERSION, seed=seed),
            images=images, annotations=annotations,
            categories=[dict(id=i + 1, name=n, supercategory='shape')
                        for i, n in enumerate(CLASSES)]), f)
    return ann_file


def make_synthetic_coco(out_dir: str, num_train: int = 400,
                        num_val: int = 100, seed: int = 0,
                        size=(128, 128)) -> Dict[str, str]:
    """Generate the train and val splits (skipped when already there with
    the same settings)."""
    settings = dict(kind='coco', version=VERSION, num_train=num_train,
                    num_val=num_val, seed=seed, size=list(size))
    files = dict(train=osp.join(out_dir, 'annotations', 'train.json'),
                 val=osp.join(out_dir, 'annotations', 'val.json'))

    def write():
        make_split(out_dir, 'train', num_train, seed, size)
        make_split(out_dir, 'val', num_val, seed + 1, size)

    generate_once(out_dir, settings, write, files.values())
    return files


__all__ = ['CLASSES', 'make_synthetic_coco', 'make_split', 'make_image']
