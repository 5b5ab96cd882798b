"""Compile the backbone's Triton kernels for NVIDIA GPUs on a machine without
one, and report what each compiled kernel uses.

The CPU tests run XCA's, LPI's and the pre-norms' kernels in Triton's
interpreter, which checks their arithmetic but not what the GPU compiler
makes of them: a tile shape or a ``tl.dot`` it rejects, registers spilled to
local memory (slow), shared memory above the GPU's limit. This tool runs an
XCiT preset's training step (forward and backward) and its inference on the
CPU with the kernels selected as on a GPU, fp32 and under autocast, and
instead of launching each kernel has Triton compile it, as the GPU's first
call would, for each CUDA architecture asked for (Triton ships NVIDIA's
``ptxas``). Per kernel and variant it prints the registers per thread, the
local memory (bytes of stack per thread: spills) and the shared memory of
the cubin Triton made (``cuobjdump -res-usage``, Triton's copy).

    python tools/compile_kernels.py                        # S12/16, 800x1344
    python tools/compile_kernels.py --arch 80 90 --dtype bfloat16 --check

``--arch`` takes CUDA compute capabilities (not XCiT presets, which
``--preset`` names): those of NVIDIA's GPUs that Triton compiles for, 70
(sm_70) to 121 (sm_121). ``--check`` exits with 1 if a kernel fails to
compile, spills or needs more shared memory than the architecture has.
Nothing runs on a GPU; launch speed and occupancy are for ``make
gpu-report``.
"""
import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

from xcit_dense.atomic_files import (  # noqa: E402
    move_into_place,
    unverified_file,
)
from xcit_dense.cli import check_output, run_cli  # noqa: E402
from xcit_dense.errors import UserError  # noqa: E402

DTYPES = ('float32', 'bfloat16', 'float16')
#: shared memory one block may use (bytes), by compute capability (CUDA
#: programming guide, "Technical Specifications per Compute Capability")
SHARED_LIMITS = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
#: the compute capabilities ``--arch`` takes: NVIDIA's GPUs from Volta
#: (sm_70) to Blackwell (sm_121), each of which Triton 3.7.1 compiles for
#: with the ``ptxas`` it ships; LLVM aborts the process on other numbers
ARCHS = (70, 75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121)


@dataclass
class Launch:
    """One kernel variant as a launch asked Triton for it."""
    kernel: str
    variant: str
    step: str
    dtype: str
    fn: object
    signature: Dict[str, str]
    constants: dict
    attrs: dict
    options: dict


@dataclass
class Row:
    """A launch compiled for one architecture."""
    kernel: str
    variant: str
    step: str
    dtype: str
    arch: int
    warps: int
    registers: Optional[int] = None
    local_bytes: Optional[int] = None
    shared_bytes: Optional[int] = None
    error: Optional[str] = None

    def problems(self) -> List[str]:
        if self.error is not None:
            return [f'does not compile: {self.error}']
        found = []
        if self.local_bytes:
            found.append(f'{self.local_bytes} bytes of local memory per '
                         f'thread (spilled registers)')
        limit = SHARED_LIMITS.get(self.arch)
        if limit is not None and self.shared_bytes > limit:
            found.append(f'{self.shared_bytes} bytes of shared memory, '
                         f'above sm_{self.arch}\'s {limit}')
        return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--arch', nargs='+', type=int, default=[80, 90],
                        help='CUDA compute capabilities, as 80 for sm_80 '
                             '(A100), 90 for sm_90 (H100, H200); one of '
                             + ', '.join(map(str, ARCHS)))
    parser.add_argument('--dtype', nargs='+', choices=DTYPES,
                        default=list(DTYPES),
                        help='float32: no autocast; bfloat16, float16: '
                             'the step under autocast to that dtype')
    parser.add_argument('--preset', default='small_12_p16',
                        help='XCiT preset (default small_12_p16)')
    parser.add_argument('--size', nargs=2, type=int, default=[800, 1344],
                        metavar=('H', 'W'), help='image size')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--tf32', action='store_true',
                        help='torch.backends.cuda.matmul.allow_tf32 = True '
                             '(fp32 products on tensor cores)')
    parser.add_argument('--out', help='write the rows to this JSON file')
    parser.add_argument('--check', action='store_true',
                        help='exit with 1 if a kernel fails to compile, '
                             'spills or needs too much shared memory')
    return parser


def _triton():
    """Triton, compiling (not interpreting) its kernels; one paragraph where
    that is not possible."""
    if os.environ.get('TRITON_INTERPRET') == '1':
        raise UserError(
            'tools/compile_kernels.py compiles the kernels for GPUs: run it '
            'without TRITON_INTERPRET=1 (which makes Triton interpret them '
            'on the CPU instead).')
    try:
        import triton
    except ImportError:
        raise UserError(
            'tools/compile_kernels.py needs Triton, which PyTorch installs '
            'on Linux x86-64 and aarch64; this Python has none.') from None
    return triton


def _compile_only_driver(arch: int):
    """A Triton driver for a CUDA target with no GPU behind it: kernels
    compile for ``arch``; nothing is launched (the cache hook below stops
    every launch before)."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class CompileOnly(DriverBase):
        target = GPUTarget('cuda', arch, 32)

        @classmethod
        def is_active(cls):
            return True

        def map_python_to_cpp_type(self, ty):
            raise NotImplementedError

        def get_current_target(self):
            return self.target

        def get_active_torch_device(self):
            import torch
            return torch.device('cpu')

        def get_benchmarker(self):
            raise NotImplementedError

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    return CompileOnly()


@contextlib.contextmanager
def recording(launches: Dict[tuple, Launch], step: str) -> Iterator[None]:
    """Within the block every launch of a Triton kernel adds its variant to
    ``launches`` under ``step`` (through Triton's ``jit_cache_hook``, which
    is asked before each compilation) and returns without compiling or
    running; the package's kernels take CPU tensors, as on a GPU."""
    from triton import knobs
    from triton.runtime import driver

    from xcit_dense.models import policy

    def record(*, key, fn, compile, **_):
        jit = fn.jit_function
        signature = compile['signature']
        constants = {(jit.arg_names[k[0]] if isinstance(k, tuple) else k): v
                     for k, v in compile['constants'].items()}
        declared = {p.name for p in jit.params if p.is_constexpr}
        flags = ' '.join(f'{k}={int(v) if isinstance(v, bool) else v}'
                         for k, v in constants.items()
                         if k in declared and k != 'EPS')
        pointers = dict.fromkeys(t[1:] for t in signature.values()
                                 if t.startswith('*'))
        launch = Launch(
            kernel=f'{fn.module.split(".")[-1]}.{fn.name}', variant=flags,
            step=step, dtype='/'.join(pointers), fn=jit,
            signature=signature, constants=compile['constants'],
            attrs=compile['configs'][0],
            options=dict(num_warps=compile['num_warps'],
                         num_stages=compile['num_stages'],
                         num_ctas=compile['num_ctas']))
        launches.setdefault((step, launch.kernel, str(key)), launch)
        return True  # skip compiling and launching

    previous = knobs.runtime.jit_cache_hook, policy.KERNEL_DEVICES
    # the driver before (None until one is asked for: a machine without a
    # GPU has none Triton could create)
    previous_driver = driver._active
    driver.set_active(_compile_only_driver(90))
    knobs.runtime.jit_cache_hook = record
    policy.KERNEL_DEVICES = ('cpu',)
    try:
        yield
    finally:
        knobs.runtime.jit_cache_hook, policy.KERNEL_DEVICES = previous
        driver.set_active(previous_driver)


def run_model(preset: str, size: Sequence[int], batch: int,
              dtype: str) -> None:
    """A training step and an inference of the preset's backbone with every
    fast path on, under autocast to ``dtype`` unless fp32: what a GPU
    would launch (here, with the launches recorded, the kernels' outputs
    are left unwritten)."""
    import torch

    from xcit_dense.models import XCiT

    torch.manual_seed(0)
    model = XCiT(arch=preset, fast_path='always')
    x = torch.randn(batch, 3, *size)
    autocast = torch.autocast('cpu', dtype=getattr(torch, dtype),
                              enabled=dtype != 'float32')
    model.train()
    with autocast:
        loss = sum(o.float().mean() for o in model(x))
    loss.backward()
    model.eval()
    with torch.no_grad(), autocast:
        model(x)


def resources(triton, cubin: bytes) -> Tuple[int, int]:
    """Registers per thread and bytes of stack (local memory) per thread of
    a cubin's kernel."""
    tool = triton.knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, '-res-usage', f.name], check=True,
                              capture_output=True, text=True).stdout
    found = re.search(r'REG:(\d+) STACK:(\d+)', text)
    if found is None:
        raise RuntimeError(f'no resource usage in cuobjdump\'s output: '
                           f'{text[:200]}')
    return int(found.group(1)), int(found.group(2))


def compile_for(triton, launch: Launch, arch: int) -> Row:
    """``launch``'s kernel compiled for ``sm_<arch>``."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    target = GPUTarget('cuda', arch, 32)
    options = make_backend(target).parse_options(launch.options)
    row = Row(launch.kernel, launch.variant, launch.step, launch.dtype,
              arch, options.num_warps)
    source = ASTSource(launch.fn, launch.signature, launch.constants,
                       launch.attrs)
    try:
        kernel = triton.compile(source, target=target,
                                options=options.__dict__)
    except Exception as error:  # Triton's compiler or ptxas
        row.error = str(error).strip().splitlines()[-1][:300]
        return row
    row.registers, row.local_bytes = resources(triton, kernel.asm['cubin'])
    row.shared_bytes = kernel.metadata.shared
    return row


def table(rows: Sequence[Row]) -> str:
    lines = ['| kernel | variant | step | tensors | arch | warps | '
             'registers | local memory (B) | shared memory (B) |',
             '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        if r.error is not None:
            cells = ['**fails**: ' + r.error, '', '']
        else:
            cells = [r.registers, r.local_bytes, r.shared_bytes]
        lines.append('| ' + ' | '.join(str(c) for c in (
            r.kernel, r.variant, r.step, r.dtype, f'sm_{r.arch}', r.warps,
            *cells)) + ' |')
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from xcit_dense.models.presets import ARCH_SETTINGS
    if args.preset not in ARCH_SETTINGS:
        raise UserError(f'Unknown XCiT preset {args.preset!r}; allowed: '
                        f'{", ".join(ARCH_SETTINGS)}.')
    if min(*args.size, args.batch) < 1:
        raise UserError(f'--size and --batch must be positive, got '
                        f'{args.size} and {args.batch}.')
    unknown = [arch for arch in args.arch if arch not in ARCHS]
    if unknown:
        raise UserError(
            f'--arch {" ".join(map(str, unknown))}: --arch takes CUDA compute '
            f'capabilities that Triton compiles for, sm_{ARCHS[0]} to '
            f'sm_{ARCHS[-1]}: {", ".join(map(str, ARCHS))} (80 for sm_80, '
            f'the A100; 90 for sm_90, the H100 and H200).')
    if args.out:
        check_output(args.out, '--out')
    triton = _triton()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    launches: Dict[tuple, Launch] = {}
    for dtype in args.dtype:
        with recording(launches, dtype):
            run_model(args.preset, args.size, args.batch, dtype)
    if not launches:
        raise UserError('No Triton kernel was launched: this PyTorch has '
                        'no kernels for the preset\'s modules.')
    rows = [compile_for(triton, launch, arch)
            for launch in launches.values() for arch in args.arch]
    print(f'XCiT {args.preset}, {args.batch} x {args.size[0]}x'
          f'{args.size[1]}, Triton {triton.__version__}, PyTorch '
          f'{torch.__version__}, TF32 {"on" if args.tf32 else "off"}: '
          f'{len(launches)} kernel variants\n')
    print(table(rows))
    if args.out:  # its folder made if missing, as check_output promised
        with unverified_file(args.out, '.json') as partial:
            with open(partial, 'w') as f:
                json.dump([asdict(r) for r in rows], f, indent=1)
            move_into_place(partial, args.out)
    problems = [f'{r.kernel} [{r.variant}] {r.step} sm_{r.arch}: {p}'
                for r in rows for p in r.problems()]
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if args.check and problems else 0


if __name__ == '__main__':
    run_cli(lambda: sys.exit(main()))
