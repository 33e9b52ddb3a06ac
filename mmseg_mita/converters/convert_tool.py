"""Convert a ViT checkpoint (full attention, or the authors' MiTA-DeiT) for
mmseg's VisionTransformer and MiTAViT.

    python tools/convert_vit.py SRC DST [--format auto] [--num-heads N]
                                [--force]

SRC: a timm state dict (.pth/.bin/.safetensors), a DeiT checkpoint
(``{'model': ...}``; also the authors' MiTA-DeiT, with or without their
depth-wise value conv ``attn.dwc`` and gate ``attn.qkvg``), a Google AugReg
/ big_vision ``.npz``, an mmpretrain/mmcls checkpoint (``backbone.`` keys) or
an mmseg checkpoint (its backbone is extracted). The format is told from
the content, never from the file name. DST gets ``{'state_dict', 'meta'}``
with mmseg's key names, written atomically; an existing DST is kept unless
``--force``.

The backbone settings the weights imply are printed as a config snippet:
use them (``patch_bias``, ``final_norm``, ``with_cls_token``, ``dwc``,
``gate``...) or the weights do not all load. What the weights tell about
the MiTA settings (and what they cannot tell) follows.
"""
import argparse
import sys

from .convert import FORMATS, convert_file, write_checkpoint
from .mita_deit import mita_settings_notes


def _literal(value):
    """``value`` as config source, dicts written as ``dict(...)``."""
    if isinstance(value, dict):
        return 'dict(' + ', '.join(f'{k}={_literal(v)}'
                                   for k, v in value.items()) + ')'
    return repr(value)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0].replace('\n', ' '))
    parser.add_argument('src', help='source checkpoint')
    parser.add_argument('dst', help='converted checkpoint to write')
    parser.add_argument('--format', default='auto',
                        choices=('auto', ) + FORMATS,
                        help='source format (default: told from content)')
    parser.add_argument('--num-heads', type=int, default=None,
                        help='attention heads of the model: torch weights '
                        'do not store it (AugReg .npz files do); default: '
                        'the standard ViT-Ti/S/B/L/H table')
    parser.add_argument('--force', action='store_true',
                        help='overwrite an existing DST')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        conversion = convert_file(args.src, args.format, args.num_heads)
        write_checkpoint(conversion, args.dst, args.src, args.force)
    except (ValueError, FileExistsError, FileNotFoundError) as err:
        sys.exit(f'error: {err}')
    settings = conversion.settings
    print(f'{args.src}: {conversion.format} checkpoint')
    for note in conversion.notes:
        print(f'  - {note}')
    print(f'wrote {len(conversion.state_dict)} tensors to {args.dst}')
    print('backbone settings implied by the weights:')
    for line in settings.describe():
        print(f'  {line}')
    backbone = dict(type='MiTAViT', **settings.backbone_cfg(),
                    init_cfg=dict(type='Pretrained', checkpoint=args.dst))
    print('config (model.backbone; img_size may be your crop size):')
    print('model = dict(\n    backbone=dict(\n' + ''.join(
        f'        {key}={_literal(value)},\n'
        for key, value in backbone.items()) + '    ))')
    if settings.num_heads is None:
        print('num_heads: ' + settings.heads_source)
    print('MiTA settings (model.backbone.mita_cfg):')
    for note in mita_settings_notes(conversion.format, settings.dwc,
                                    settings.gate):
        print(f'  - {note}')
