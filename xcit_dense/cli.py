"""What the tools share on the command line: loading a config (a file or
a model of the model index), the options ``tools/train.py`` and
``tools/test.py`` share with mmdet's and mmseg's, argument types, ending a
tool with one paragraph on bad input
(:class:`~xcit_dense.errors.XCiTDenseError`), and a tool's process spared
the garbage collector's walks over what it imported."""
import argparse
import atexit
import gc
import os
import os.path as osp
import re
import sys
import tempfile
import warnings
from typing import Optional, Tuple

from mmengine.config import Config, DictAction

from .errors import UserError, XCiTDenseError

#: mmengine's ``Registry.build`` on a type it does not hold: ``KeyError('X
#: is not in the mmdet::model registry. Please check whether ...')``
REGISTRY_MISS = re.compile(r'is not in the \S+ registry')


def fail(error: BaseException) -> None:
    """Print a one-paragraph error and exit with status 1."""
    print(f'error: {error}', file=sys.stderr)
    sys.exit(1)


def skip_collections_at_exit() -> None:
    """End this process without the garbage collections the interpreter
    runs over every object while it shuts down.

    A process that imported torch, timm, mmengine, mmdet and mmseg holds
    millions of objects; collecting them at exit takes a tool about a second
    after its last line. Freezing them once the tool is done (``gc.freeze``, at
    exit: after the tool's own code and ``finally`` blocks, before the
    interpreter's shutdown) skips that; objects are still freed as their
    references go, files closed and loggers flushed, and the operating system
    takes back the memory. Only a reference cycle still alive at exit is not
    collected, which the interpreter does not promise to collect either.
    Registered once per process, so calling it again (a test running several
    tools in its process) adds nothing."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def run_cli(main) -> None:
    """Run a tool's ``main``; bad input ends it with one paragraph; the
    collections of its run skip what the process held when it started (the
    imports, ``gc.freeze``: they would walk them again and again), and its
    process ends without collecting (:func:`skip_collections_at_exit`).

    Without the warning setuptools >= 80.9 gives on each import of
    ``pkg_resources`` (mmengine 0.10's ``package_utils`` imports it in the
    functions that resolve ``mmdet::`` configs and scopes: four copies of
    it before a tool's first line, which a user cannot act on)."""
    warnings.filterwarnings('ignore', category=UserWarning,
                            message='pkg_resources is deprecated as an API')
    skip_collections_at_exit()
    gc.freeze()
    try:
        main()
    except XCiTDenseError as e:
        fail(e)
    except KeyError as e:
        if not REGISTRY_MISS.search(str(e)):
            raise
        # a type name the registries do not know: mmengine's message says
        # which and where (a config's or --cfg-options' mistake)
        fail(UserError(e.args[0]))

#: the files mmengine's ``Config.fromfile`` reads
CONFIG_SUFFIXES = ('.py', '.json', '.yaml', '.yml')


def _where(error: BaseException) -> str:
    """`` (line N of FILE)``: the innermost line of ``error``'s traceback
    in a config file (the one loaded or one it inherits: a file that is
    no imported module); empty where there is none."""
    import traceback
    modules = {getattr(m, '__file__', None)
               for m in list(sys.modules.values())}
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if f.filename.endswith(CONFIG_SUFFIXES) and
              osp.isfile(f.filename) and f.filename not in modules]
    if not frames:
        return ''
    return f' (line {frames[-1].lineno} of {frames[-1].filename})'


class CfgOptionsAction(DictAction):
    """mmengine's ``DictAction``, whose mistakes (an item without ``=``)
    are argparse's one-line usage errors rather than a traceback."""

    def __call__(self, parser, namespace, values, option_string=None):
        bad = [v for v in values if '=' not in v]
        if bad:
            parser.error(f'{option_string} takes key=value items '
                         f'(e.g. model.backbone.drop_path_rate=0.2); '
                         f'got {bad[0]!r}')
        try:
            super().__call__(parser, namespace, values, option_string)
        except ValueError as e:
            parser.error(f'{option_string}: {e}')


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Load a config file, or the config of a model of the model index
    (e.g. ``mask_rcnn_xcit_s12_p16_3x_coco``)."""
    from .model_index import config_file, models
    found = config_file(path)
    if found is None:
        names = ', '.join(sorted(models())[:4])
        raise UserError(f'Config file not found: {path} (neither a file nor '
                        f'a model of the model index, e.g. {names}, ...)')
    if not found.endswith(CONFIG_SUFFIXES):
        raise UserError(f'Cannot load the config {path}: a config is a '
                        f'{", ".join(CONFIG_SUFFIXES)} file (mmengine\'s '
                        'formats), or a model of the model index.')
    try:
        cfg = Config.fromfile(found)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
    except Exception as e:  # noqa: BLE001 (whatever the config's code raises)
        text = ' '.join(str(e).split())  # YAML's errors span lines
        raise UserError(f'Cannot load the config {path}: '
                        f'{type(e).__name__}: {text}{_where(e)}'
                        ) from e
    return cfg


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (sizes, counts)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f'expected a positive integer, got {text!r}')
    return int(text)


def add_shape_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--shape H [W]``, an image size as mmseg's ``get_flops.py`` takes
    it (H alone: H x H); :func:`image_shape` reads it."""
    parser.add_argument('--shape', type=positive_int, nargs='+', help=help)


def image_shape(parser: argparse.ArgumentParser,
                args: argparse.Namespace) -> Optional[Tuple[int, int]]:
    """``--shape`` as (H, W), None where it was not given."""
    if args.shape is None:
        return None
    if len(args.shape) > 2:
        parser.error(f'--shape takes H or H W, got {len(args.shape)} numbers')
    return args.shape[0], args.shape[-1]


def seconds(text: str) -> float:
    """An argparse type: a number of seconds >= 0 (``--wait-time``)."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f'{text} is not a number of '
                                         'seconds >= 0')
    return value


def torch_device(text: str) -> str:
    """An argparse type: a device this machine has (``--device cpu``,
    ``cuda``, ``cuda:1``)."""
    import torch
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(
            f"{text} is not a device (e.g. 'cpu', 'cuda', 'cuda:0')")
    if device.type == 'cuda':
        count = torch.cuda.device_count() if torch.cuda.is_available() \
            else 0
        if count == 0 or (device.index or 0) >= count:
            raise argparse.ArgumentTypeError(
                f'{text}: this machine has {count} CUDA device'
                f'{"s" if count != 1 else ""} (--device cpu runs on the '
                'CPU)')
    return text


#: matplotlib's backends that draw into files and open no window
FILE_BACKENDS = ('agg', 'cairo', 'pdf', 'pgf', 'ps', 'svg', 'template')


def check_output(path: str, option: str, folder: bool = False) -> None:
    """``path`` (``option``'s value) can be written, as a file or, with
    ``folder``, a folder, before the tool's work rather than after it: not
    the other kind where it exists, under no file, and in a folder this
    process can write in (the missing folders are made when it writes)."""
    path = osp.abspath(path)
    if osp.exists(path) and osp.isdir(path) != folder:
        raise UserError(
            f'{option} {path} is a {"file" if folder else "folder"}; '
            f'{option} names the {"folder" if folder else "file"} to write.')
    parent = osp.dirname(path)
    while not osp.exists(parent):
        parent = osp.dirname(parent)
    if not osp.isdir(parent):
        raise UserError(f'{option} {path} cannot be written: {parent} is a '
                        'file, not a folder.')
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as error:
        raise UserError(f'{option} {path} cannot be written: this process '
                        f'cannot write in {parent} ({error.strerror}).')


def check_display(instead: str) -> None:
    """``--show`` draws through matplotlib (mmengine's ``Visualizer.show``),
    whose backend here must open windows: with a backend that writes files,
    each image would only wait its ``--wait-time`` unseen (for ever with
    0). ``instead``: the option that saves the drawings."""
    import matplotlib.pyplot as plt
    backend = plt.get_backend()
    if backend.lower() in FILE_BACKENDS:
        raise UserError(
            f'--show opens a window for each image, and matplotlib opens '
            f'none here (its backend is {backend!r}: no display, or '
            f'MPLBACKEND names a backend that writes files). Save the drawn '
            f'images with {instead} instead, or run where there is a '
            f'display.')


def add_cfg_options(parser: argparse.ArgumentParser) -> None:
    """``--cfg-options key=value ...``, as every mmdet and mmseg tool that
    loads a config takes it (mmengine's ``DictAction``)."""
    parser.add_argument(
        '--cfg-options', nargs='+', action=CfgOptionsAction, default={},
        help='override settings in the config, key=value, e.g. '
        'model.backbone.init_cfg.checkpoint=pretrained/xcit.pth')


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options train.py and test.py share, as in mmdet and mmseg."""
    parser.add_argument('--work-dir',
                        help='the dir to save logs, models and metrics')
    add_cfg_options(parser)
    parser.add_argument(
        '--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank / --local_rank
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


#: what each ``--launcher`` reads from its process's environment
#: (mmengine's ``init_dist``), and what sets it
LAUNCHER_ENVIRONMENT = {
    'pytorch': (('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'),
                'torchrun (tools/dist_train.sh, tools/dist_test.sh)'),
    'slurm': (('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST'),
              "SLURM's srun (tools/slurm_train.sh, tools/slurm_test.sh)"),
    'mpi': (('OMPI_COMM_WORLD_LOCAL_RANK', 'OMPI_COMM_WORLD_RANK',
             'OMPI_COMM_WORLD_SIZE', 'MASTER_ADDR'),
            "Open MPI's mpirun, with MASTER_ADDR exported"),
}


def check_launcher(launcher: str) -> None:
    """A process given ``--launcher`` must have been started by that
    launcher: the variables it reads are in its environment."""
    needed, starter = LAUNCHER_ENVIRONMENT.get(launcher, ((), ''))
    missing = [name for name in needed if name not in os.environ]
    if missing:
        raise UserError(
            f'--launcher {launcher} is for a process started by {starter}; '
            f'this one was not (its environment has no '
            f'{", ".join(missing)}). Start it that way, or leave out '
            f'--launcher for one process.')


def config_from_args(args: argparse.Namespace) -> Config:
    """Load ``args.config`` with the shared options applied; the work dir is
    the command line's, else the config's, else
    ``./work_dirs/<config name>``. A ``--launcher`` must be the one that
    started the process (:func:`check_launcher`)."""
    check_launcher(args.launcher)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    return cfg
