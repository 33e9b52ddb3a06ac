"""Images/s and peak memory of a MiTA model against its full-attention twin.

    python tools/benchmark_backbone.py CONFIG [--twin TWIN_CONFIG]
        [--size 512 512] [--batch 1] [--part backbone|segmentor]
        [--train] [--repeats 3] [--device cpu] [--json out.json]
        [--cfg-options key=value ...]

The twin is ``--twin`` or, by default, CONFIG itself with
``model.backbone.mita_cfg=None`` (``MiTAViT`` is then exactly mmseg's
``VisionTransformer``). Both models are built with random weights (no
checkpoint is loaded) and get the same random input of ``--size``; runs are
interleaved and the best of ``--repeats`` is reported; peak memory is what
a step allocates (``mmseg_mita.benchmarks.peak_memory``). ``--train`` times
forward+backward (of the sum of the outputs for the backbone, of the
decode losses on random labels for the segmentor), otherwise an inference
forward under ``torch.no_grad``. SyncBN is turned into BN on CPU.
"""
import argparse

import torch
from mmengine.config import Config, DictAction

from mmseg_mita.benchmarks import (machine_info, peak_memory, summarize,
                                   time_interleaved)
from mmseg_mita.utils import write_json


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='MiTA model vs its full-attention twin: images/s and '
        'peak memory')
    parser.add_argument('config', help='config of the MiTA model')
    parser.add_argument('--twin', help='config of the full-attention twin '
                        '(default: CONFIG with model.backbone.mita_cfg=None)')
    parser.add_argument('--size', type=int, nargs=2, default=None,
                        metavar=('H', 'W'),
                        help='input size (default: the backbone img_size)')
    parser.add_argument('--batch', type=int, default=2,
                        help='images per step (>= 2 for --train with BN '
                        'after global pooling, as in UPerNet)')
    parser.add_argument('--part', choices=('backbone', 'segmentor'),
                        default='backbone')
    parser.add_argument('--train', action='store_true',
                        help='time forward+backward instead of inference')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--time-budget', type=float, default=120.0,
                        help='stop repeating a model once its runs add up '
                        'to this many seconds')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--threads', type=int, default=0,
                        help='torch CPU threads (0: torch default)')
    parser.add_argument('--json', metavar='PATH',
                        help="write the results as JSON ('-': stdout)")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of both configs')
    args = parser.parse_args(argv)
    if args.batch < 1 or args.repeats < 1:
        parser.error('--batch and --repeats must be >= 1')
    return args


def load_configs(args):
    """The MiTA config and its full-attention twin."""
    import mmseg_mita  # noqa: F401  (registers MiTAViT)
    cfg = Config.fromfile(args.config)
    if args.twin:
        twin = Config.fromfile(args.twin)
    else:
        if cfg.model.backbone.get('type') != 'MiTAViT':
            raise SystemExit(
                f'error: {args.config} has backbone '
                f'{cfg.model.backbone.get("type")!r}, not MiTAViT; pass its '
                'twin with --twin, or give the MiTA config first')
        twin = Config.fromfile(args.config)
        twin.model.backbone.mita_cfg = None
    for c in (cfg, twin):
        if args.cfg_options:
            c.merge_from_dict(args.cfg_options)
    return cfg, twin


def build(cfg: Config, part: str, device: torch.device):
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    model = MODELS.build(cfg.model.backbone if part == 'backbone' else
                         cfg.model)
    if device.type == 'cpu':
        model = revert_sync_batchnorm(model)
    return model.to(device)


def _input_size(cfg: Config, args):
    if args.size:
        return tuple(args.size)
    size = cfg.model.backbone.get('img_size', 224)
    return (size, size) if isinstance(size, int) else tuple(size)


def make_step(model, part: str, train: bool, images: torch.Tensor):
    """One measured call: inference forward or forward+backward."""
    def outputs():
        if part == 'backbone':
            return model(images)
        if not train:
            return model(images, mode='tensor')
        return model(images, _random_labels(images), mode='loss')

    def loss(out):
        if isinstance(out, dict):  # segmentor losses
            return sum(v.sum() for k, v in out.items() if 'loss' in k)
        return sum(t.float().mean() for t in out)

    def step():
        if not train:
            with torch.no_grad():
                return outputs()
        model.zero_grad(set_to_none=True)
        loss(outputs()).backward()

    model.train(train)
    return step


def _random_labels(images: torch.Tensor):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    b, _, h, w = images.shape
    gen = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(b):
        sample = SegDataSample(metainfo=dict(img_shape=(h, w),
                                             pad_shape=(h, w),
                                             ori_shape=(h, w)))
        labels = torch.randint(0, 2, (1, h, w), generator=gen)
        sample.gt_sem_seg = PixelData(data=labels.to(images.device))
        samples.append(sample)
    return samples


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg, twin = load_configs(args)
    size = _input_size(cfg, args)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch, 3, *size, generator=gen).to(device)

    steps, memory = {}, {}
    for name, c in (('mita', cfg), ('full', twin)):
        steps[name] = make_step(build(c, args.part, device), args.part,
                                args.train, images)
        memory[name] = peak_memory(steps[name], device)  # also the warm-up
    times = time_interleaved(steps, device, args.repeats, args.time_budget)

    results = {}
    for name in steps:
        stats = summarize(times[name])
        results[name] = dict(stats, peak_bytes=memory[name],
                             images_per_s=args.batch / stats['best_s'])
    result = dict(
        machine=machine_info(device), args=vars(args), input_size=size,
        results=results,
        speedup=results['full']['best_s'] / results['mita']['best_s'],
        memory_ratio=results['mita']['peak_bytes'] /
        max(results['full']['peak_bytes'], 1))
    mode = 'forward+backward' if args.train else 'inference'
    print(f'{args.part} {mode}, batch {args.batch}, input {size[0]}x'
          f'{size[1]}, {device.type}')
    print(f'{"attention":<10} {"images/s":>10} {"peak MiB":>10}')
    for name, label in (('mita', 'MiTA'), ('full', 'full')):
        r = results[name]
        print(f'{label:<10} {r["images_per_s"]:>10.2f} '
              f'{r["peak_bytes"] / 2**20:>10.1f}')
    print(f'MiTA speed-up {result["speedup"]:.2f}x, memory '
          f'{result["memory_ratio"]:.2f}x of full attention')
    if args.json:
        write_json(result, args.json)
    return result


if __name__ == '__main__':
    main()
