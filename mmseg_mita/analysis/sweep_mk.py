"""Evaluate a checkpoint under MiTA for a grid of landmark grids and top-k,
and for the paper's variants.

    python tools/sweep_mk.py CONFIG CKPT --pool-sizes 3 5 7 9 \\
        --topks 9 25 49 81 [--experts-per-query 1 2] [--ablations] \\
        [--work-dir DIR] [--cfg-options ...]

Evaluates mIoU on the config's test set (mmengine's ``Runner`` and test
loop, the config's evaluator) with full attention first, then with MiTA at
every ``(m = p * p, k)`` for every variant: ``s`` routed experts per query
for each ``--experts-per-query`` (``MiTA``, ``MiTA s=2``, ...) and, with
``--ablations``, routing-only at each ``s`` (``shared_expert=False``) and
compression-only (``routed_experts=False``; it has no ``k``, so one column).
The weights are loaded once, since MiTA has no parameters. CKPT may come
from a full-attention config (mmseg's ``VisionTransformer``: the backbone is
built as ``MiTAViT``, same keys) or a MiTA one, whose ``layers`` and
``landmarks`` the sweep keeps. Prints one grid per variant with the
training setting marked ``*`` and writes ``sweep_mk.png`` (heatmaps) and
``sweep_mk.json`` (``mita``: variant -> ``"p,k"`` (``"p"`` for
compression-only) -> mIoU) to the work dir. Pool sizes larger than the
patch grid of the test images, and ``s > m``, are skipped.
"""
import argparse
import os.path as osp

from mmengine.config import Config, DictAction

from mmseg_mita.utils import write_atomic, write_json

BACKBONES = ('VisionTransformer', 'MiTAViT')
COMPRESSION_ONLY = 'compression-only'


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
    parser.add_argument('--experts-per-query', type=int, nargs='+',
                        default=[1], metavar='S',
                        help='routed experts per query s (default: 1)')
    parser.add_argument('--ablations', action='store_true',
                        help='also routing-only (at each s) and '
                        'compression-only')
    parser.add_argument('--work-dir', help='default: work_dirs/sweep_mk/'
                        '<config name>')
    parser.add_argument('--verbose', action='store_true',
                        help="show mmengine's INFO log")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, as in tools/test.py')
    args = parser.parse_args(argv)
    for name in ('pool_sizes', 'topks', 'experts_per_query'):
        bad = [v for v in getattr(args, name) if v < 1]
        if bad:
            parser.error(f'--{name.replace("_", "-")} must be >= 1, got {bad}')
    return args


def variant_name(experts_per_query=1, shared_expert=True,
                 routed_experts=True) -> str:
    """``'MiTA'``, ``'MiTA s=2'``, ``'routing-only'``, ``'routing-only
    s=2'`` or ``'compression-only'``."""
    if not routed_experts:
        return COMPRESSION_ONLY
    name = 'MiTA' if shared_expert else 'routing-only'
    return name if experts_per_query == 1 else f'{name} s={experts_per_query}'


def variants(experts_per_query, ablations):
    """(name, mita_cfg options) of every variant to evaluate."""
    options = [dict(experts_per_query=s) for s in experts_per_query]
    if ablations:
        options += [dict(experts_per_query=s, shared_expert=False)
                    for s in experts_per_query]
        options.append(dict(routed_experts=False))
    return [(variant_name(**o), o) for o in options]


def training_setting(backbone_cfg):
    """(variant, p, k) the config trains with (``k`` None for
    compression-only), or None for full attention."""
    if backbone_cfg.get('type') != 'MiTAViT':
        return None
    from mmseg_mita.models.backbones.mita_vit import LAYER_KEYS
    from mmseg_mita.ops.options import DEFAULTS
    mita = backbone_cfg.get('mita_cfg', LAYER_KEYS)
    if mita is None:
        return None
    mita = {**DEFAULTS, **mita}
    pool = mita['pool_size']
    if not isinstance(pool, int):
        pool = pool[0] if pool[0] == pool[1] else tuple(pool)
    name = variant_name(mita['experts_per_query'], mita['shared_expert'],
                        mita['routed_experts'])
    return name, pool, None if name == COMPRESSION_ONLY else mita['topk']


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
    mita = backbone.get('mita_cfg') or {}
    kept = dict(layers=mita.get('layers', 'all'),
                landmarks=mita.get('landmarks', 'patches'))
    backbone.type, backbone.mita_cfg = 'MiTAViT', None
    cfg.load_from = args.checkpoint
    cfg.work_dir = args.work_dir or osp.join(
        'work_dirs', 'sweep_mk',
        osp.splitext(osp.basename(args.config))[0])
    if not args.verbose:
        cfg.log_level = 'WARNING'
    return Runner.from_cfg(cfg), trained, kept


def record_min_grid(backbone):
    """Track the smallest patch grid the backbone sees (images may differ)."""
    seen = {}

    def hook(module, inputs, outputs):
        h, w = outputs[1]
        seen['hw'] = (min(h, seen.get('hw', (h, w))[0]),
                      min(w, seen.get('hw', (h, w))[1]))

    backbone.patch_embed.register_forward_hook(hook)
    return seen


def _columns(name, topks):
    return [None] if name == COMPRESSION_ONLY else topks


def _key(p, k):
    return str(p) if k is None else f'{p},{k}'


def format_grid(results, pool_sizes, topks, trained):
    """The mIoU tables as text, one per variant; the training setting
    marked with *."""
    lines = [f'full attention: mIoU {results["full"]:.2f}'
             + ('  *' if trained is None else '')]
    for name, grid in results['mita'].items():
        columns = _columns(name, topks)
        lines += [f'{name}:', 'm \\ k'.ljust(12) + ''.join(
            ('any k' if k is None else str(k)).rjust(8) + ' '
            for k in columns)]
        for p in pool_sizes:
            row = f'{p * p} ({p}x{p})'.ljust(12)
            for k in columns:
                value = grid.get(_key(p, k))
                mark = '*' if trained == (name, p, k) else ' '
                row += ('skipped'.rjust(8) if value is None else
                        f'{value:8.2f}') + mark
            lines.append(row)
    return '\n'.join(lines)


def plot_heatmap(results, pool_sizes, topks, trained, path):
    """One heatmap (m x k) per variant."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np
    names = list(results['mita'])
    widths = [len(_columns(name, topks)) for name in names]
    fig, axes = plt.subplots(
        1, len(names), squeeze=False, width_ratios=widths,
        figsize=(1.3 * sum(widths) + 2.5 * len(names),
                 1.0 * len(pool_sizes) + 1.8))
    values = [v for grid in results['mita'].values() for v in grid.values()]
    low, high = (min(values), max(values)) if values else (0, 1)
    for ax, name in zip(axes[0], names):
        columns = _columns(name, topks)
        grid = np.array([[results['mita'][name].get(_key(p, k), np.nan)
                          for k in columns] for p in pool_sizes], dtype=float)
        image = ax.imshow(grid, cmap='viridis', aspect='auto', vmin=low,
                          vmax=high)
        for i, p in enumerate(pool_sizes):
            for j, k in enumerate(columns):
                if not np.isnan(grid[i, j]):
                    text = f'{grid[i, j]:.1f}' + (
                        '*' if trained == (name, p, k) else '')
                    ax.text(j, i, text, ha='center', va='center', color='w'
                            if grid[i, j] < (low + high) / 2 else 'k')
        ax.set_xticks(range(len(columns)),
                      ['any' if k is None else str(k) for k in columns])
        ax.set_yticks(range(len(pool_sizes)),
                      [f'{p * p} ({p}x{p})' for p in pool_sizes])
        ax.set_xlabel('k (routed keys per expert)')
        ax.set_title(name, fontsize=9)
    axes[0][0].set_ylabel('m (landmarks)')
    trained_txt = 'full attention' if trained is None else \
        f'{trained[0]} p={trained[1]}, k={trained[2]} (*)'
    fig.suptitle(f'mIoU under MiTA; full attention: {results["full"]:.1f}; '
                 f'trained with {trained_txt}', fontsize=9)
    fig.colorbar(image, ax=axes[0].tolist(), label='mIoU')
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=100, format='png'))
    plt.close(fig)


def sweep(runner, pool_sizes, topks, kept, variant_list=(('MiTA', {}), ),
          log=print):
    """mIoU with full attention, then for every variant and (p, k) that
    fits; ``kept``: the mita_cfg keys every run keeps (layers,
    landmarks)."""
    model = getattr(runner.model, 'module', runner.model)
    backbone = model.backbone
    seen = record_min_grid(backbone)
    backbone.set_mita(None)
    results = {'full': runner.test()['mIoU'],
               'mita': {name: {} for name, _ in variant_list}}
    log(f'full attention: mIoU {results["full"]:.2f}')
    grid = seen['hw']
    for p in pool_sizes:
        if p > min(grid):
            log(f'pool size {p} skipped: larger than the smallest patch grid '
                f'{grid[0]}x{grid[1]} of the test images')
            continue
        for name, options in variant_list:
            if options.get('experts_per_query', 1) > p * p:
                log(f'{name} skipped at pool size {p}: more experts per '
                    f'query than the m={p * p} experts')
                continue
            for k in _columns(name, topks):
                topk = {} if k is None else dict(topk=k)
                backbone.set_mita(dict(pool_size=p, **topk, **kept,
                                       **options))
                miou = runner.test()['mIoU']
                results['mita'][name][_key(p, k)] = miou
                log(f'{name}: m={p * p:3d} (p={p})' +
                    ('' if k is None else f', k={k:3d}') +
                    f': mIoU {miou:.2f}')
    results['patch_grid'] = list(grid)
    return results


def main(argv=None):
    args = parse_args(argv)
    import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
    runner, trained, kept = make_runner(args)
    results = sweep(runner, args.pool_sizes, args.topks, kept,
                    variants(args.experts_per_query, args.ablations))
    results.update(config=args.config, checkpoint=args.checkpoint,
                   trained=trained, **kept)
    print(format_grid(results, args.pool_sizes, args.topks, trained))
    print('* = the setting the config trains with')
    png = osp.join(runner.work_dir, 'sweep_mk.png')
    plot_heatmap(results, args.pool_sizes, args.topks, trained, png)
    write_json(results, osp.join(runner.work_dir, 'sweep_mk.json'))
    print(f'wrote {png} and sweep_mk.json')
    return results
