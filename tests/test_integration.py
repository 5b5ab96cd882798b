"""The backbone from mmdet- and mmseg-scoped configs, its optimizer
constructor, mmengine checkpoints under torch.load(weights_only=True), and
what the tools share (``xcit_dense.cli``)."""
import gc
import io
import pickle

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config, ConfigDict
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

import xcit_dense
from xcit_dense import XCiT


@pytest.fixture(autouse=True)
def collected_after():
    """``run_cli`` freezes what its process holds when a tool starts; the
    tests that call it here leave this process's objects collected."""
    yield
    gc.unfreeze()


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_build_from_scoped_config(scope, tmp_path):
    """The registry of either scope builds the backbone (4 blocks: what
    the registry does does not depend on the depth)."""
    path = tmp_path / 'cfg.py'
    path.write_text(f"""
default_scope = '{scope}'
model = dict(type='xcit_dense.XCiT', arch='nano_12_p8', drop_path_rate=0.1,
             depth=4, out_indices=(0, 1, 2, 3))
""")
    cfg = Config.fromfile(str(path))
    init_default_scope(scope)
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(cfg.model)
    assert type(model) is XCiT and model.patch_size == 8


def test_one_definition():
    """The model code imports neither mmdet nor mmseg."""
    from pathlib import Path
    files = sorted(Path(xcit_dense.models.__file__).parent.rglob('*.py'))
    assert len(files) > 10
    for path in files:
        for line in path.read_text().splitlines():
            if line.lstrip().startswith(('import ', 'from ')):
                assert 'mmdet' not in line and 'mmseg' not in line, \
                    (path.name, line)


def _tiny_detector():
    torch.manual_seed(0)
    model = nn.Module()
    model.backbone = XCiT(arch='nano_12_p16', depth=4,
                          out_indices=(0, 1, 2, 3))
    model.head = nn.Linear(4, 4)
    return model


def _optimizer(model, merge=None, foreach=None):
    paramwise = {} if merge is None else dict(merge_groups=merge)
    return build_optim_wrapper(model, dict(
        constructor='xcit_dense.NoDecayOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05,
                       foreach=foreach),
        paramwise_cfg=dict(paramwise, custom_keys={
            'head.bias': dict(lr_mult=0.5)}))).optimizer


def _step(model, optimizer, seed):
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator)
    optimizer.step()


def test_no_decay_constructor():
    model = _tiny_detector()
    wrapper = build_optim_wrapper(model, dict(
        constructor='xcit_dense.NoDecayOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05)))
    decay = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            decay[names[id(p)]] = group['weight_decay']
    assert len(decay) == len(names)
    for name in ['backbone.blocks.0.attn.temperature',
                 'backbone.blocks.1.gamma3',
                 'backbone.pos_embed.token_projection.weight',
                 'backbone.blocks.0.norm2.weight',
                 'backbone.blocks.0.local_mp.bn.bias',
                 'backbone.fpn1.1.weight']:
        assert decay[name] == 0, name
    for name in ['backbone.blocks.0.attn.qkv.weight', 'backbone.fpn1.0.weight',
                 'head.weight', 'backbone.blocks.0.mlp.fc2.weight']:
        assert decay[name] == 0.05, name


@pytest.mark.parametrize('foreach', [False, True])
def test_parameter_groups_of_the_same_options_merged(foreach):
    """One group per distinct options (not mmengine's one per parameter),
    every parameter in exactly one, and the same updates, bit for bit, on
    the per-tensor and the multi-tensor (CUDA's) paths."""
    from conftest import logged
    merged_model, apart_model = _tiny_detector(), _tiny_detector()
    with logged() as records:
        merged = _optimizer(merged_model, foreach=foreach)
    apart = _optimizer(apart_model, merge=False, foreach=foreach)
    names = {id(p): n for n, p in merged_model.named_parameters()}
    options = [(g['lr'], g['weight_decay']) for g in merged.param_groups]
    # with weight decay, without (norms, gammas, ...), the head's bias
    assert options == [(1e-3, 0.05), (1e-3, 0.0), (5e-4, 0.05)]
    grouped = [names[id(p)] for g in merged.param_groups for p in g['params']]
    assert sorted(grouped) == sorted(names.values())
    assert 'head.bias' in {names[id(p)] for p in merged.param_groups[2][
        'params']}
    assert len(apart.param_groups) == len(names)
    assert any(f'{len(names)} parameter groups, merged into 3 of distinct '
               'options' in r for r in records)
    for seed in range(3):
        _step(merged_model, merged, seed)
        _step(apart_model, apart, seed)
    for (name, a), b in zip(merged_model.named_parameters(),
                            apart_model.parameters()):
        assert torch.equal(a, b), name


class _Scaled(nn.Module):
    """A linear layer, a layer norm and a per-channel scale the module
    declares free of weight decay (as XCiT's gammas): both kinds of group
    in a few parameters (dynamo unrolls a step over each parameter)."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(4, 4), nn.LayerNorm(4)
        self.gamma = nn.Parameter(torch.ones(4))

    def no_weight_decay(self):
        return {'gamma', 'norm.weight', 'norm.bias'}


def test_optimizer_step_compiles():
    """mmengine's ``compile=True`` compiles the optimizer's step with the
    model's train_step: dynamo traces it over the groups our constructor
    made (plain dicts; the ConfigDicts mmengine's registry makes of them
    failed: "'UserDefinedDictVariable' object has no attribute 'items'"),
    and the compiled step updates as the eager one does."""
    torch.manual_seed(0)
    compiled_model = _Scaled()
    eager_model = _Scaled()
    eager_model.load_state_dict(compiled_model.state_dict())
    config = ConfigDict(  # as the runner passes cfg.optim_wrapper
        constructor='xcit_dense.NoDecayOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05))
    compiled, eager = (build_optim_wrapper(model, config.copy()).optimizer
                       for model in (compiled_model, eager_model))
    assert all(type(g) is dict for g in compiled.param_groups)
    assert sorted(g['weight_decay'] for g in compiled.param_groups) == [
        0., 0.05]
    step = torch.compile(compiled.step, backend='eager')
    for seed in range(2):
        generator = torch.Generator().manual_seed(seed)
        for p, q in zip(compiled_model.parameters(),
                        eager_model.parameters()):
            p.grad = torch.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        step()
        eager.step()
    for (name, a), b in zip(compiled_model.named_parameters(),
                            eager_model.parameters()):
        torch.testing.assert_close(a, b, msg=name)


def test_state_saved_with_a_group_per_parameter_loads_merged():
    """An optimizer state saved with one group per parameter (mmengine's
    constructor; ours before merging) resumes into the merged groups: each
    parameter's moments where they were, the next step the same."""
    apart_model = _tiny_detector()
    apart = _optimizer(apart_model, merge=False)
    _step(apart_model, apart, 0)
    saved = io.BytesIO()  # as a checkpoint file holds it
    torch.save(apart.state_dict(), saved)
    saved.seek(0)
    saved = torch.load(saved, weights_only=True)
    merged_model = _tiny_detector()
    merged_model.load_state_dict(apart_model.state_dict())
    merged = _optimizer(merged_model)
    merged.load_state_dict(saved)
    assert len(merged.param_groups) == 3
    for a, b in zip(merged_model.parameters(), apart_model.parameters()):
        assert torch.equal(merged.state[a]['exp_avg'],
                           apart.state[b]['exp_avg'])
    _step(merged_model, merged, 1)
    _step(apart_model, apart, 1)
    for a, b in zip(merged_model.parameters(), apart_model.parameters()):
        assert torch.equal(a, b)


def test_resume_with_a_group_per_parameter_continues_merged():
    """Resuming (``CheckpointImportHook``, then the optimizer's and the
    schedulers' states loaded as ``Runner.resume`` loads them) a checkpoint
    whose optimizer had one group per parameter, into merged groups: a
    cosine schedule whose floor is a ratio of each group's initial lr goes
    on for each parameter as it would have, and so do the parameters."""
    from types import SimpleNamespace

    from mmengine.optim import CosineAnnealingLR

    from xcit_dense.hooks import CheckpointImportHook

    def schedule(optimizer):
        return CosineAnnealingLR(optimizer, T_max=6, by_epoch=False,
                                 eta_min_ratio=0.1)

    apart_model = _tiny_detector()
    apart = _optimizer(apart_model, merge=False)
    apart_schedule = schedule(apart)
    for seed in range(2):
        _step(apart_model, apart, seed)
        apart_schedule.step()
    saved = io.BytesIO()
    torch.save(dict(state_dict=apart_model.state_dict(), meta={},
                    optimizer=apart.state_dict(),
                    param_schedulers=[apart_schedule.state_dict()]), saved)
    saved.seek(0)
    checkpoint = torch.load(saved, weights_only=True)

    model = _tiny_detector()
    optimizer = _optimizer(model)
    scheduler = schedule(optimizer)
    runner = SimpleNamespace(cfg=dict(resume=True), model=model,
                             optim_wrapper=SimpleNamespace(
                                 optimizer=optimizer))
    CheckpointImportHook().after_load_checkpoint(runner, checkpoint)
    model.load_state_dict(checkpoint['state_dict'])
    optimizer.load_state_dict(checkpoint['optimizer'])
    scheduler.load_state_dict(checkpoint['param_schedulers'][0])
    assert len(optimizer.param_groups) == 3
    assert scheduler.get_last_value() == [g['lr'] for g in
                                          optimizer.param_groups]
    lr_of = {}
    for seed in range(2, 5):
        _step(model, optimizer, seed)
        _step(apart_model, apart, seed)
        scheduler.step()
        apart_schedule.step()
        for opt in (optimizer, apart):
            lr_of[opt] = {id(p): g['lr'] for g in opt.param_groups
                          for p in g['params']}
        for (name, a), b in zip(model.named_parameters(),
                                apart_model.parameters()):
            assert lr_of[optimizer][id(a)] == lr_of[apart][id(b)], name
            assert torch.equal(a, b), name


def test_optimizer_step_tool_compares_both_groupings():
    """``benchmarks/probes/optimizer_step.py`` (docs/training.md quotes it) on
    the demo recipe: both groupings timed, their operators counted, the
    models the same after their steps."""
    import re

    from conftest import REPO
    from tool_runs import run_tool_here
    proc = run_tool_here(
        'benchmarks/probes/optimizer_step.py',
        REPO / 'configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py',
        '--steps', '1', '--rounds', '1', '--foreach')
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {merge: (int(groups), int(ops)) for merge, groups, ops in
            re.findall(r'merge_groups=(\w+): (\d+) groups, .* (\d+) '
                       r'operators per step', proc.stdout)}
    (apart_groups, apart_ops), (groups, ops) = rows['False'], rows['True']
    assert groups < apart_groups and ops < apart_ops
    assert 'largest difference between the two models after 3 steps: 0\n' \
        in proc.stdout


@pytest.fixture(scope='module')
def collections_work_dir(tmp_path_factory):
    """One work directory for both runs below: the same config text, which
    the runs format (with yapf) once between them."""
    return tmp_path_factory.mktemp('gc_collections')


@pytest.mark.parametrize('freeze', [True, False])
def test_collections_tool_times_a_trainings_iterations(freeze, tiny_coco,
                                                       collections_work_dir):
    """``benchmarks/probes/gc_collections.py`` (docs/performance.md quotes
    it) on the demo recipe (its heads narrowed: what is counted does not
    depend on their width): the collections of the iterations after the
    skipped ones, by generation, with the run's imports frozen or, with
    ``--no-freeze``, not."""
    import re

    from conftest import REPO
    from shrink import NARROW_MASK_RCNN_OPTIONS
    from tool_runs import run_tool_here
    root = f'{tiny_coco}/'
    args = ['--iters', '2', '--skip', '1', '--work-dir', collections_work_dir,
            '--cfg-options',
            f'train_dataloader.dataset.data_root={root}',
            'train_dataloader.num_workers=0',
            'train_dataloader.persistent_workers=False',
            'model.backbone.depth=4', 'model.backbone.out_indices=[0,1,2,3]',
            *NARROW_MASK_RCNN_OPTIONS]
    proc = run_tool_here(
        'benchmarks/probes/gc_collections.py',
        REPO / 'configs/coco/demo_mask_rcnn_xcit_nano_synthetic.py',
        *args, *([] if freeze else ['--no-freeze']))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.splitlines()[-1]
    found = re.fullmatch(
        r'1 iterations of \d+ ms, per iteration: generation 0: [\d.]+ '
        r'collections in [\d.]+ ms, generation 1: .*, generation 2: .*; '
        r'frozen objects: (\d+)', line)
    assert found, line
    assert (int(found[1]) > 0) == freeze


def test_collections_tool_refuses_an_epoch_based_config():
    from conftest import REPO
    from tool_runs import run_tool_here
    proc = run_tool_here(
        'benchmarks/probes/gc_collections.py',
        REPO / 'configs/coco/mask_rcnn_xcit_s12_p16_3x_coco.py')
    assert proc.returncode == 1
    assert proc.stderr.startswith('error: ') and 'trains by epochs' in \
        proc.stderr and 'Traceback' not in proc.stderr


@pytest.mark.parametrize('change', ['merge_groups=False', 'custom_keys'])
def test_state_of_other_groups_is_one_paragraph(change):
    """A merged optimizer state resumed where the groups are not the same
    any more (one per parameter; a custom key that adds a group): one
    paragraph naming both groupings and load_from, not the optimizer's
    'different number of parameter groups'."""
    from xcit_dense.errors import UserError
    model = _tiny_detector()
    saved = _optimizer(model).state_dict()
    if change == 'merge_groups=False':
        optimizer = _optimizer(model, merge=False)
        now = f'{len(list(model.parameters()))} parameter groups of 1 ' \
            'parameter each'
    else:
        optimizer = build_optim_wrapper(model, dict(
            constructor='xcit_dense.NoDecayOptimWrapperConstructor',
            optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
            paramwise_cfg=dict(custom_keys={
                'head.bias': dict(lr_mult=0.5),
                'backbone.fpn1': dict(lr_mult=0.1)}))).optimizer
        now = '5 parameter groups of'
    sizes = ', '.join(str(len(g['params'])) for g in saved['param_groups'])
    with pytest.raises(UserError) as error:
        optimizer.load_state_dict(saved)
    message = str(error.value)
    assert f'has 3 parameter groups of {sizes} parameters' in message
    assert f"this run's optimizer {now}" in message
    assert 'load_from=PATH instead of --resume' in message


def test_merge_groups_must_be_a_bool():
    with pytest.raises(ValueError, match='merge_groups must be True'):
        _optimizer(_tiny_detector(), merge='yes')


def test_mmengine_checkpoint_loads_with_weights_only(tmp_path):
    """What mmengine stores in a checkpoint's message hub loads with
    weights_only=True once xcit_dense is imported; nothing more does."""
    from mmengine.logging import MessageHub
    hub = MessageHub.get_instance('xcit-dense-test')
    for i in range(3):
        hub.update_scalar('train/loss', 1.0 / (i + 1))
    hub.update_info('iter', 3)
    path = tmp_path / 'ckpt.pth'
    torch.save({'message_hub': hub.state_dict(), 'meta': {'seed': 0}}, path)
    loaded = torch.load(path)  # weights_only=True by default
    assert loaded['message_hub']['log_scalars']['train/loss'].mean() == \
        pytest.approx((1 + 1 / 2 + 1 / 3) / 3)

    # getattr is resolved only for HistoryBuffer's statistics methods
    evil = tmp_path / 'evil.pth'
    torch.save({'f': getattr(torch.Tensor, 'add')}, evil)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(evil)


@pytest.mark.parametrize('name', ['UserError', 'CheckpointError',
                                  'DataError', 'ExportError'])
def test_tools_report_every_package_error_as_one_paragraph(name, capsys):
    """The tools catch the errors' common base: each type ends a tool with
    its paragraph and status 1, no traceback."""
    import xcit_dense
    from xcit_dense.cli import run_cli
    error = getattr(xcit_dense, name)
    assert issubclass(error, xcit_dense.XCiTDenseError)

    def main():
        raise error('what was wrong; what is allowed')
    with pytest.raises(SystemExit) as stop:
        run_cli(main)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err == 'error: what was wrong; what is allowed\n'


def test_tools_do_not_repeat_setuptools_warning_on_pkg_resources():
    """setuptools >= 80.9 warns on every import of ``pkg_resources``, which
    mmengine's ``package_utils`` makes while a tool loads an ``mmdet::``
    config: not shown by the tools (the pinned setuptools does not warn;
    the GPU image's 80.10 does); other warnings are."""
    import warnings

    from xcit_dense.cli import run_cli

    def main():
        warnings.warn('pkg_resources is deprecated as an API. See https://'
                      'setuptools.pypa.io/en/latest/pkg_resources.html.',
                      UserWarning)
        warnings.warn('another warning', UserWarning)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter('always')
        run_cli(main)
    assert [str(w.message) for w in shown] == ['another warning']


def test_tools_end_their_process_without_collecting(monkeypatch):
    """A tool's process ends without the interpreter's collections over
    every object (a second of a tool's time): ``run_cli`` has ``gc.freeze``
    run at exit, once however many tools a process runs; every tool that
    imports the package ends through it (``cuda_setup.py`` runs before the
    set-up, on the standard library and PyTorch alone)."""
    import atexit
    import re

    from xcit_dense.cli import run_cli

    from conftest import REPO
    at_exit = []
    monkeypatch.setattr(atexit, 'register', at_exit.append)
    monkeypatch.setattr(atexit, 'unregister', lambda f: [
        at_exit.remove(g) for g in list(at_exit) if g == f])
    run_cli(lambda: None)
    run_cli(lambda: None)
    assert at_exit == [gc.freeze]
    mains = {path.name: path.read_text().split("if __name__ == '__main__':")
             for path in (REPO / 'tools').glob('*.py')}
    mains['measure.py'] = (REPO / 'benchmarks/harness/measure.py'
                           ).read_text().split("if __name__ == '__main__':")
    for name, parts in mains.items():
        if name != 'cuda_setup.py':
            assert len(parts) == 2 and re.match(r'\s+run_cli\(', parts[1]), \
                name


#: a new process: how many collections importing the package ran, and what
#: a tool's ``main`` finds (the collector on, the imports frozen)
_COLLECTIONS_OF_A_START = """
import gc
starts = []
gc.callbacks.append(
    lambda phase, info: phase == 'start' and starts.append(info))
import xcit_dense
from xcit_dense.cli import run_cli
during_import = len(starts)
run_cli(lambda: print(during_import, gc.isenabled(),
                      gc.get_freeze_count() > 100000))
"""


def test_a_tools_start_spares_the_collector_the_imports():
    """Importing the package (torch, timm and mmengine with it) runs no
    automatic collection (942 of them before); a tool's run starts with
    the imports frozen; the collector's switch is the caller's."""
    import subprocess
    import sys

    from xcit_dense.startup import collections_paused

    from conftest import REPO
    proc = subprocess.run([sys.executable, '-c', _COLLECTIONS_OF_A_START],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    during_import, enabled, frozen = proc.stdout.split()
    # a few before the pause (the interpreter's own start) and the one
    # that takes the import's objects in after it
    assert int(during_import) <= 6, during_import
    assert (enabled, frozen) == ('True', 'True')
    assert gc.isenabled()
    with pytest.raises(ValueError):
        with collections_paused():
            assert not gc.isenabled()
            raise ValueError
    assert gc.isenabled()
    gc.disable()
    try:
        with collections_paused():
            pass
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


def test_error_raised_in_a_dataloader_worker_keeps_its_paragraph():
    """PyTorch re-creates a worker's exception in the main process from its
    type and formatted traceback; the package's errors come out of that with
    their own paragraph (what the tools print), the traceback kept aside."""
    from torch._utils import ExceptionWrapper

    from xcit_dense import DataError
    paragraph = 'a.png: label values [9] beyond the 5 classes;\nallowed: 1..5.'
    try:
        raise DataError(paragraph)
    except DataError:
        wrapper = ExceptionWrapper(where='in DataLoader worker process 0')
    with pytest.raises(DataError) as caught:
        wrapper.reraise()
    assert str(caught.value) == paragraph
    assert 'Traceback' in caught.value.worker_traceback
    assert DataError(paragraph).worker_traceback is None


def test_use_toolkit_registers_its_modules_and_refuses_other_scopes():
    from mmengine.registry import DefaultScope

    from xcit_dense.errors import UserError
    from xcit_dense.toolkits import use_toolkit
    registry = use_toolkit('mmseg')
    assert DefaultScope.get_current_instance().scope_name == 'mmseg'
    assert registry.DATASETS.get('ADE20KDataset').__module__.startswith(
        'mmseg.')
    assert use_toolkit('mmdet').MODELS.get('MaskRCNN') is not None
    assert DefaultScope.get_current_instance().scope_name == 'mmdet'
    with pytest.raises(UserError, match="default_scope='mmpretrain'"):
        use_toolkit('mmpretrain')
    from xcit_dense.inference import init_model
    with pytest.raises(UserError, match="default_scope='mmpretrain'"):
        init_model(Config(dict(default_scope='mmpretrain', model=dict())),
                   None)
