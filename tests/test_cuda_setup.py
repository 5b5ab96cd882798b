"""The GPU set-up's decisions (tools/cuda_setup.py and its library
tools/setup_env/, tools/setup_env.sh,
tools/make_wheelhouse.sh), on the CPU: which architectures to build for,
which CUDA compiler, how the registry's compiler becomes a CUDA_HOME, which
PyTorch an offline set-up accepts, and what a CPU-only machine does; the
offline set-up over a Python that is itself a virtual environment's, and the
prebuilt mmcv of a wheelhouse: which wheel `make wheelhouse` adds with what
description, and which one a node installs."""
import json
import os
import platform
import subprocess
import sys
from importlib import metadata

import pip
import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / 'tools'))
import cuda_setup  # noqa: E402
from setup_env import SetupError, cuda, prebuilt  # noqa: E402
from setup_env import pins as torch_pins  # noqa: E402


def test_architectures_of_the_gpus_present():
    assert cuda.arch_list([(9, 0)], {}) == '9.0'
    assert cuda.arch_list([(9, 0), (8, 0), (9, 0)], {}) == '8.0;9.0'
    assert cuda.arch_list([], {}) == ''
    # the user's list wins (mmcv's and PyTorch's variable)
    assert cuda.arch_list([(9, 0)], {
        'TORCH_CUDA_ARCH_LIST': '8.6'}) == '8.6'


def test_nvcc_version():
    text = ('nvcc: NVIDIA (R) Cuda compiler driver\n'
            'Cuda compilation tools, release 13.0, V13.0.88\n')
    assert cuda.nvcc_version(text) == (13, 0)
    assert cuda.nvcc_version('command not found') is None


def _fake_nvcc(root):
    nvcc = root / 'bin' / 'nvcc'
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text('')
    return str(nvcc)


def test_compiler_matching_pytorchs_cuda_is_chosen(tmp_path):
    old = _fake_nvcc(tmp_path / 'cuda-12.4')
    new = _fake_nvcc(tmp_path / 'cuda-13.0')
    versions = {old: (12, 4), new: (13, 0)}
    home, notes = cuda.choose_compiler(
        '13.0', [old, str(tmp_path / 'missing' / 'nvcc'), new],
        version_of=versions.get)
    assert home == str(tmp_path / 'cuda-13.0')
    assert notes == [f'{old} is CUDA 12.4, PyTorch is built with CUDA 13.0']
    home, notes = cuda.choose_compiler('13.0', [old],
                                       version_of=versions.get)
    assert home is None and len(notes) == 1


def test_candidates_follow_pytorchs_search_order(tmp_path):
    env = dict(CUDA_HOME='/opt/cuda', PATH=str(tmp_path))
    found = cuda.nvcc_candidates(env)
    assert found[0] == '/opt/cuda/bin/nvcc'
    assert found[-1] == '/usr/local/cuda/bin/nvcc'


def test_registry_compiler_is_pytorchs_cuda_release():
    assert cuda.registry_requirement('13.0', '13.0.2') == \
        'cuda-toolkit[nvcc,cccl]==13.0.2'
    assert cuda.registry_requirement('12.8', None) == \
        'cuda-toolkit[nvcc,cccl]==12.8.*'


@pytest.mark.parametrize('layout', ['cu13', 'cu12'])
def test_registry_wheels_become_one_cuda_home(tmp_path, layout):
    """CUDA 13's wheels share nvidia/cu13; CUDA 12's have a folder each.
    Either way one tree with bin/nvcc, the headers, lib and lib64, and the
    unversioned libcudart.so the extension builder links against."""
    site = tmp_path / 'site'
    parts = {'cu13': {'cu13': ['bin/nvcc', 'include/cuda_runtime.h',
                               'lib/libcudart.so.13', 'nvvm/bin/cicc']},
             'cu12': {'cuda_nvcc': ['bin/nvcc', 'nvvm/bin/cicc'],
                      'cuda_runtime': ['include/cuda_runtime.h',
                                       'lib/libcudart.so.12']}}[layout]
    for folder, files in parts.items():
        for name in files:
            path = site / 'nvidia' / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(name)
    roots = cuda.registry_roots(str(site))
    home = cuda.merge_cuda_home(roots, str(tmp_path / 'cuda'))
    for name in ('bin/nvcc', 'include/cuda_runtime.h', 'nvvm/bin/cicc',
                 'lib/libcudart.so', 'lib64/libcudart.so'):
        assert os.path.exists(os.path.join(home, name)), name
    # made again from scratch on a second run
    assert cuda.merge_cuda_home(roots, home) == home


def test_wheels_without_a_compiler_are_one_paragraph(tmp_path):
    (tmp_path / 'nvidia' / 'cu13' / 'lib').mkdir(parents=True)
    with pytest.raises(SetupError, match='No CUDA compiler'):
        cuda.merge_cuda_home(cuda.registry_roots(str(tmp_path)),
                             str(tmp_path / 'cuda'))


def test_pytorch_range_of_an_offline_set_up():
    runtime = str(REPO / 'requirements' / 'runtime.txt')
    assert torch_pins.check_torch('2.12.1+cu130', runtime) == ''
    assert 'not tested' in torch_pins.check_torch('2.5.1', runtime)
    for version in ('2.0.1', '2.14.0'):
        with pytest.raises(SetupError,
                           match=r'outside the range .*>=2\.1, <2\.14'):
            torch_pins.check_torch(version, runtime)


def test_gpu_pytorch_cannot_use_is_one_paragraph():
    text = cuda.gpu_without_torch_paragraph(
        '2.12.1', '13.0', 'GPU 0: NVIDIA H100 80GB HBM3\n')
    assert 'driver' in text and '\n' not in text
    assert 'CPU-only build' in cuda.gpu_without_torch_paragraph(
        '2.12.1+cpu', None, 'GPU 0: NVIDIA A100')


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is present')
def test_plan_on_this_cpu_machine(monkeypatch):
    monkeypatch.setattr(cuda, '_nvidia_smi', lambda: '')
    assert cuda.plan({}) == dict(ARCHS='')  # as before: the CPU build
    assert cuda.plan(dict(FORCE_CUDA='0')) == dict(ARCHS='')
    with pytest.raises(SetupError, match='TORCH_CUDA_ARCH_LIST'):
        cuda.plan(dict(FORCE_CUDA='1'))
    # building for a GPU elsewhere: the registry's compiler of PyTorch's
    # CUDA when no system one matches
    monkeypatch.setattr(cuda, 'nvcc_candidates', lambda env: [])
    planned = cuda.plan(dict(FORCE_CUDA='1',
                             TORCH_CUDA_ARCH_LIST='9.0'))
    assert planned['ARCHS'] == '9.0'
    assert planned['CUDA_WHEELS'].startswith('cuda-toolkit[nvcc,cccl]==')
    # a GPU that nvidia-smi sees but PyTorch cannot use
    monkeypatch.setattr(cuda, '_nvidia_smi',
                        lambda: 'GPU 0: NVIDIA H100 80GB HBM3\n')
    with pytest.raises(SetupError, match='cannot use it|CPU-only'):
        cuda.plan({})


def test_wheelhouse_holds_the_stack_but_not_pytorch():
    proc = subprocess.run(['bash', 'tools/make_wheelhouse.sh', '--list'],
                          cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PY=sys.executable))
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split('\n')
    names = {line.split('==')[0].lower() for line in listed if line}
    assert {'mmengine', 'mmdet', 'mmsegmentation', 'timm', 'onnxruntime',
            'pycocotools'} <= names
    assert not {n for n in names if n in ('torch', 'torchvision', 'triton')
                or n.startswith(('nvidia-', 'cuda-'))}
    assert any(line.startswith('mmcv==') and 'source' in line
               for line in listed)


# -- the offline set-up over a Python that is itself a virtual environment

def _venv(path, *args, python=sys.executable):
    subprocess.run([python, '-m', 'venv', '--without-pip', *args, str(path)],
                   check=True)
    return path / 'bin' / 'python'


def _site(python):
    return subprocess.run([str(python), '-c', 'import sysconfig; print('
                           'sysconfig.get_paths()["purelib"])'],
                          capture_output=True, text=True,
                          check=True).stdout.strip()


def _python(python, code):
    return subprocess.run([str(python), '-c', code], cwd=REPO,
                          capture_output=True, text=True)


def _venv_with_a_package_and_torch(path):
    """A venv at ``path`` over this one's Python, with a package of its own
    (xcit-marker 1.0) and, through a .pth file, this environment's torch
    and pip: its Python, its site-packages and torch's."""
    python = _venv(path)
    site = _site(python)
    os.makedirs(os.path.join(site, 'xcit_marker'))
    open(os.path.join(site, 'xcit_marker', '__init__.py'), 'w').close()
    meta = os.path.join(site, 'xcit_marker-1.0.dist-info')
    os.makedirs(meta)
    with open(os.path.join(meta, 'METADATA'), 'w') as f:
        f.write('Metadata-Version: 2.1\nName: xcit-marker\nVersion: 1.0\n')
    open(os.path.join(meta, 'RECORD'), 'w').close()
    torch_site = os.path.dirname(os.path.dirname(torch.__file__))
    pip_site = os.path.dirname(os.path.dirname(pip.__file__))
    with open(os.path.join(site, 'torch_of_a.pth'), 'w') as f:
        f.write('\n'.join(dict.fromkeys([torch_site, pip_site])) + '\n')
    return python, site, torch_site


def test_venv_over_a_virtual_environments_python_sees_its_packages(tmp_path):
    """The GPU image's Python is a venv's: a venv made over it with
    --system-site-packages sees the base installation, not its PyTorch.
    Here A is a venv over this one's Python with a package of its own and,
    through a .pth file, this environment's torch; B, made by the set-up's
    `cuda_setup.py venv` run by A's Python, sees both, and pip in B counts
    them installed and keeps PyTorch at A's version."""
    outer, site_a, torch_site = _venv_with_a_package_and_torch(tmp_path / 'A')
    # where torch would be imported from, without the seconds of importing
    imports = ('import importlib.util, xcit_marker; '
               'print(importlib.util.find_spec("torch").origin)')
    assert _python(outer, imports).returncode == 0
    # what the set-up did before: neither the package nor torch
    naive = _venv(tmp_path / 'naive', '--system-site-packages',
                  python=outer)
    assert "No module named 'xcit_marker'" in _python(naive, imports).stderr
    assert _python(naive, 'import importlib.util; print(importlib.util.'
                   'find_spec("torch"))').stdout.strip() == 'None'

    dest = tmp_path / 'B'
    made = subprocess.run([str(outer), 'tools/cuda_setup.py', 'venv',
                           str(dest), '--without-pip'], cwd=REPO,
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert 'created' in made.stdout
    inner = dest / 'bin' / 'python'
    seen = _python(inner, imports)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.strip() == torch.__file__
    # its own site-packages first: what pip installs there wins
    order = _python(inner, 'import sys; print(sys.path)').stdout
    assert order.index(_site(inner)) < order.index(site_a)
    # the set-up's next step, and its check
    checked = _python(inner, 'import runpy, sys; sys.argv = ["", "torch"]; '
                      'runpy.run_path("tools/cuda_setup.py", '
                      'run_name="__main__")')
    assert checked.returncode == 0, checked.stderr
    assert f'in {torch_site}' in checked.stdout
    # the pins: PyTorch as installed in A, satisfied there (pip here is
    # this environment's, through A); nothing installed into B
    pins = tmp_path / 'constraints.txt'
    assert _python(inner, 'import runpy, sys; sys.argv = ["", '
                   '"system-constraints", "requirements/constraints.txt", '
                   f'"{pins}"]; runpy.run_path("tools/cuda_setup.py", '
                   'run_name="__main__")').returncode == 0
    assert f'torch=={metadata.version("torch")}' in pins.read_text()
    before = sorted(os.listdir(_site(inner)))
    kept = subprocess.run(
        [str(inner), '-m', 'pip', 'install', '--no-index', '--no-deps',
         '--disable-pip-version-check', '-c', str(pins), 'torch',
         'xcit-marker==1.0'], cwd=REPO, capture_output=True, text=True)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert kept.stdout.count('Requirement already satisfied') == 2, \
        kept.stdout
    assert sorted(os.listdir(_site(inner))) == before
    # run again over an existing B: nothing made, the link kept
    again = subprocess.run([str(outer), 'tools/cuda_setup.py', 'venv',
                            str(dest)], cwd=REPO, capture_output=True,
                           text=True)
    assert again.returncode == 0 and again.stdout == '', again.stderr
    assert _python(inner, imports).returncode == 0


def test_venv_over_a_base_python_uses_its_site_packages(tmp_path):
    """Over a Python that is no venv's (system, conda), as before:
    --system-site-packages, no .pth file."""
    base = getattr(sys, '_base_executable', sys.executable)
    made = subprocess.run([base, 'tools/cuda_setup.py', 'venv',
                           str(tmp_path / 'B'), '--without-pip'], cwd=REPO,
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    cfg = (tmp_path / 'B' / 'pyvenv.cfg').read_text()
    assert 'include-system-site-packages = true' in cfg
    assert not any(name.endswith('.pth')
                   for name in os.listdir(_site(tmp_path / 'B' / 'bin' /
                                                'python')))


def test_pins_over_an_installed_pytorch():
    lines = ['mmcv==2.1.0\n', 'torch==2.12.1\n', 'torchvision==0.27.1\n',
             'triton==3.7.1\n', 'nvidia-cublas==13.1.1.3\n',
             'cuda-toolkit==13.0.2\n', 'timm==1.0.31\n']
    pins = torch_pins.system_torch_constraints(
        lines, dict(torch='2.11.0+cu130', torchvision='0.26.0',
                    triton=None))
    assert [ln for ln in pins if not ln.startswith('#')] == [
        'mmcv==2.1.0', 'timm==1.0.31', 'torch==2.11.0+cu130',
        'torchvision==0.26.0']


# -- a prebuilt mmcv with CUDA ops in the wheelhouse

BUILT = dict(wheel='mmcv-2.1.0-cp312-cp312-linux_x86_64.whl', mmcv='2.1.0',
             torch='2.11.0+cu130', cuda='13.0', arch_list='9.0',
             python='cp312', platform='linux_x86_64', glibc='2.38')
PRESENT = dict(mmcv='2.1.0', torch='2.11.0+cu130', cuda='13.0',
               capabilities=[(9, 0)], python='cp312', machine='x86_64',
               glibc='2.39')


def test_what_a_wheel_is_built_for_is_described():
    assert prebuilt.describe_wheel(
        '/b/dist/mmcv-2.1.0-cp312-cp312-linux_x86_64.whl', '9.0',
        '2.11.0+cu130', '13.0', '2.38') == BUILT
    lib, version = platform.libc_ver()  # this machine's, for `describe`
    assert prebuilt.glibc_version() == (version if lib == 'glibc' else None)


@pytest.mark.parametrize('present,reason', [
    (dict(), None),
    (dict(torch='2.11.0'), None),  # the local label aside
    (dict(capabilities=[(9, 0), (9, 0)]), None),
    (dict(torch='2.11.1+cu130'), 'PyTorch 2.11.0'),
    (dict(torch='2.12.1+cu130'), 'PyTorch 2.11.0'),
    (dict(cuda='12.8'), 'CUDA 13.0'),
    (dict(cuda=None), 'CPU-only'),
    (dict(capabilities=[(8, 0)]), 'compute capability 8.0'),
    (dict(capabilities=[(9, 0), (10, 0)]), 'compute capability 10.0'),
    (dict(capabilities=[]), 'no GPU'),
    (dict(python='cp311'), 'cp312'),
    (dict(machine='aarch64'), 'linux_x86_64'),
    (dict(mmcv='2.2.0'), 'mmcv 2.1.0'),
    # built on a newer C library than this node's (a cluster's login node
    # on a newer OS): the ops would not load
    (dict(glibc='2.36'), 'glibc 2.38, this machine has 2.36'),
    (dict(glibc='2.38'), None),
    (dict(glibc=None), None),  # not glibc: installed, then checked
    (dict(built_glibc=None, glibc='2.17'), None),  # an older description
])
def test_prebuilt_wheel_matches_pytorch_cuda_gpus_and_python(present,
                                                             reason):
    present = dict(PRESENT, **present)  # the parameter itself unchanged
    built = dict(BUILT, glibc=present.pop('built_glibc', BUILT['glibc']))
    got = prebuilt.prebuilt_mismatch(built, present)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got, got


def test_architectures_a_build_runs_on():
    covers = prebuilt.arch_covers
    assert covers('9.0', (9, 0)) and covers('8.0;9.0', (9, 0))
    assert covers('8.0', (8, 6))  # same major, later minor
    assert not covers('8.6', (8, 0)) and not covers('8.0', (9, 0))
    assert covers('8.0+PTX', (9, 0)) and not covers('9.0+PTX', (8, 0))
    assert covers('9.0a', (9, 0)) and not covers('9.0a', (9, 1))
    assert covers('7.5 8.0', (8, 0))
    assert not covers('Hopper', (9, 0)) and not covers('', (9, 0))


def _wheel(path, so_bytes):
    """A wheel with one compiled file, and the RECORD pip installs from it."""
    import base64
    import hashlib
    import zipfile
    digest = base64.urlsafe_b64encode(
        hashlib.sha256(so_bytes).digest()).rstrip(b'=').decode()
    record = (f'mmcv/_ext.cpython-312-x86_64-linux-gnu.so,sha256={digest},'
              f'{len(so_bytes)}\nmmcv/__init__.py,sha256=x,1\n'
              f'mmcv-2.1.0.dist-info/RECORD,,\n')
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, 'w') as z:
        z.writestr('mmcv/_ext.cpython-312-x86_64-linux-gnu.so', so_bytes)
        z.writestr('mmcv-2.1.0.dist-info/RECORD', record)
    return str(path), record


def test_the_wheel_built_here_goes_to_the_wheelhouse_and_to_the_nodes(
        tmp_path):
    """`make wheelhouse` adds the wheel the installed mmcv came from (one of
    several of the same name) with its description; a node whose PyTorch,
    CUDA, GPUs and Python match finds it, others are told why not."""
    name = BUILT['wheel']
    other, _ = _wheel(tmp_path / 'build' / 'mmcv-a' / 'dist' / name, b'sm80')
    wheel, record = _wheel(tmp_path / 'build' / 'mmcv-b' / 'dist' / name,
                           b'sm90')
    with open(wheel + '.json', 'w') as f:
        json.dump(BUILT, f)
    assert prebuilt.wheel_of_installed(record, [other, wheel]) == wheel
    assert prebuilt.wheel_of_installed('mmcv/__init__.py,sha256=x,1\n',
                                       [wheel]) is None  # no ops
    house = tmp_path / 'wheelhouse'
    folder, note = prebuilt.add_to_wheelhouse(str(house), '3.11', record,
                                              [other, wheel])
    assert folder is None and 'cp312' in note  # another Python's wheelhouse
    folder, note = prebuilt.add_to_wheelhouse(str(house), '3.12', record,
                                              [other, wheel])
    assert folder == str(house / 'mmcv-cuda' /
                         'mmcv-2.1.0-torch2.11.0-cuda13.0-arch9.0-cp312-'
                         'glibc2.38')
    assert sorted(os.listdir(folder)) == [name, name + '.json']
    folder_b, _ = prebuilt.add_to_wheelhouse(str(house), '3.12', record,
                                             [other, wheel])
    assert folder_b == folder  # again: the same folder, nothing more
    found, notes = prebuilt.choose_prebuilt(str(house), PRESENT)
    assert found == os.path.join(folder, name) and notes == []
    found, notes = prebuilt.choose_prebuilt(
        str(house), dict(PRESENT, capabilities=[(8, 0)]))
    assert found is None and len(notes) == 1
    assert 'compute capability 8.0' in notes[0]
    found, notes = prebuilt.choose_prebuilt(  # an older OS release
        str(house), dict(PRESENT, glibc='2.35'))
    assert found is None and 'glibc 2.38, this machine has 2.35' in notes[0]
    # a wheel without description is not added
    os.remove(wheel + '.json')
    folder, note = prebuilt.add_to_wheelhouse(str(tmp_path / 'w2'), '3.12',
                                              record, [wheel])
    assert folder is None and 'no description' in note


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is present')
def test_set_up_describes_a_build_and_says_why_it_is_not_used_here(
        tmp_path, capsys):
    """What setup_env.sh runs: `describe` after building (this Python's
    PyTorch), `prebuilt` before: on this CPU machine one line, and the
    build."""
    tag = 'cp%d%d' % sys.version_info[:2]
    machine = platform.machine()
    wheel, _ = _wheel(tmp_path / 'mmcv-cuda' / 'x' /
                      f'mmcv-2.1.0-{tag}-{tag}-linux_{machine}.whl', b'ops')
    assert cuda_setup.main(['describe', wheel, '9.0']) == 0
    with open(wheel + '.json') as f:
        built = json.load(f)
    assert built['torch'] == torch.__version__ and built['arch_list'] == '9.0'
    assert built['glibc'] == prebuilt.glibc_version()
    capsys.readouterr()
    assert cuda_setup.main(['prebuilt', str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == '' and len(lines) == 1, err
    assert lines[0].endswith('building it'), lines
    # everything but the GPU matches
    assert lines[0].endswith('no GPU here to check it on): building it'
                             if torch.version.cuda else
                             'is a CPU-only build): building it'), lines


def test_wheelhouse_adds_only_a_cuda_build_of_mmcv(tmp_path):
    """`make wheelhouse-mmcv` (offline): this environment's mmcv when the
    set-up built it with CUDA ops (build/mmcv-*/dist), else nothing."""
    proc = subprocess.run(['bash', 'tools/make_wheelhouse.sh', '--mmcv-only',
                           str(tmp_path / 'wh')], cwd=REPO,
                          capture_output=True, text=True,
                          env=dict(os.environ, PY=sys.executable))
    assert proc.returncode == 0, proc.stderr
    added = [name for _, _, names in os.walk(tmp_path) for name in names]
    if 'no prebuilt mmcv added' in proc.stdout:
        assert added == []
    else:  # a machine where the set-up built mmcv with CUDA ops
        assert 'with CUDA ops for PyTorch' in proc.stdout, proc.stdout
        assert len(added) == 2 and {n.endswith('.whl.json')
                                    for n in added} == {True, False}


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is present')
def test_check_without_a_gpu_says_there_is_none(monkeypatch):
    monkeypatch.setattr(cuda, '_nvidia_smi', lambda: '')
    with pytest.raises(SetupError, match='There is no GPU here: '
                       'no NVIDIA driver') as raised:
        cuda.check_ops()
    assert 'rebuild' not in str(raised.value)
    assert 'on this GPU' not in str(raised.value)
    # a GPU that the driver shows but PyTorch cannot use: that paragraph
    monkeypatch.setattr(cuda, '_nvidia_smi',
                        lambda: 'GPU 0: NVIDIA H100 80GB HBM3\n')
    with pytest.raises(SetupError, match='nvidia-smi sees'):
        cuda.check_ops()


@pytest.mark.parametrize('argv, status, message', [
    (['venv'], 2, 'usage: python tools/cuda_setup.py venv DEST '
     '[--without-pip]: venv takes 1 argument (DEST), got none.'),
    (['plan', 'extra'], 2, "plan takes no arguments, got 'extra'"),
    (['frobnicate'], 2, "unknown command 'frobnicate'; the commands are "
     'plan, cuda-home'),
    (['describe', 'notes.txt', '8.0'], 1, 'is not named as a wheel is'),
    (['describe', 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl', '8.0'], 1,
     'no such file'),
    (['system-constraints', 'missing.txt', 'out.txt'], 1,
     'Cannot read the pins missing.txt'),
    (['venv', '/proc/xcit_dense_venv'], 1,
     'Cannot make a virtual environment at /proc/xcit_dense_venv'),
])
def test_bad_command_lines_are_one_paragraph(tmp_path, monkeypatch, capsys,
                                             argv, status, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'notes.txt').write_text('')
    assert cuda_setup.main(argv) == status
    out, err = capsys.readouterr()
    assert out == '' and err.startswith('[setup_env] ') and message in err
    assert len(err.strip().splitlines()) == 1, err
