"""Drawing the synthetic images: shape outlines and textured backgrounds,
shared by the synthetic COCO and ADE20K datasets."""
import cv2
import numpy as np


def shape_polygon(kind: str, cx: float, cy: float, r: float,
                  angle: float) -> np.ndarray:
    """Vertices (K, 2) of a ``'circle'`` (32 points), ``'square'`` or
    ``'triangle'`` of circumradius ``r`` centred at (cx, cy), rotated by
    ``angle`` radians."""
    if kind == 'circle':
        t = np.linspace(0, 2 * np.pi, 32, endpoint=False)
    elif kind == 'square':
        t = np.arange(4) * np.pi / 2 + np.pi / 4
    else:
        t = np.arange(3) * 2 * np.pi / 3
    t = t + angle
    return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], axis=1)


def textured_background(rng: np.random.Generator, h: int,
                        w: int) -> np.ndarray:
    """An ``h x w x 3`` float image: a random colour with smooth noise and
    vertical stripes, in [0, 255]."""
    base = rng.uniform(60, 190, size=3)
    noise = rng.normal(0, 12, size=(h // 8 + 1, w // 8 + 1, 3))
    noise = cv2.resize(noise, (w, h), interpolation=cv2.INTER_LINEAR)
    stripes = 15 * np.sin(np.arange(w) / rng.uniform(4, 12))[None, :, None]
    return np.clip(base + noise + stripes, 0, 255)
