"""FLOPs and parameters of segmentors, attention included.

    python tools/get_flops.py CONFIG [CONFIG ...] [--shape H [W]]
                              [--json OUT] [--markdown] [--cfg-options ...]

Built on mmengine's ``FlopAnalyzer`` with the handles of
``mmseg_mita.analysis``: full attention (``QK^T``, ``AV``) and every matmul
of MiTA are counted, which mmseg's own ``get_flops.py`` does not do (and it
crashes with mmengine 0.10.7). One multiply-add is one FLOP (mmseg's
convention). The inference path is counted: backbone, neck, decode head on
one image of ``H x W`` (default: the config's crop size), without the
auxiliary head and the final resize; parameters likewise.

``--json OUT`` (one config) writes the numbers under ``flops``,
``backbone_flops``, ``attention_flops``, ``neck_flops``,
``decode_head_flops``, ``params``, ``auxiliary_head_params``;
``--markdown`` prints one table row per config.
"""
import argparse
import os.path as osp

from mmengine.config import Config, DictAction
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import init_default_scope

from mmseg_mita.utils import write_json


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='FLOPs (attention included) and parameters of '
        'segmentors')
    parser.add_argument('configs', nargs='+', metavar='CONFIG')
    parser.add_argument(
        '--shape', type=int, nargs='+', metavar='H',
        help='input size H [W] (default: the config\'s crop size)')
    parser.add_argument(
        '--json', metavar='OUT', help='write the numbers of one config')
    parser.add_argument(
        '--markdown', action='store_true',
        help='print a markdown table, one row per config')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override settings of every config, as in mmseg\'s tools')
    args = parser.parse_args(argv)
    if args.shape is not None and (len(args.shape) not in (1, 2)
                                   or min(args.shape) < 1):
        parser.error('--shape takes H or H W, positive ints')
    if args.json and len(args.configs) != 1:
        parser.error('--json writes the numbers of exactly one config')
    return args


def input_shape(cfg: Config, shape):
    """(H, W) from ``--shape`` or the config's crop size."""
    if shape:
        return (shape[0], shape[-1])
    size = cfg.get('crop_size') or cfg.model.get(
        'data_preprocessor', {}).get('size')
    if not size:
        raise ValueError(f'{cfg.filename} sets no crop_size: pass --shape')
    return tuple(size)


def build_segmentor(cfg: Config):
    """The config's model on CPU in eval mode, random weights (no
    checkpoint is read), BN instead of SyncBN."""
    from mmseg.registry import MODELS
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    cfg.model.pop('pretrained', None)
    model = MODELS.build(cfg.model)
    return revert_sync_batchnorm(model).eval()


def measure(config: str, shape=None, cfg_options=None) -> dict:
    import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
    from mmseg_mita.analysis import segmentor_complexity
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    hw = input_shape(cfg, shape)
    result = segmentor_complexity(build_segmentor(cfg), hw)
    return dict(config=config, shape=list(hw), **result)


def report(result: dict) -> str:
    g = {k: v / 1e9 for k, v in result.items() if k.endswith('flops')}
    h, w = result['shape']
    return '\n'.join([
        result['config'],
        f'  input shape      3 x {h} x {w}',
        f'  flops            {g["flops"]:.2f} G (one multiply-add = 1 FLOP)',
        f'    backbone       {g["backbone_flops"]:.2f} G',
        f'      attention    {g["attention_flops"]:.2f} G '
        '(token mixing: QK^T and AV, or the MiTA matmuls)',
        f'    neck           {g["neck_flops"]:.2f} G',
        f'    decode head    {g["decode_head_flops"]:.2f} G',
        f'  params           {result["params"] / 1e6:.2f} M (auxiliary '
        f'head, training only: {result["auxiliary_head_params"] / 1e6:.2f} '
        'M more)',
    ])


MARKDOWN_HEADER = (
    '| config | input | GFLOPs | backbone | attention | neck | decode head '
    '| params (M) |\n|---|---|---:|---:|---:|---:|---:|---:|')


def markdown_row(result: dict) -> str:
    g = [
        result[k] / 1e9
        for k in ('flops', 'backbone_flops', 'attention_flops', 'neck_flops',
                  'decode_head_flops')
    ]
    h, w = result['shape']
    return (f'| {osp.basename(result["config"])} | {h}x{w} | ' +
            ' | '.join(f'{v:.2f}' for v in g) +
            f' | {result["params"] / 1e6:.2f} |')


def main(argv=None):
    args = parse_args(argv)
    if args.markdown:
        print(MARKDOWN_HEADER)
    for config in args.configs:
        result = measure(config, args.shape, args.cfg_options)
        print(markdown_row(result) if args.markdown else report(result),
              flush=True)
        if args.json:
            write_json(result, args.json)


if __name__ == '__main__':
    main()
