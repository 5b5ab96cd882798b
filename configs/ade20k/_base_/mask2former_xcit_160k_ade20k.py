# Mask2Former with an XCiT backbone on ADE20K, 160k iterations of 512x512
# crops: mmseg 1.2's Swin Mask2Former recipe
# (configs/mask2former/mask2former_swin-t_8xb2-160k_ade20k-512x512.py on
# mask2former_r50_8xb2-160k_ade20k-512x512.py: mmdet's Mask2FormerHead with
# its deformable-attention pixel decoder, 100 queries, AdamW lr 1e-4, weight
# decay 0.05, gradient clipping at 0.01, poly decay, 16 images per batch)
# with the XCiT backbone in place of Swin, and that recipe's parameter rules
# (below). No XCiT result has been published for this head. Per-model files
# change only the preset, the head input channels, drop path and eta.
_base_ = ['mmseg::mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py',
          '../../_base_/xcit_backbone.py']
custom_imports = dict(
    imports=['mmdet.models', 'xcit_dense', 'xcit_dense.pixel_decoder'],
    allow_failed_imports=False)

model = dict(
    backbone={{_base_.xcit_backbone}},
    decode_head=dict(
        in_channels=[384] * 4,
        # mmdet's pixel decoder in fp32 under AMP, as Mask2Former's published
        # one runs ("deformable detr does not support half precision";
        # xcit_dense/pixel_decoder.py); fp32 runs unchanged
        pixel_decoder=dict(type='xcit_dense.Float32MSDeformAttnPixelDecoder'),
        # mmdet's matcher with its costs in fp32 under AMP, as Mask2Former's
        # published matcher: in fp16 a background query's mask cost over
        # the 12,544 points overflows (xcit_dense/matching.py); fp32 runs
        # unchanged
        train_cfg=dict(
            assigner=dict(type='xcit_dense.Float32HungarianAssigner'))))

# The Swin recipe's parameter rules (mmseg's
# mask2former_swin-t_8xb2-160k_ade20k-512x512.py): the backbone at 0.1 of
# the lr; no weight decay on the backbone's norms (Swin's custom_keys name
# each block's norm layers; XCiT's are the blocks' norm1-3, the parameters
# the published XCiT rule exempts), the query and level embeddings and the
# heads' norm layers (norm_decay_mult).
_backbone_norm = dict(lr_mult=0.1, decay_mult=0.0)
_embed = dict(lr_mult=1.0, decay_mult=0.0)
# keys for 24 blocks: the 12-block presets' parameters never match 12-23
_custom_keys = dict(
    {f'backbone.blocks.{i}.norm': _backbone_norm for i in range(24)},
    backbone=dict(lr_mult=0.1, decay_mult=1.0),
    query_embed=_embed, query_feat=_embed, level_embed=_embed)
optim_wrapper = dict(
    constructor='xcit_dense.NoDecayOptimWrapperConstructor',
    paramwise_cfg=dict(
        custom_keys=dict(_delete_=True, **_custom_keys),
        norm_decay_mult=0.0,
        apply_no_weight_decay=False))
# mmengine's iteration loop, resumable at any iteration to the same result
train_cfg = dict(type='xcit_dense.IterBasedTrainLoop')
# checkpoints written to a temporary name and renamed into place
default_hooks = dict(
    checkpoint=dict(backend_args=dict(backend='atomic_local')))
# every loaded checkpoint checked strictly; a checkpoint on SIGTERM / SIGINT
# / SIGUSR1
custom_hooks = {{_base_.xcit_custom_hooks}}
