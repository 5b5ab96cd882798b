"""Why each part took its path (``xcit_dense.models.explain_paths`` and
``tools/explain_paths.py``): the reason each part's decision gives, for a
replaced part, a hook, the policy and the switches, too few tokens, and on
the kernels' device live dropout, a dtype and kernels that cannot run; and
every row's path the one the part's call took (spies on the methods only a
fast path calls)."""
from types import SimpleNamespace

import pytest
import torch

from xcit_dense import fast_path
from xcit_dense.models import explain_paths, paths, policy
from xcit_dense.models.block import XCABlock
from xcit_dense.models.lpi import LPI
from xcit_dense.models.mlp import Mlp
from xcit_dense.models.ops import xca_kernels
from xcit_dense.models.positional_encoding import CachedFourierEncoding
from xcit_dense.models.pyramid import TransposedConvUpsampler
from xcit_dense.models.stem import ConvPatchEmbed
from xcit_dense.models.xca import XCA

from conftest import REPO
from test_fast_path import randomized
from tool_runs import run_tool_here

#: each part and the method only its fast path calls (the block's: its
#: attention branch's residual_forward)
FAST_METHODS = {
    ConvPatchEmbed: '_channels_last',
    CachedFourierEncoding: 'cached_features',
    XCA: '_from_second_moments',
    LPI: '_channels_last',
    Mlp: '_fused',
    TransposedConvUpsampler: '_token_gemms',
}
#: 8 x 12 tokens of 128 channels: fewer than XCA's second moments need
SMALL, LARGE = (128, 192), (224, 320)


@pytest.fixture
def fast(monkeypatch):
    """The parts whose fast path ran (``fast.ran``), filled by spies; a
    block's, through its attention branch (``fast.block_of``)."""
    fast = SimpleNamespace(ran=set(), block_of={})
    for cls, method in FAST_METHODS.items():
        def spy(self, *args, _original=getattr(cls, method), **kwargs):
            fast.ran.add(self)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(cls, method, spy)
    residual_forward = XCA.residual_forward

    def block_spy(self, *args):
        fast.ran.add(fast.block_of[self])
        return residual_forward(self, *args)
    monkeypatch.setattr(XCA, 'residual_forward', block_spy)
    return fast


def explained(model, inputs, fast, **kwargs):
    """``explain_paths``'s rows by name, each checked against the call it
    explains: fast where the part's fast path ran, else straightforward."""
    fast.ran.clear()
    fast.block_of.update({m.attn: m for m in model.modules()
                          if isinstance(m, XCABlock)})
    rows = explain_paths(model, inputs, **kwargs)
    modules = dict(model.named_modules())
    for row in rows:
        assert row.reason in paths.REASONS, row
        ran = modules[row.name] in fast.ran
        assert ran == (row.path != paths.STRAIGHTFORWARD), (row, ran)
    return {row.name: (row.path, row.reason) for row in rows}


def test_every_part_says_why(fast, monkeypatch):
    """The default model on the CPU: every fast path, by the policy; XCA's
    second moments only for enough tokens; each case sends the parts it
    concerns to their straightforward computation, for its reason."""
    model = randomized().eval()
    rows = explained(model, LARGE, fast)
    assert len(rows) == 2 + 4 * 4 + 2  # stem, encoding, blocks, up-samplers
    assert set(rows.values()) == {
        ('channels last', 'policy'), ('cached', 'policy'),
        ('folded branches', 'policy'), ('second moments', 'policy'),
        ('fused', 'policy'), ('token GEMMs', 'policy')}
    assert explained(model, SMALL, fast)['blocks.0.attn'] == (
        'straightforward', 'too few tokens')

    class Attention(XCA):
        pass
    model.blocks[1].attn.__class__ = Attention
    model.blocks[2].mlp.fc1.register_forward_hook(lambda *args: None)
    model.blocks[3].local_mp.use_fast_path = False
    monkeypatch.setitem(policy.POLICY, 'TransposedConvUpsampler', dict(
        policy.POLICY['TransposedConvUpsampler'], cpu=frozenset()))
    rows = explained(model, LARGE, fast)
    straightforward = {name: reason for name, (path, reason) in rows.items()
                       if path == 'straightforward'}
    # a block's branches decide for themselves what is below them
    assert straightforward == {
        'blocks.1': 'type replaced', 'blocks.1.attn': 'type replaced',
        'blocks.2.mlp': 'hook', 'blocks.3.local_mp': 'switched off',
        'fpn1': 'policy off', 'fpn2': 'policy off'}
    with fast_path('always'):
        assert explained(model, SMALL, fast)['blocks.0.attn'] == (
            'second moments', "'always'")
    with fast_path(False):
        assert set(explained(model, SMALL, fast).values()) == {
            ('straightforward', 'switched off')}


def test_training_is_explained_and_the_model_left_as_it_was(fast):
    """``training=True`` runs a training forward (the stem folds no batch
    statistics, XCA's second moments need more tokens) and leaves the
    modes and BatchNorm statistics as they were."""
    model = randomized().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = explained(model, (160, 192), fast, training=True)
    assert rows['blocks.0.attn'] == ('straightforward', 'too few tokens')
    assert rows['blocks.0.local_mp'] == ('channels last', 'policy')
    assert not any(m.training for m in model.modules())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.fixture
def kernels(monkeypatch):
    """XCA on the CPU as on a device of its Triton kernels (the kernels
    counted, not run); the kernels' dtype checked on their inputs."""
    monkeypatch.setattr(policy, 'KERNEL_DEVICES', ('cpu', 'cuda'))
    monkeypatch.setattr(xca_kernels, 'available', lambda: True)
    monkeypatch.setattr(xca_kernels, 'works', lambda *args: True)
    calls = []

    def attention(qkv, temperature, heads):
        calls.append(qkv.dtype)
        B, N, C3 = qkv.shape
        return qkv.new_zeros(B, N, C3 // 3)
    monkeypatch.setattr(xca_kernels, 'attention', attention)
    return calls


@pytest.mark.parametrize('case, reason', [
    ('fp32', 'policy'), ('dropout', 'dropout live'), ('fp64', 'dtype'),
    ('no triton', 'kernel unavailable'), ('failed', 'kernel unavailable')])
def test_kernel_device_reasons(kernels, monkeypatch, case, reason):
    """On the kernels' device: the kernels, unless dropout acts in
    training, the ``qkv`` layer gives a dtype they are not written for, or
    they cannot run (no Triton, or a failed probe); the row says so and
    the kernels ran only for the first."""
    attention = XCA(64, num_heads=8, attn_drop=0.1 * (case == 'dropout'))
    tokens = torch.randn(2, 6, 64)
    if case == 'fp64':
        attention, tokens = attention.double(), tokens.double()
    if case == 'no triton':
        monkeypatch.setattr(xca_kernels, 'available', lambda: False)
    if case == 'failed':
        monkeypatch.setattr(xca_kernels, 'works', lambda *args: False)
    [row] = explain_paths(attention, tokens, training=case == 'dropout')
    assert (row.path, row.reason) == (
        'kernels' if reason == 'policy' else 'straightforward', reason)
    assert kernels == ([torch.float32] if reason == 'policy' else [])


def test_tool_prints_each_part_and_the_reasons():
    """tools/explain_paths.py over the detection demo's config (and its
    --cfg-options): a row per part of its backbone, then what each reason
    given means."""
    proc = run_tool_here(
        'tools/explain_paths.py',
        REPO / 'configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py',
        '--shape', '128', '192', '--cfg-options',
        'model.backbone.fast_path=always')
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == 'XCiT on cpu, one 128x192 image, inference, fp32:'
    assert lines[2:4] == [
        'part                         path             reason',
        "backbone.patch_embed         channels last    'always'"]
    assert "backbone.blocks.11.attn      second moments   'always'" in lines
    assert len(lines) == 4 + 2 + 4 * 12 + 2 + 2
    assert lines[-1] == f"  'always': {paths.REASONS[paths.FORCED]}"
