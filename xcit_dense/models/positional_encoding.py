"""The Fourier positional encoding, computed for any token grid."""
import threading
from collections import OrderedDict

import torch
import torch.nn as nn
from timm.models.xcit import PositionalEncodingFourier

from . import paths, policy
from .paths import Decision

# One lock for every encoding's cache (a lock per module would not pickle):
# a model served from several threads looks its grids up, inserts and
# evicts them one thread at a time.
_CACHE_LOCK = threading.Lock()

CACHED = 'cached'


class CachedFourierEncoding(PositionalEncodingFourier):
    """timm's Fourier positional encoding (sine / cosine features of the
    normalised row and column positions, then a learned 1x1 projection),
    computed for whatever grid the image gives.

    Fast path: the features depend only on the grid and the encoding's
    settings (``hidden_dim``, ``temperature``, ``scale``, ``eps``), so they
    are computed once per grid size, device, dtype and settings and kept
    (the ``cache_size`` most recently used; a setting changed between calls
    is a new entry); the projection runs on every call, so gradients and
    weight updates are honoured, and the result is broadcast over the batch
    instead of copied. Its values are identical to the straightforward
    computation's. Safe to call from several threads at once. Not cached
    while ``torch.compile`` traces or a CUDA graph captures (computed in the
    graph instead: a captured graph must not read a tensor the cache may
    drop).
    """
    use_fast_path = True

    def __init__(self, *args, cache_size: int = 32, **kwargs):
        super().__init__(*args, **kwargs)
        self.cache_size = cache_size
        self._features: 'OrderedDict[tuple, torch.Tensor]' = OrderedDict()

    def forward(self, B: int, H: int, W: int) -> torch.Tensor:
        """The (B, dim, H, W) encoding of an H x W token grid."""
        weight = self.token_projection.weight
        if paths.note(self, self._decide(weight)):
            feats = self.cached_features(H, W, weight.device, weight.dtype)
            return self.token_projection(feats).expand(B, -1, -1, -1)
        feats = self.fourier_features(H, W, weight.device, weight.dtype)
        return self.token_projection(feats).repeat(B, 1, 1, 1)

    def _decide(self, weight: torch.Tensor) -> Decision:
        """The cache, for an ``nn.Conv2d`` projection, outside
        ``torch.compile``'s tracing and CUDA graph captures."""
        decision = policy.decide(self, CachedFourierEncoding, weight, CACHED)
        if decision.path is None:
            return decision
        if type(self.token_projection) is not nn.Conv2d:
            return Decision(None, paths.TYPE_REPLACED)
        if torch.compiler.is_compiling():
            return Decision(None, paths.COMPILING)
        if weight.is_cuda and torch.cuda.is_current_stream_capturing():
            return Decision(None, paths.CAPTURING)
        return decision

    def fourier_features(self, H: int, W: int, device: torch.device,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Un-projected encoding of an ``H x W`` grid, ``(1, 2*hidden, H, W)``
        in channels-last memory, computed in float32 (as timm does) and cast
        to ``dtype``."""
        y = torch.arange(1, H + 1, device=device, dtype=torch.float32)
        x = torch.arange(1, W + 1, device=device, dtype=torch.float32)
        y = (y / (y[-1] + self.eps) * self.scale).view(1, H, 1, 1)
        x = (x / (x[-1] + self.eps) * self.scale).view(1, 1, W, 1)
        dim_t = torch.arange(
            self.hidden_dim, device=device, dtype=torch.float32)
        dim_t = self.temperature**(
            2 * torch.div(dim_t, 2, rounding_mode='floor') / self.hidden_dim)
        pos_x = (x / dim_t).expand(1, H, W, self.hidden_dim)
        pos_y = (y / dim_t).expand(1, H, W, self.hidden_dim)
        pos_x = torch.stack([pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()],
                            dim=4).flatten(3)
        pos_y = torch.stack([pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()],
                            dim=4).flatten(3)
        feats = torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)
        return feats.to(dtype)

    def cached_features(self, H: int, W: int, device: torch.device,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """:meth:`fourier_features`, kept per grid, device, dtype and
        settings."""
        key = (H, W, device, dtype, self.hidden_dim, self.temperature,
               self.scale, self.eps)
        with _CACHE_LOCK:
            feats = self._features.get(key)
            if feats is not None:
                self._features.move_to_end(key)
                return feats
        # a normal tensor even under torch.inference_mode(), so that a
        # training step may use it later
        with torch.inference_mode(False):
            feats = self.fourier_features(H, W, device, dtype)
        with _CACHE_LOCK:
            self._features[key] = feats
            while len(self._features) > self.cache_size:
                self._features.popitem(last=False)
        return feats
