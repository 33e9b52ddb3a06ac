"""Images/s and peak memory of a MiTA model against full attention, in one
run: the SDPA twin and mmseg's own ViT.

    python tools/benchmark_backbone.py CONFIG [--twin TWIN_CONFIG]
        [--size 512 512] [--batch 1] [--part backbone|segmentor]
        [--train] [--repeats 3] [--device cpu] [--json out.json]
        [--cfg-options key=value ...]

Three models, built with random weights (no checkpoint is loaded), get the
same random input of ``--size``:

- ``mita``: CONFIG (a ``MiTAViT`` backbone with ``mita_cfg``);
- ``sdpa``: ``--twin`` or, by default, CONFIG with ``mita_cfg=None,
  full_attention='sdpa'``: the same backbone with full attention computed
  by ``F.scaled_dot_product_attention``;
- ``mmseg``: the twin with mmseg's own ``VisionTransformer`` backbone
  (attention by mmcv's ``MultiheadAttention``, which builds N x N weights).

Runs are interleaved and the best of ``--repeats`` is reported; peak memory
is what a step allocates (``mmseg_mita.benchmarks.peak_memory``);
``--train`` times forward+backward (of the sum of the outputs for the
backbone, of the decode losses on random labels for the segmentor),
otherwise an inference forward under ``torch.no_grad``. SyncBN is turned
into BN on CPU. Every ratio is MiTA's over the named baseline.
"""
import argparse
import copy
from typing import Dict, Optional

import torch
from mmengine.config import Config, DictAction

from mmseg_mita.benchmarks import (add_measuring_options, machine_info,
                                   measuring_device, peak_memory, summarize,
                                   time_interleaved)
from mmseg_mita.utils import write_json


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='MiTA model vs its SDPA full-attention twin and '
        "mmseg's ViT: images/s and peak memory")
    parser.add_argument('config', help='config of the MiTA model')
    parser.add_argument('--twin', help='config of the SDPA full-attention '
                        'twin (default: CONFIG with mita_cfg=None, '
                        "full_attention='sdpa')")
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
    add_measuring_options(parser, repeats=3, time_budget=120.0)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of both configs')
    args = parser.parse_args(argv)
    if args.batch < 1 or args.repeats < 1:
        parser.error('--batch and --repeats must be >= 1')
    return args


MODELS_COMPARED = ('mita', 'sdpa', 'mmseg')
LABELS = dict(mita='MiTA', sdpa='SDPA twin', mmseg="mmseg's ViT")


def attention_variants(cfg: Config, twin: Optional[Config] = None
                       ) -> Dict[str, Config]:
    """``{'mita', 'sdpa', 'mmseg'}`` configs from a MiTA config: the SDPA
    twin (``twin`` or ``cfg`` with ``mita_cfg=None,
    full_attention='sdpa'``) and the twin with mmseg's ViT backbone."""
    backbone = cfg.model.backbone
    if backbone.get('type') != 'MiTAViT' or backbone.get('mita_cfg',
                                                          {}) is None:
        raise SystemExit(
            f'error: {cfg.filename} is not a MiTA model (backbone '
            f'{backbone.get("type")!r}, mita_cfg '
            f'{backbone.get("mita_cfg", "default")!r}); give the MiTA '
            'config first')
    if twin is None:
        twin = copy.deepcopy(cfg)
        twin.model.backbone.update(mita_cfg=None, full_attention='sdpa')
    mmseg = copy.deepcopy(twin)
    mmseg.model.backbone.pop('mita_cfg', None)
    mmseg.model.backbone.pop('full_attention', None)
    mmseg.model.backbone.type = 'VisionTransformer'
    return dict(mita=cfg, sdpa=twin, mmseg=mmseg)


def load_configs(args) -> Dict[str, Config]:
    """The MiTA config, its SDPA twin and the twin with mmseg's ViT."""
    import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
    configs = [Config.fromfile(args.config)]
    if args.twin:
        configs.append(Config.fromfile(args.twin))
    for c in configs:
        if args.cfg_options:
            c.merge_from_dict(args.cfg_options)
    return attention_variants(*configs)


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


def make_step(model, part: str, train: bool, images: torch.Tensor,
              seed: int = 0):
    """One measured call: inference forward or forward+backward (of the
    segmentor: on random labels drawn from ``seed``)."""
    samples = _random_labels(images, seed) if part != 'backbone' else None

    def outputs():
        if part == 'backbone':
            return model(images)
        if not train:
            return model(images, mode='tensor')
        return model(images, samples, mode='loss')

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


def _random_labels(images: torch.Tensor, seed: int):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    b, _, h, w = images.shape
    gen = torch.Generator().manual_seed(seed)
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
    device = measuring_device(args)
    configs = load_configs(args)
    size = _input_size(configs['mita'], args)
    gen = torch.Generator().manual_seed(args.seed)
    images = torch.randn(args.batch, 3, *size, generator=gen).to(device)

    steps, memory = {}, {}
    for name, c in configs.items():
        steps[name] = make_step(build(c, args.part, device), args.part,
                                args.train, images, args.seed)
        memory[name] = peak_memory(steps[name], device)  # also the warm-up
    times = time_interleaved(steps, device, args.repeats, args.time_budget)

    results = {}
    for name in steps:
        stats = summarize(times[name])
        results[name] = dict(stats, peak_bytes=memory[name],
                             images_per_s=args.batch / stats['best_s'])
    mita = results['mita']
    result = dict(
        machine=machine_info(device), args=vars(args), input_size=size,
        results=results,
        time_ratio={
            base: mita['best_s'] / results[base]['best_s']
            for base in ('sdpa', 'mmseg')
        },
        memory_ratio={
            base: mita['peak_bytes'] / max(results[base]['peak_bytes'], 1)
            for base in ('sdpa', 'mmseg')
        })
    mode = 'forward+backward' if args.train else 'inference'
    print(f'{args.part} {mode}, batch {args.batch}, input {size[0]}x'
          f'{size[1]}, {device.type}')
    print(f'{"attention":<13} {"images/s":>10} {"peak MiB":>10} '
          f'{"MiTA time /":>12} {"MiTA memory /":>14}')
    for name in MODELS_COMPARED:
        r = results[name]
        ratios = ('' if name == 'mita' else
                  f'{result["time_ratio"][name]:>12.3f} '
                  f'{result["memory_ratio"][name]:>14.3f}')
        print(f'{LABELS[name]:<13} {r["images_per_s"]:>10.2f} '
              f'{r["peak_bytes"] / 2**20:>10.1f} {ratios}')
    print('(ratios: MiTA over the row\'s model; < 1 is MiTA faster / '
          'smaller)')
    if args.json:
        write_json(result, args.json)
    return result


if __name__ == '__main__':
    main()
