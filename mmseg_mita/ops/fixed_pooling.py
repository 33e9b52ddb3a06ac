"""Adaptive average pooling as a fixed computation (matrix products).

ONNX has no adaptive pooling: exporters turn ``F.adaptive_avg_pool2d`` into
``AveragePool`` only when the output size divides the input size, and bake
that input size into the file. Here output bin ``i`` of an axis of length
``L`` pooled to ``p`` bins averages the positions
``[floor(i L / p), ceil((i + 1) L / p))``, exactly PyTorch's bins, written
as a ``[p, L]`` averaging matrix built with tensor arithmetic: it follows a
dynamic ``L`` (a traced size) and any ``p``, dividing ``L`` or not, larger
than ``L`` or not. Values equal ``F.adaptive_avg_pool2d`` up to float
rounding (a sum of ``x / count`` instead of ``sum(x) / count``).
"""
from typing import Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor

Size = Union[int, Tensor]  # a Python int, or a traced size under export


def adaptive_pool_matrix(length: Size, bins: int, dtype: torch.dtype,
                         device: torch.device) -> Tensor:
    """The ``[bins, length]`` matrix of adaptive average pooling of one
    axis: row ``i`` is ``1 / count`` on bin ``i``'s positions, 0 elsewhere."""
    index = torch.arange(bins, device=device)
    start = torch.div(index * length, bins, rounding_mode='floor')
    end = torch.div((index + 1) * length + bins - 1, bins,
                    rounding_mode='floor')
    position = torch.arange(length, device=device)
    inside = (position >= start[:, None]) & (position < end[:, None])
    return inside.to(dtype) / (end - start)[:, None].to(dtype)


def grid_pool_matrix(hw: Sequence[Size], pool_size: Tuple[int, int],
                     dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[ph * pw, H * W]`` matrix pooling a row-major ``H x W`` grid of
    tokens to ``ph x pw`` (row-major): the Kronecker product of the two
    axes' matrices."""
    rows = adaptive_pool_matrix(hw[0], pool_size[0], dtype, device)
    cols = adaptive_pool_matrix(hw[1], pool_size[1], dtype, device)
    return (rows[:, None, :, None] * cols[None, :, None, :]).reshape(
        pool_size[0] * pool_size[1], -1)


def adaptive_avg_pool2d_fixed(x: Tensor, output_size: Tuple[int,
                                                            int]) -> Tensor:
    """``F.adaptive_avg_pool2d(x, output_size)`` for ``x`` [..., H, W] as
    two matrix products (``rows @ x @ cols^T``)."""
    rows = adaptive_pool_matrix(x.shape[-2], output_size[0], x.dtype,
                                x.device)
    cols = adaptive_pool_matrix(x.shape[-1], output_size[1], x.dtype,
                                x.device)
    return rows @ x @ cols.transpose(0, 1)


class FixedAdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` computed by :func:`adaptive_avg_pool2d_fixed`
    (exportable to ONNX for any input size). ``output_size`` must be ints:
    ``None`` (keep that input size) is not supported."""

    def __init__(self, output_size):
        size = (output_size, output_size) if isinstance(
            output_size, int) else tuple(output_size)
        if len(size) != 2 or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 1
                for s in size):
            raise ValueError('output_size must be an int >= 1 or a pair of '
                             f'them, got {output_size!r}')
        super().__init__(size)

    def forward(self, x: Tensor) -> Tensor:
        return adaptive_avg_pool2d_fixed(x, self.output_size)
