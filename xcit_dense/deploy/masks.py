"""Instance masks from a mask head's probabilities: each ``M x M`` map
resampled into its box in the image, the step an exported detector leaves
out of its graph (:class:`~xcit_dense.deploy.DetectorGraph`)."""
import torch
import torch.nn.functional as F


def paste_masks(probs: torch.Tensor, boxes: torch.Tensor, height: int,
                width: int, threshold: float = 0.5) -> torch.Tensor:
    """Boolean masks ``(K, height, width)`` of ``probs`` ``(K, M, M)`` laid
    over ``boxes`` ``(K, 4)`` (x1, y1, x2, y2 in the image's pixels), as
    mmdet's ``FCNMaskHead`` pastes them: each pixel centre inside a margin
    of one pixel around the box sampled bilinearly from the map (``M`` cells
    spanning the box, zero beyond it), then ``>= threshold``. Pixels further
    from the box stay False."""
    masks = torch.zeros(len(probs), height, width, dtype=torch.bool)
    for i, region, values in _pasted(probs, boxes, height, width):
        masks[(i, ) + region] = values >= threshold
    return masks


def paste_probs(probs: torch.Tensor, boxes: torch.Tensor, height: int,
                width: int) -> torch.Tensor:
    """The probabilities :func:`paste_masks` thresholds, ``(K, height,
    width)``, 0 beyond each box's margin."""
    pasted = torch.zeros(len(probs), height, width)
    for i, region, values in _pasted(probs, boxes, height, width):
        pasted[(i, ) + region] = values
    return pasted


def _pasted(probs, boxes, height: int, width: int):
    """For each box: its index, the region of the image it covers (the box
    and a one-pixel margin, clipped) and the values sampled there."""
    probs = torch.as_tensor(probs, dtype=torch.float32)
    boxes = torch.as_tensor(boxes, dtype=torch.float32)
    for i, ((x0, y0, x1, y1), prob) in enumerate(zip(boxes, probs)):
        left = max(int(torch.floor(x0)) - 1, 0)
        top = max(int(torch.floor(y0)) - 1, 0)
        right = min(int(torch.ceil(x1)) + 1, width)
        bottom = min(int(torch.ceil(y1)) + 1, height)
        if right <= left or bottom <= top:
            continue
        # pixel centres in the box's frame, -1 .. 1 from edge to edge
        xs = _box_frame(torch.arange(left, right) + 0.5, x0, x1)
        ys = _box_frame(torch.arange(top, bottom) + 0.5, y0, y1)
        grid = torch.stack(torch.broadcast_tensors(xs[None, :], ys[:, None]),
                           dim=-1)
        values = F.grid_sample(prob[None, None], grid[None],
                               align_corners=False)[0, 0]
        yield i, (slice(top, bottom), slice(left, right)), values


def _box_frame(centres: torch.Tensor, start: torch.Tensor,
               end: torch.Tensor) -> torch.Tensor:
    """Coordinates relative to ``[start, end]`` on -1 .. 1; 0 for a box of
    no extent (division by zero), as mmdet sets them."""
    frame = (centres - start) / (end - start) * 2 - 1
    return torch.where(torch.isinf(frame), torch.zeros_like(frame), frame)
