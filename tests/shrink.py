"""A config's detector or segmentor shrunk for a test on the CPU: the same
modules and code paths as the config builds, a fraction of the time."""
import copy


def trained_in_tests(config_name: str) -> bool:
    """Whether a config's test trains a step and predicts: XCiT-S12's (either
    patch size, so both pyramids) and the demos stand for their recipe's
    sizes, whose other configs are built and run forward once (each test
    checks their heads' channels against the backbone's width)."""
    return '_s12' in config_name or config_name.startswith('demo_')


def runs_forward(model):
    """The maps of ``model``'s backbone (and neck) on one small image, in
    eval mode, each checked finite."""
    import torch
    model.eval()
    with torch.no_grad():
        feats = model.extract_feat(torch.randn(1, 3, 64, 96))
    assert all(torch.isfinite(f).all() for f in feats)
    return feats


def stages(value):
    """A head config, or a cascade's list of them, as a list."""
    return value if isinstance(value, list) else [value]


def shrink_mask2former(head):
    """Fewer queries, decoder and pixel-decoder layers and loss points: the
    same modules and code paths, a fraction of the time."""
    if head.type.split('.')[-1] != 'Mask2FormerHead':
        return
    head.num_queries = 10
    head.transformer_decoder.num_layers = head.num_transformer_feat_level
    head.pixel_decoder.encoder.num_layers = 1
    if 'train_cfg' in head:  # mmseg's; mmdet's is the detector's
        head.train_cfg.num_points = 256


def shrunk(model_cfg, **backbone):
    """A copy of ``model_cfg`` with the backbone at 4 blocks (a pyramid tap
    after each) without a pretrained file (``backbone``: more of its
    settings); a two-stage detector with fewer RoIs and narrower box and
    mask heads (each stage of a cascade); Mask2Former with fewer queries,
    layers and loss points and no batch padding to 1024 (LSJ); a
    segmentor's crops at 64x96."""
    cfg = copy.deepcopy(model_cfg)
    cfg.backbone.update(depth=4, out_indices=(0, 1, 2, 3), init_cfg=None,
                        **backbone)
    if cfg.get('roi_head'):
        cfg.train_cfg.rpn_proposal.max_per_img = 64
        cfg.test_cfg.rpn.max_per_img = 64
        for stage in stages(cfg.train_cfg.rcnn):
            stage.sampler.num = 32
        for head in stages(cfg.roi_head.bbox_head):
            head.update(conv_out_channels=32, fc_out_channels=64)
        cfg.roi_head.mask_head.conv_out_channels = 32
    elif cfg.get('panoptic_head'):  # mmdet's Mask2Former
        shrink_mask2former(cfg.panoptic_head)
        cfg.train_cfg.num_points = 256
        cfg.data_preprocessor.batch_augments = None
    else:  # a segmentor
        shrink_mask2former(cfg.decode_head)
        cfg.data_preprocessor.size = (64, 96)
    return cfg


def narrowed_detector(model_cfg, width=32):
    """A two-stage detector's FPN, RPN and RoI features ``width`` wide (256
    in the recipes; NARROW_MASK_RCNN below, each stage of a cascade):
    half a training step's time; what is checked does not depend on it."""
    roi = model_cfg.roi_head
    model_cfg.neck.out_channels = width
    model_cfg.rpn_head.update(in_channels=width, feat_channels=width)
    roi.bbox_roi_extractor.out_channels = width
    roi.mask_roi_extractor.out_channels = width
    for head in stages(roi.bbox_head) + stages(roi.mask_head):
        head.in_channels = width
    return model_cfg


def narrowed_mask2former(head, width=64):
    """A Mask2Former head's features, attention and positional encodings
    ``width`` wide (256 in the recipes; FFNs twice that): half a training
    step's time and most of the build's; the same modules and code paths
    (the ADE20K tests narrow their segmentors' heads with it too)."""
    head.update(feat_channels=width, out_channels=width)
    encoder = head.pixel_decoder.encoder.layer_cfg
    decoder = head.transformer_decoder.layer_cfg
    for attn in (encoder.self_attn_cfg, decoder.self_attn_cfg,
                 decoder.cross_attn_cfg):
        attn.embed_dims = width
    for ffn in (encoder.ffn_cfg, decoder.ffn_cfg):
        ffn.update(embed_dims=width, feedforward_channels=2 * width)
    head.pixel_decoder.positional_encoding.num_feats = width // 2
    head.positional_encoding.num_feats = width // 2
    return head


#: the Mask2Former head's features, attention and positional encodings 64
#: wide (256 in the demos; FFNs 128) as :func:`narrowed_mask2former` makes
#: it, as a config's keyword arguments (the tools tests' demos)
NARROW_HEAD = """feat_channels=64, out_channels=64,
                positional_encoding=dict(num_feats=32),
                transformer_decoder=dict(num_layers=3, layer_cfg=dict(
                    self_attn_cfg=dict(embed_dims=64),
                    cross_attn_cfg=dict(embed_dims=64),
                    ffn_cfg=dict(embed_dims=64, feedforward_channels=128))),
                pixel_decoder=dict(
                    positional_encoding=dict(num_feats=32),
                    encoder=dict(num_layers=1, layer_cfg=dict(
                        self_attn_cfg=dict(embed_dims=64),
                        ffn_cfg=dict(embed_dims=64,
                                     feedforward_channels=128)))))"""
#: the demo Mask R-CNN's FPN and heads 32 wide, as keyword arguments of a
#: config's ``model = dict(...)``: a third of the demo's time per iteration
#: in the tests of the tools and of interruptions (what they check does not
#: depend on the heads' width).
NARROW_MASK_RCNN = """neck=dict(out_channels=32),
             rpn_head=dict(in_channels=32, feat_channels=32),
             roi_head=dict(
                 bbox_roi_extractor=dict(out_channels=32),
                 bbox_head=dict(in_channels=32, fc_out_channels=64),
                 mask_roi_extractor=dict(out_channels=32),
                 mask_head=dict(in_channels=32, conv_out_channels=32))"""
#: the same as a tool's ``--cfg-options``
NARROW_MASK_RCNN_OPTIONS = [
    'model.neck.out_channels=32', 'model.rpn_head.in_channels=32',
    'model.rpn_head.feat_channels=32',
    'model.roi_head.bbox_roi_extractor.out_channels=32',
    'model.roi_head.bbox_head.in_channels=32',
    'model.roi_head.bbox_head.fc_out_channels=64',
    'model.roi_head.mask_roi_extractor.out_channels=32',
    'model.roi_head.mask_head.in_channels=32',
    'model.roi_head.mask_head.conv_out_channels=32']
