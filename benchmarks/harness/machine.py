"""What a run was measured on: the CPU (its model and the instruction sets
that choose its kernels), PyTorch, and on CUDA the GPU and CUDA's
release."""


#: the CPU's instruction sets that change which kernels PyTorch and oneDNN
#: run (Linux's names in /proc/cpuinfo): a CPU figure is only comparable
#: with one measured on the same kind of CPU
CPU_FEATURES = ('avx2', 'avx512f', 'avx512_bf16', 'avx512_fp16', 'amx_bf16',
                'amx_int8', 'amx_fp16')


def cpu_description() -> dict:
    """The CPU's model name and :data:`CPU_FEATURES` it has, as Linux
    reports them (elsewhere: ``platform.processor()`` and no features)."""
    import platform
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                key, _, value = line.partition(':')
                if key.strip() == 'model name':
                    name = value.strip()
                elif key.strip() == 'flags':
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return dict(cpu=name,
                cpu_features=[f for f in CPU_FEATURES if f in flags])


def machine(device: str) -> dict:
    """What the figures were measured with: PyTorch, the CPU (model and
    instruction sets: on a CPU they set the speed, on a GPU the host's
    launches), and on CUDA the GPU and the CUDA release."""
    import torch
    found = dict(torch=torch.__version__, **cpu_description())
    if device == 'cuda':
        found.update(gpu=torch.cuda.get_device_name(),
                     cuda=torch.version.cuda)
    return found
