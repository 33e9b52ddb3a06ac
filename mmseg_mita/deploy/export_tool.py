"""``tools/export_onnx.py``: export a segmentor (MiTA or full attention)
to ONNX and check it in ONNX Runtime.

    python tools/export_onnx.py CONFIG [CHECKPOINT] --shape H W
                                --out FILE.onnx [--dynamic]
                                [--check-shape H W] [--atol A]
                                [--min-agreement F] [--cfg-options ...]

The file maps the normalised image ``inputs`` [1, 3, H, W] (what mmseg's
data preprocessor outputs) to ``logits`` [1, num_classes, H, W] (whole-mode
``encode_decode``, resized to the input, before argmax). Without CHECKPOINT
the initialised model is exported (no pretrained weights are read).

After writing the file, it runs it with ONNX Runtime (CPU) on a random
input of that shape and prints the largest absolute logit difference from
eager PyTorch (the model as built, before any export switch) and the
fraction of pixels whose predicted class agrees; with ``--dynamic`` also at
``--check-shape`` (default H + 32, W + 64). Exit status 1 when a check
misses the tolerance: ``agreement < --min-agreement`` (default 0.98) or
``max_abs_diff > --atol`` (default 0.1). Float32 rounding alone gives
about 1e-6; but MiTA routes each token by an argmax and picks keys by
top-k, and a token whose two best choices tie within rounding may be routed
differently by the two runtimes, which moves logits locally by up to a few
1e-2 (measured); a wrong graph moves them by O(1) on many pixels. See
docs/deploy.md, "Tolerances"; the tests are stricter (1e-4, every pixel).
"""
import argparse
import importlib.util
import sys

import torch
from mmengine.config import DictAction

from .onnx_export import (build_segmentor, compare_logits, export_onnx,
                          prepare_for_export, run_onnxruntime, torch_logits,
                          within_tolerance)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Export a segmentor to ONNX and check it in ONNX '
        'Runtime')
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?',
                        help='weights (default: the initialised model)')
    parser.add_argument('--shape', type=int, nargs=2, required=True,
                        metavar=('H', 'W'), help='input height and width')
    parser.add_argument('--out', required=True, metavar='FILE.onnx')
    parser.add_argument('--dynamic', action='store_true',
                        help='dynamic input height and width')
    parser.add_argument(
        '--check-shape', type=int, nargs=2, metavar=('H', 'W'),
        help='with --dynamic, the second size the file is checked at '
        '(default: H + 32, W + 64)')
    parser.add_argument('--atol', type=float, default=0.1,
                        help='largest accepted absolute logit difference')
    parser.add_argument(
        '--min-agreement', type=float, default=0.98,
        help='smallest accepted fraction of pixels of the same class')
    parser.add_argument('--opset', type=int, default=17)
    parser.add_argument(
        '--seed', type=int, default=0,
        help='seed of the check inputs and of the initialised weights')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override settings in the config, as in mmseg\'s tools')
    args = parser.parse_args(argv)
    if min(args.shape) < 1:
        parser.error('--shape takes positive H W')
    if not 0 <= args.min_agreement <= 1 or args.atol < 0:
        parser.error('--min-agreement must be in [0, 1] and --atol >= 0')
    if args.check_shape and not args.dynamic:
        parser.error('--check-shape checks a --dynamic export')
    if args.dynamic and args.check_shape is None:
        args.check_shape = [args.shape[0] + 32, args.shape[1] + 64]
    if args.opset < 17:
        parser.error('--opset must be >= 17 (LayerNormalization)')
    return args


def require_onnx(tool: str) -> None:
    """Exits with the install command when onnx or onnxruntime is
    missing."""
    missing = [
        name for name in ('onnx', 'onnxruntime')
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        sys.exit(f'{tool}: {" and ".join(missing)} not installed: '
                 'pip install -e .[deploy]')


def main(argv=None) -> int:
    args = parse_args(argv)
    require_onnx('export_onnx')
    torch.manual_seed(args.seed)  # the initialised weights, if no checkpoint
    model = build_segmentor(args.config, args.checkpoint, args.cfg_options)
    shapes = [tuple(args.shape)]
    if args.dynamic:
        shapes.append(tuple(args.check_shape))
    gen = torch.Generator().manual_seed(args.seed)
    inputs = [torch.randn(1, 3, *s, generator=gen) for s in shapes]
    references = torch_logits(model, inputs)

    prepare_for_export(model, dynamic=args.dynamic)
    export_onnx(model, tuple(args.shape), args.out, dynamic=args.dynamic,
                opset=args.opset)
    print(f'wrote {args.out} (opset {args.opset}, input [1, 3, '
          + ('height, width]: dynamic' if args.dynamic else
             f'{args.shape[0]}, {args.shape[1]}]: fixed') + ')')

    ok = True
    for shape, x, ref in zip(shapes, inputs, references):
        result = compare_logits(ref, run_onnxruntime(args.out, x.numpy()))
        passed = within_tolerance(result, args.atol, args.min_agreement)
        ok &= passed
        print(f'{shape[0]} x {shape[1]}: max |logits - PyTorch| = '
              f'{result["max_abs_diff"]:.3g} (tolerance {args.atol:g}), '
              f'same class on {100 * result["agreement"]:.3f}% of pixels '
              f'(at least {100 * args.min_agreement:g}%): '
              f'{"ok" if passed else "FAILED"}')
    return 0 if ok else 1
