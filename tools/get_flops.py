"""Count a detector's or segmentor's FLOPs and parameters, as mmdet's and
mmseg's tools/analysis_tools/get_flops.py do.

    python tools/get_flops.py CONFIG [--shape H [W]] [--num-images N]

With ``--shape`` (mmseg's option), one image of that size (H alone: H x H)
through the config's data preprocessor; with ``--num-images N`` (mmdet's), the
mean over the first N images of the config's validation set, through its
test pipeline. Without either, detection takes mmdet's default (100 images)
and segmentation mmseg's (``--shape 2048 1024``). mmengine's counter
counts one multiply-add as one FLOP over the model's 'tensor'-mode forward
(mmdet 3's: the RoI heads on the RPN's proposals, up to the test config's
1000, masks on the first 100 of them, a cascade's on all of them at every
stage), and the backbone's published arithmetic: a trace takes none of its
fast paths (xcit_dense/complexity.py). The auxiliary head of a segmentor,
used in training only, is left out, as in mmseg's tool.
"""
import argparse
import os.path as osp
import statistics
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from xcit_dense.cli import (  # noqa: E402
    add_cfg_options,
    add_shape_option,
    image_shape,
    load_config,
    positive_int,
    run_cli,
)
from xcit_dense.errors import UserError  # noqa: E402
from xcit_dense.preflight import (  # noqa: E402
    check_backbone,
    check_channels,
    check_datasets,
)
from xcit_dense.toolkits import check_toolkit  # noqa: E402

#: mmseg's get_flops.py default input, (H, W)
SEGMENTATION_SHAPE = (2048, 1024)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='config file (or a model of the '
                        'model index)')
    add_shape_option(parser, help='one random image of this size, H [W] '
                     '(segmentation\'s default: 2048 1024)')
    parser.add_argument(
        '--num-images', type=positive_int,
        help='the mean over this many images of the validation set '
        '(detection\'s default: 100)')
    add_cfg_options(parser)
    args = parser.parse_args()
    args.shape = image_shape(parser, args)
    if args.shape is not None and args.num_images is not None:
        parser.error('--shape counts one random image of that size, '
                     '--num-images the validation set\'s images: give one '
                     'of them')
    return args


def random_batch(scope, shape):
    """One random image of ``shape`` (H, W) and its data sample, as mmseg's
    get_flops.py makes it (seeded: a detector's proposals, and so the
    count of its RoI heads, depend on the image)."""
    import torch
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample as Sample
    else:
        from mmseg.structures import SegDataSample as Sample
    meta = dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                scale_factor=(1.0, 1.0))
    image = torch.randint(0, 256, (3, *shape), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(0))
    return dict(inputs=[image],
                data_samples=[Sample(metainfo=meta)])


def validation_batches(cfg, number):
    """The first ``number`` images of the config's validation set, one a
    batch, as mmdet's get_flops.py reads them (read once the toolkit is
    set up: the model's building does that)."""
    from mmengine.runner import Runner
    loader = dict(cfg.val_dataloader, batch_size=1, num_workers=0,
                  persistent_workers=False)
    for i, batch in enumerate(Runner.build_dataloader(loader)):
        if i == number:
            return
        yield batch


def size(number):
    """``number`` in G or M, as the tables print FLOPs and parameters."""
    if number >= 1e9:
        return f'{number / 1e9:.1f}G'
    return f'{number / 1e6:.2f}M'


def batches_to_count(cfg, scope, args):
    """The batches to count and how they were made (the tool's 'Compute
    type'): one random image of ``--shape`` (segmentation's default
    shape), else the validation set's first images."""
    shape = args.shape
    if shape is None and args.num_images is None and scope == 'mmseg':
        shape = SEGMENTATION_SHAPE
    if shape is not None:
        return [random_batch(scope, shape)], \
            'direct: randomly generate a picture'
    try:
        check_datasets(cfg, ('val', ))
    except UserError as e:
        raise UserError(f'{str(e).rstrip(".")}; or count one image '
                        f'of a given size instead: --shape H W (e.g. '
                        f'--shape 800 1333).')
    return validation_batches(cfg, args.num_images or 100), \
        'dataloader: load a picture from the dataset'


def build_model(cfg):
    """The config's model, seeded, SyncBN as BatchNorm, without the
    segmentor's auxiliary head (training only, as in mmseg's tool)."""
    import torch
    from mmengine.model import revert_sync_batchnorm

    from xcit_dense.inference import init_model
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    # seeded initial weights: a detector's proposals, and so the count of
    # its RoI heads, depend on them as on the image
    torch.manual_seed(0)
    model = revert_sync_batchnorm(init_model(cfg, None, device))
    if getattr(model, 'auxiliary_head', None) is not None:
        model.auxiliary_head = None
    return model


def print_counts(model, counts, compute_type, given, padded):
    """The counts as mmdet's and mmseg's get_flops.py print them, then the
    backbone's and what was not counted."""
    last = counts[-1]
    flops = statistics.mean(c.flops for c in counts)
    line = '=' * 30
    if padded != given:
        print(f'{line}\nUse size divisor set input shape from {given} to '
              f'{padded}')
    images = '' if len(counts) == 1 else \
        f' (the last of {len(counts)} images; Flops: their mean)'
    print(f'{line}\nCompute type: {compute_type}\n'
          f'Input shape: {padded}{images}\nFlops: {size(flops)}\n'
          f'Params: {size(last.params)}\n{line}')
    if last.backbone_params:
        backbone = statistics.mean(c.backbone_flops for c in counts)
        print(f'Backbone ({type(model.backbone).__name__}): Flops '
              f'{size(backbone)}, Params {size(last.backbone_params)}')
    uncounted = ', '.join(f'{op} ({n})'
                          for op, n in sorted(last.uncounted.items()))
    print('Flops are multiply-adds (as in mmdet\'s and mmseg\'s tables) of '
          'the operators mmengine\'s counter has rules for; not counted '
          f'(how often each ran): {uncounted or "none"}.')


def main():
    args = parse_args()
    cfg = load_config(args.config, args.cfg_options)
    scope = check_toolkit(cfg.get('default_scope'))
    check_channels(cfg, check_backbone(cfg))
    batches, compute_type = batches_to_count(cfg, scope, args)

    from xcit_dense.complexity import count
    model = build_model(cfg)
    counts = []
    for batch in batches:
        data = model.data_preprocessor(batch)
        counts.append(count(model, data['inputs'], data['data_samples']))
        # the image as the pipeline left it, and as the preprocessor padded it
        given = tuple(data['data_samples'][0].img_shape)
        padded = tuple(data['inputs'].shape[-2:])
    if not counts:
        raise UserError('The validation set of the config has no images.')
    print_counts(model, counts, compute_type, given, padded)


if __name__ == '__main__':
    run_cli(main)
