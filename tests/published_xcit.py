"""The forward of the published XCiT detection / segmentation backbone,
restated from its formulas for the tests: facebookresearch/xcit
``detection/backbone/xcit.py`` (``semantic_segmentation/backbone/xcit.py`` is
the same), ``XCiT.forward_features`` and the modules it calls, written with
``torch.nn.functional`` over a state dict with the published key names. No
code of this package is used, so a test can compare the package with it.

The published pyramid: patch 16: ``fpn1`` = transposed conv, BN, GELU,
transposed conv; ``fpn2`` = transposed conv; ``fpn3`` = identity; ``fpn4`` =
``nn.MaxPool2d(kernel_size=2, stride=2)``. Patch 8: ``fpn1`` = transposed
conv; ``fpn2`` = identity; ``fpn3`` = max-pool 2; ``fpn4`` = max-pool 4.
Nothing cropped. BatchNorm is the published code's ``nn.SyncBatchNorm``, on
one process PyTorch's batch norm (momentum 0.1, eps 1e-5).
"""
import math

import torch
import torch.nn.functional as F


class Recorded(dict):
    """A state dict that records the keys read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def _bn(s, prefix, x, training):
    if training:  # what nn.BatchNorm2d counts in training mode
        s[prefix + 'num_batches_tracked'].add_(1)
    return F.batch_norm(x, s[prefix + 'running_mean'],
                        s[prefix + 'running_var'], s[prefix + 'weight'],
                        s[prefix + 'bias'], training, 0.1, 1e-5)


def _linear(s, prefix, x):
    return F.linear(x, s[prefix + 'weight'], s[prefix + 'bias'])


def _fourier(s, B, H, W):
    """PositionalEncodingFourier(hidden_dim=32, temperature=10000)."""
    y = torch.arange(1, H + 1.).view(1, H, 1).expand(B, H, W)
    x = torch.arange(1, W + 1.).view(1, 1, W).expand(B, H, W)
    y = y / (H + 1e-6) * (2 * math.pi)
    x = x / (W + 1e-6) * (2 * math.pi)
    dim_t = 10000 ** (2 * (torch.arange(32.) // 2) / 32)
    pos = []
    for e in (y, x):
        e = e[..., None] / dim_t
        pos.append(torch.stack((e[..., 0::2].sin(), e[..., 1::2].cos()),
                               dim=4).flatten(3))
    pos = torch.cat(pos, dim=3).permute(0, 3, 1, 2)
    return F.conv2d(pos, s['pos_embeder.token_projection.weight'],
                    s['pos_embeder.token_projection.bias'])


def _xca(s, p, x, num_heads):
    B, N, C = x.shape
    qkv = _linear(s, p + 'qkv.', x).reshape(B, N, 3, num_heads,
                                            C // num_heads)
    q, k, v = qkv.permute(2, 0, 3, 4, 1)  # (B, heads, C / heads, N)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    attn = ((q @ k.transpose(-2, -1)) * s[p + 'temperature']).softmax(-1)
    x = (attn @ v).permute(0, 3, 1, 2).reshape(B, N, C)
    return _linear(s, p + 'proj.', x)


def _lpi(s, p, x, H, W, training):
    B, N, C = x.shape
    x = x.permute(0, 2, 1).reshape(B, C, H, W)
    x = F.conv2d(x, s[p + 'conv1.weight'], s[p + 'conv1.bias'], padding=1,
                 groups=C)
    x = _bn(s, p + 'bn.', F.gelu(x), training)
    x = F.conv2d(x, s[p + 'conv2.weight'], s[p + 'conv2.bias'], padding=1,
                 groups=C)
    return x.reshape(B, C, N).permute(0, 2, 1)


def _ln(s, p, x):
    return F.layer_norm(x, x.shape[-1:], s[p + 'weight'], s[p + 'bias'],
                        1e-6)


def published_forward(s, x, patch_size, num_heads, out_indices, training):
    """``XCiT.forward_features(x)`` of the published backbone whose weights
    are ``s`` (without the ``backbone.`` prefix); in ``training`` mode with
    batch statistics, updating the running ones in ``s`` as its BatchNorms
    do."""
    B = x.shape[0]
    convs = 4 if patch_size == 16 else 3
    for i in range(convs):  # conv3x3 (stride 2, padding 1) + BN, GELU
        x = F.conv2d(x, s[f'patch_embed.proj.{2 * i}.0.weight'], stride=2,
                     padding=1)
        x = _bn(s, f'patch_embed.proj.{2 * i}.1.', x, training)
        x = F.gelu(x) if i + 1 < convs else x
    Hp, Wp = x.shape[2:]
    x = x.flatten(2).transpose(1, 2)
    x = x + _fourier(s, B, Hp, Wp).reshape(B, -1, x.shape[1]).permute(0, 2, 1)
    features = []
    for i in range(max(out_indices) + 1):
        p = f'blocks.{i}.'
        x = x + s[p + 'gamma1'] * _xca(s, p + 'attn.', _ln(s, p + 'norm1.', x),
                                       num_heads)
        x = x + s[p + 'gamma3'] * _lpi(s, p + 'local_mp.',
                                       _ln(s, p + 'norm3.', x), Hp, Wp,
                                       training)
        hidden = F.gelu(_linear(s, p + 'mlp.fc1.', _ln(s, p + 'norm2.', x)))
        x = x + s[p + 'gamma2'] * _linear(s, p + 'mlp.fc2.', hidden)
        if i in out_indices:
            features.append(x.permute(0, 2, 1).reshape(B, -1, Hp, Wp))
    return tuple(op(f) for op, f in zip(_fpn(s, patch_size, training),
                                        features))


def _fpn(s, patch_size, training):
    """fpn1 ... fpn4 as functions of a map."""
    def up(name):
        return lambda f: F.conv_transpose2d(f, s[name + '.weight'],
                                            s[name + '.bias'], stride=2)

    def pool(k):  # nn.MaxPool2d(kernel_size=k, stride=k): rounds down
        return lambda f: F.max_pool2d(f, kernel_size=k, stride=k)

    if patch_size == 16:
        return [lambda f: up('fpn1.3')(F.gelu(_bn(s, 'fpn1.1.',
                                                  up('fpn1.0')(f), training))),
                up('fpn2.0'), lambda f: f, pool(2)]
    return [up('fpn1.0'), lambda f: f, pool(2), pool(4)]
