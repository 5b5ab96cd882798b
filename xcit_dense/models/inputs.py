"""The backbone's checks of its input: a batch of images it can take, or
one paragraph that says what was wrong and what is allowed
(:class:`~xcit_dense.errors.InputError`, a ``ValueError``, which the tools
print as it is)."""
import torch

from ..errors import InputError
from .pyramid import smallest_grid

#: the images' dtypes that autocast casts for the stem's convolutions
CAST_BY_AUTOCAST = (torch.float32, torch.float16, torch.bfloat16)


def _shape_of(x: object) -> str:
    """``x`` for a message: a tensor's shape, else its type."""
    return f'shape {tuple(x.shape)}' if isinstance(x, torch.Tensor) \
        else f'a {type(x).__name__}'


def check_images(model, x: torch.Tensor) -> None:
    """``x`` is what the backbone takes, or one paragraph: a batch of
    images of the stem's channels, in its weights' dtype (under
    autocast, which casts them: float32, float16 or bfloat16)."""
    channels = model.in_channels
    if not hasattr(x, 'dim') or x.dim() != 4 or \
            x.shape[1] != channels or min(x.shape[0], *x.shape[2:]) < 1:
        raise InputError(
            f'XCiT takes a batch of images, a tensor of shape (B, '
            f'{channels}, H, W) with B, H, W >= 1; got '
            f'{_shape_of(x)}.')
    dtype = next(p.dtype for p in model.patch_embed.parameters())
    autocast = torch.is_autocast_enabled(x.device.type)
    if x.dtype != dtype and not (autocast and x.dtype in CAST_BY_AUTOCAST):
        raise InputError(
            f"XCiT takes images in its weights' dtype ({dtype}; under "
            f'torch.autocast float32, float16 or bfloat16), got '
            f'{x.dtype}: convert them (x.to({dtype})), or the model '
            f'(model.to({x.dtype})) for another floating dtype.')


def check_image_size(model, x: torch.Tensor) -> None:
    """Images whose token grid the pyramid's max-pooling maps to one
    row and column at least (``out_sizes='published'`` rounds down),
    or one paragraph."""
    side, p = smallest_grid(model.resamplers), model.patch_size
    H, W = x.shape[-2:]
    if min((H + p - 1) // p, (W + p - 1) // p) >= side:
        return
    pixels = p * (side - 1) + 1
    raise InputError(
        f'XCiT(out_sizes={model.out_sizes!r}) max-pools its grid of '
        f'ceil(H / {p}) x ceil(W / {p}) tokens by {side} x {side}, '
        f'rounding down as the published backbone does, which takes '
        f'images of at least {pixels} x {pixels} pixels; got shape '
        f'{tuple(int(n) for n in x.shape)}. Pad the images (as '
        f"mmdet's and mmseg's data preprocessors do with "
        f'pad_size_divisor / size_divisor), '
        f"or build the backbone with out_sizes='ceil' (levels of "
        f'ceil(H / s) x ceil(W / s) for any H, W >= 1).')
