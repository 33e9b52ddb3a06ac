"""Evaluate a checkpoint under MiTA for a grid of landmark grids and top-k.

    python tools/sweep_mk.py CONFIG CKPT --pool-sizes 3 5 7 9 \\
        --topks 9 25 49 81 [--work-dir DIR] [--cfg-options ...]

Evaluates mIoU on the config's test set (mmengine's ``Runner`` and test
loop, the config's evaluator) with full attention first, then with MiTA at
every ``(m = p * p, k)``; the weights are loaded once, since MiTA has no
parameters. CKPT may come from a full-attention config (mmseg's
``VisionTransformer``: the backbone is built as ``MiTAViT``, same keys) or a
MiTA one. Prints the grid with the training setting marked ``*`` and writes
``sweep_mk.png`` (heatmap) and ``sweep_mk.json`` to the work dir. Pool sizes
larger than the patch grid of the test images are skipped.
"""
import argparse
import os.path as osp

from mmengine.config import Config, DictAction

from mmseg_mita.utils import write_atomic, write_json

BACKBONES = ('VisionTransformer', 'MiTAViT')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0].replace('\n', ' '))
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--pool-sizes', type=int, nargs='+',
                        default=[3, 5, 7, 9],
                        help='landmark grids p (m = p * p)')
    parser.add_argument('--topks', type=int, nargs='+',
                        default=[9, 25, 49, 81], help='routed keys k')
    parser.add_argument('--work-dir', help='default: work_dirs/sweep_mk/'
                        '<config name>')
    parser.add_argument('--verbose', action='store_true',
                        help="show mmengine's INFO log")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, as in tools/test.py')
    args = parser.parse_args(argv)
    for name in ('pool_sizes', 'topks'):
        bad = [v for v in getattr(args, name) if v < 1]
        if bad:
            parser.error(f'--{name.replace("_", "-")} must be >= 1, got {bad}')
    return args


def training_setting(backbone_cfg):
    """(p, k) the config trains with, or None for full attention."""
    if backbone_cfg.get('type') != 'MiTAViT':
        return None
    from mmseg_mita.models.backbones.mita_vit import MITA_DEFAULTS
    mita = backbone_cfg.get('mita_cfg', MITA_DEFAULTS)
    if mita is None:
        return None
    mita = {**MITA_DEFAULTS, **mita}
    pool = mita['pool_size']
    if not isinstance(pool, int):
        pool = pool[0] if pool[0] == pool[1] else tuple(pool)
    return pool, mita['topk']


def make_runner(args):
    from mmengine.runner import Runner
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    backbone = cfg.model.backbone
    if backbone.get('type') not in BACKBONES:
        raise SystemExit(f'error: the backbone must be one of {BACKBONES}, '
                         f'got {backbone.get("type")!r}')
    trained = training_setting(backbone)
    layers = (backbone.get('mita_cfg') or {}).get('layers', 'all')
    backbone.type, backbone.mita_cfg = 'MiTAViT', None
    cfg.load_from = args.checkpoint
    cfg.work_dir = args.work_dir or osp.join(
        'work_dirs', 'sweep_mk',
        osp.splitext(osp.basename(args.config))[0])
    if not args.verbose:
        cfg.log_level = 'WARNING'
    return Runner.from_cfg(cfg), trained, layers


def record_min_grid(backbone):
    """Track the smallest patch grid the backbone sees (images may differ)."""
    seen = {}

    def hook(module, inputs, outputs):
        h, w = outputs[1]
        seen['hw'] = (min(h, seen.get('hw', (h, w))[0]),
                      min(w, seen.get('hw', (h, w))[1]))

    backbone.patch_embed.register_forward_hook(hook)
    return seen


def format_grid(results, pool_sizes, topks, trained):
    """The mIoU table as text; the training setting marked with *."""
    lines = [f'full attention: mIoU {results["full"]:.2f}'
             + ('  *' if trained is None else '')]
    header = 'm \\ k'.ljust(12) + ''.join(f'{k:>8d} ' for k in topks)
    lines += [header]
    for p in pool_sizes:
        row = f'{p * p} ({p}x{p})'.ljust(12)
        for k in topks:
            value = results['mita'].get(f'{p},{k}')
            mark = '*' if trained == (p, k) else ' '
            row += ('skipped'.rjust(8) if value is None else
                    f'{value:8.2f}') + mark
        lines.append(row)
    return '\n'.join(lines)


def plot_heatmap(results, pool_sizes, topks, trained, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np
    grid = np.array([[results['mita'].get(f'{p},{k}', np.nan) for k in topks]
                     for p in pool_sizes], dtype=float)
    fig, ax = plt.subplots(figsize=(1.3 * len(topks) + 2.5,
                                    1.0 * len(pool_sizes) + 1.8))
    image = ax.imshow(grid, cmap='viridis', aspect='auto')
    for i, p in enumerate(pool_sizes):
        for j, k in enumerate(topks):
            if not np.isnan(grid[i, j]):
                text = f'{grid[i, j]:.1f}' + ('*' if trained == (p, k) else '')
                ax.text(j, i, text, ha='center', va='center', color='w'
                        if grid[i, j] < np.nanmean(grid) else 'k')
    ax.set_xticks(range(len(topks)), [str(k) for k in topks])
    ax.set_yticks(range(len(pool_sizes)),
                  [f'{p * p} ({p}x{p})' for p in pool_sizes])
    ax.set_xlabel('k (routed keys per expert)')
    ax.set_ylabel('m (landmarks)')
    trained_txt = 'full attention' if trained is None else \
        f'MiTA p={trained[0]}, k={trained[1]} (*)'
    ax.set_title(f'mIoU under MiTA; full attention: {results["full"]:.1f}\n'
                 f'trained with {trained_txt}', fontsize=9)
    fig.colorbar(image, ax=ax, label='mIoU')
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=100, format='png'))
    plt.close(fig)


def sweep(runner, pool_sizes, topks, layers, log=print):
    """mIoU with full attention, then for every (p, k) that fits."""
    model = getattr(runner.model, 'module', runner.model)
    backbone = model.backbone
    seen = record_min_grid(backbone)
    backbone.set_mita(None)
    results = {'full': runner.test()['mIoU'], 'mita': {}}
    log(f'full attention: mIoU {results["full"]:.2f}')
    grid = seen['hw']
    for p in pool_sizes:
        if p > min(grid):
            log(f'pool size {p} skipped: larger than the smallest patch grid '
                f'{grid[0]}x{grid[1]} of the test images')
            continue
        for k in topks:
            backbone.set_mita(dict(pool_size=p, topk=k, layers=layers))
            results['mita'][f'{p},{k}'] = runner.test()['mIoU']
            log(f'm={p * p:3d} (p={p}), k={k:3d}: mIoU '
                f'{results["mita"][f"{p},{k}"]:.2f}')
    results['patch_grid'] = list(grid)
    return results


def main(argv=None):
    args = parse_args(argv)
    import mmseg_mita  # noqa: F401  (registers MiTAViT, applies compat)
    runner, trained, layers = make_runner(args)
    results = sweep(runner, args.pool_sizes, args.topks, layers)
    results.update(config=args.config, checkpoint=args.checkpoint,
                   trained=trained, layers=layers)
    print(format_grid(results, args.pool_sizes, args.topks, trained))
    print('* = the setting the config trains with')
    png = osp.join(runner.work_dir, 'sweep_mk.png')
    plot_heatmap(results, args.pool_sizes, args.topks, trained, png)
    write_json(results, osp.join(runner.work_dir, 'sweep_mk.json'))
    print(f'wrote {png} and sweep_mk.json')
    return results


if __name__ == '__main__':
    main()
