"""The workloads the subcommands measure, and the sweep axes' value types.

One place for the shapes: the op at the configs' token counts, the ViT-S
encoder settings, the 1-D sequence lengths, the segmentor configs and
inputs. :mod:`.targets` states its targets on these workloads.

Tokens and grids: a sequence of N tokens is ``extra_tokens`` (cls) tokens
then an H x W patch grid; :func:`patch_grid` takes the most square grid
(32 x 32 at N = 1025 with one extra token, 64 x 128 at 8193), and
:func:`image_tokens` counts the tokens of an image under a ViT patch
embedding (patches rounded up, as mmseg's ``AdaptivePadding`` pads).
"""
import argparse
import math
from typing import NamedTuple, Optional, Tuple

from .cli import UsageError

# ``op``: tokens of ViT-S at 512 x 512, 640 x 640, 1024 x 1024, 2048 x 2048
# and 4096 x 4096 (16 x 16 patches, one cls token).
OP_TOKENS = (1025, 1601, 4097, 16385, 65537)
# ``op-shapes``: N:BH = tokens : batch x heads of ViT-S (6 heads) at the
# configs' inputs: 512 x 512 with 2 and 16 images, 1024 x 1024 with 2,
# 1024 x 2048 with 1; one head at 4096 x 4096.
OP_SHAPES = ('1025:12', '1025:96', '4097:12', '8193:6', '65537:1')
# ``encoder``: KIND:HxW:BATCH of the ViT-S/16 encoder.
ENCODER_SETTINGS = ('train:512x512:8', 'train:1024x1024:2',
                    'infer:1024x2048:1')
# ``throughput-1d``: sequence lengths (64K, 256K, 1M tokens).
THROUGHPUT_TOKENS = (65536, 262144, 1048576)
# ``scaling``: input sizes of the whole segmentors.
SCALING_SIZES = ('512x512', '1024x1024', '1024x2048', '2048x2048')

# The ViT-S segmentors: (decode head, dataset) -> MiTA config (a packaged
# config's name, :func:`mmseg_mita.config_path`). Each is compared with its
# SDPA twin (the same config with full attention).
SEGMENTOR_CONFIGS = {
    ('upernet', 'ade20k'): 'mita-vit-s16_upernet_8xb2-160k_ade20k-512x512',
    ('cbt', 'ade20k'): 'mita-vit-s16_cbt_8xb1-160k_ade20k-512x512',
    ('upernet', 'cityscapes'):
    'mita-vit-s16_upernet_8xb1-80k_cityscapes-1024x1024',
    ('cbt', 'cityscapes'): 'mita-vit-s16_cbt_8xb1-80k_cityscapes-1024x1024',
}
# Decode head -> (method, backbone) as the model card names them.
HEADS = dict(upernet=('UPerNet', 'ViT-S/16 + MLN'), cbt=('CBT', 'ViT-S/16'))


class SegmentorWorkload(NamedTuple):
    """What a segmentor step computes: ``kind`` is ``whole`` or ``slide``
    inference (mmseg's ``predict``, batch 1) or ``train`` (one iteration
    of the config's optimizer on a batch of the config's size), on images
    of ``size``; ``crop`` and ``stride``: the sliding window."""
    dataset: str
    kind: str
    size: Tuple[int, int]
    crop: Optional[Tuple[int, int]] = None
    stride: Optional[Tuple[int, int]] = None

    def scaled_down(self, factor: int) -> 'SegmentorWorkload':
        """Every size divided by ``factor`` (quick checks)."""
        def down(hw):
            return None if hw is None else tuple(
                max(1, v // factor) for v in hw)

        return self._replace(size=down(self.size), crop=down(self.crop),
                             stride=down(self.stride))


SEGMENTOR_WORKLOADS = {
    'ade20k-512': SegmentorWorkload('ade20k', 'whole', (512, 512)),
    'ade20k-640': SegmentorWorkload('ade20k', 'whole', (640, 640)),
    'cityscapes-whole': SegmentorWorkload('cityscapes', 'whole',
                                          (1024, 2048)),
    'cityscapes-slide': SegmentorWorkload('cityscapes', 'slide',
                                          (1024, 2048), crop=(1024, 1024),
                                          stride=(768, 768)),
    'ade20k-512-train': SegmentorWorkload('ade20k', 'train', (512, 512)),
}


def patch_grid(tokens: int, extra_tokens: int = 1) -> Tuple[int, int]:
    """The most square (H, W), H <= W, with H * W = tokens - extra."""
    patches = tokens - extra_tokens
    if patches < 1:
        raise UsageError(f'{tokens} tokens: fewer than the {extra_tokens} '
                         'extra tokens plus one patch; give more tokens')
    h = max(d for d in range(1, math.isqrt(patches) + 1) if patches % d == 0)
    return h, patches // h


def image_tokens(size: Tuple[int, int], patch: int = 16,
                 extra_tokens: int = 1) -> int:
    """Tokens of an image of ``size`` (H, W) cut into ``patch`` squares."""
    return -(-size[0] // patch) * -(-size[1] // patch) + extra_tokens


def check_grid(hw: Tuple[int, int], pool_size: int, what: str) -> None:
    """A grid must hold the ``pool_size`` x ``pool_size`` landmark grid."""
    if min(hw) < pool_size:
        raise UsageError(f'{what}: patch grid {hw[0]} x {hw[1]} is smaller '
                         f'than --pool-size {pool_size}; give more tokens '
                         'or a smaller --pool-size')


def batch_heads(bh: int, heads: int) -> Tuple[int, int]:
    """(batch, heads) of BH = batch x heads: ``heads`` per image when it
    divides BH, else BH heads of one image."""
    heads = heads if bh % heads == 0 else bh
    return bh // heads, heads


# --- argparse types ---------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f'expected an integer >= 1, got '
                                         f'{text!r}')
    return value


def image_size(text: str) -> Tuple[int, int]:
    """``HxW`` (e.g. ``1024x2048``)."""
    try:
        h, w = (int(v) for v in text.lower().split('x'))
    except ValueError:
        h = w = 0
    if min(h, w) < 1:
        raise argparse.ArgumentTypeError(
            f'expected an image size HxW, e.g. 1024x2048, got {text!r}')
    return h, w


def op_shape(text: str) -> Tuple[int, int]:
    """``N:BH`` (tokens : batch x heads, e.g. ``1025:12``)."""
    try:
        n, bh = (int(x) for x in text.split(':'))
    except ValueError:
        n = bh = 0
    if n < 2 or bh < 1:
        raise argparse.ArgumentTypeError(
            f'expected N:BH (tokens : batch x heads), e.g. 1025:12, got '
            f'{text!r}')
    return n, bh


def encoder_setting(text: str) -> dict:
    """``KIND:HxW:BATCH``, KIND ``train`` or ``infer``."""
    try:
        kind, size, batch = text.split(':')
        size, batch = image_size(size), int(batch)
    except (ValueError, argparse.ArgumentTypeError):
        kind, size, batch = '', (0, 0), 0
    if kind not in ('train', 'infer') or batch < 1:
        raise argparse.ArgumentTypeError(
            'expected train|infer:HxW:BATCH, e.g. train:512x512:8, got '
            f'{text!r}')
    return dict(kind=kind, size=list(size), batch=batch, name=text)
