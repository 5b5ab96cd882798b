# What every XCiT recipe (COCO and ADE20K, each head) starts from, as
# variables that no mmdet or mmseg base defines, so that a recipe inherits
# this file beside its toolkit's bases and uses them by name:
# `backbone={{_base_.xcit_backbone}}`, `custom_hooks =
# {{_base_.xcit_custom_hooks}}`. Per-model files change the preset, drop
# path, eta and ImageNet checkpoint.

# XCiT-S12/16 from the ImageNet-1k weights of the published training command
# (384 px, distilled; facebookresearch/xcit detection and semantic
# segmentation READMEs). Its out_indices default to the published taps:
# (3, 5, 7, 11) for depth 12, (7, 11, 15, 23) for depth 24, one per pyramid
# level (strides 4, 8, 16, 32), each embed_dim wide.
xcit_backbone = dict(
    _delete_=True,
    type='xcit_dense.XCiT',
    arch='small_12_p16',
    drop_path_rate=0.05,
    eta=1.0,
    # compiled where compiling was measured faster than eager (the policy's
    # COMPILE in xcit_dense/models/policy.py: no device today, so eager on
    # the CPU and on GPUs); compile_cfg=True or a dict of torch.compile
    # arguments opts in, and a failed compile falls back to eager.
    compile_cfg='auto',
    # on GPUs, inference and training steps replayed from CUDA graphs (one
    # launch where the eager backbone launches hundreds; the policy's GRAPHS)
    # for inputs that recur: fixed-size crops and test sizes seen 3 times,
    # training sizes 3 times in a row (multi-scale detection runs eagerly);
    # eager on the CPU. cuda_graphs=False turns them off.
    cuda_graphs='auto',
    init_cfg=dict(
        type='Pretrained',
        checkpoint='https://dl.fbaipublicfiles.com/xcit/'
        'xcit_small_12_p16_384_dist.pth'))

# Published (mmdet 2.11 / mmseg 0.11) checkpoints converted on loading, every
# loaded checkpoint checked strictly; a checkpoint on SIGTERM / SIGINT /
# SIGUSR1 (tools/*.py add these to configs that lack them).
xcit_custom_hooks = [
    dict(type='xcit_dense.CheckpointImportHook'),
    dict(type='xcit_dense.PreemptionHook', signal='SIGUSR1'),
]
