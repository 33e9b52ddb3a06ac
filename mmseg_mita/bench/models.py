"""The plain-PyTorch models of the subcommands ``encoder`` and
``throughput-1d``: a pre-norm Transformer block whose attention is a
function, a ViT encoder and a 1-D Transformer built of such blocks.

:class:`ViTEncoder` with its defaults is ViT-S/16: a 16 x 16 patch
convolution to 384 channels, a cls token, a learned position embedding, 12
pre-norm blocks of 6 heads of 64 channels with an MLP of ratio 4 (GELU), a
final LayerNorm. The position embedding is learned on a ``pos_grid`` patch
grid (32 x 32: 512 x 512 images) and resized bilinearly to other grids, as
mmseg's ViT does. The attention is an argument of ``forward``:
``attend(q, k, v, hw)`` with q, k, v of shape [B, heads, N, head_dim] and
``hw`` the patch grid; :func:`sdpa_attention` and :func:`mita_attend` are
the two measured. :class:`Transformer1d` is a stack of blocks on a
sequence (``attend(q, k, v)``). PyTorch only (no mmcv, mmengine or mmseg).
"""
import functools
from typing import Callable, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmseg_mita.ops import mita_attention


class Block(nn.Module):
    """Pre-norm Transformer block; ``attend(q, k, v)`` is the attention."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x, attend):
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, n, 3, self.heads,
                                           c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = attend(q, k, v).transpose(1, 2).reshape(b, n, c)
        x = x + self.proj(out)
        return x + self.mlp(self.norm2(x))


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, hw) -> Tensor:
    """Full attention (``hw`` unused)."""
    return F.scaled_dot_product_attention(q, k, v)


def mita_attend(backend: str, pool_size: int = 7, topk: int = 49,
                num_extra_tokens: int = 1) -> Callable:
    """``attend(q, k, v, hw)`` computing MiTA with ``backend``."""
    return functools.partial(_mita, backend=backend, pool_size=pool_size,
                             topk=topk, num_extra_tokens=num_extra_tokens)


def _mita(q, k, v, hw, *, backend, pool_size, topk, num_extra_tokens):
    return mita_attention(q, k, v, hw, num_extra_tokens=num_extra_tokens,
                          pool_size=pool_size, topk=topk, backend=backend)


class ViTEncoder(nn.Module):
    """ViT encoder (ViT-S/16 by default); ``forward(images, attend)``
    returns the normalised tokens [B, 1 + H * W, dim], cls first."""

    def __init__(self, dim: int = 384, depth: int = 12, heads: int = 6,
                 mlp_ratio: int = 4, patch: int = 16, in_channels: int = 3,
                 pos_grid: Tuple[int, int] = (32, 32)):
        super().__init__()
        self.patch_embed = nn.Conv2d(in_channels, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_grid = tuple(pos_grid)
        self.pos_embed = nn.Parameter(
            torch.randn(1, 1 + pos_grid[0] * pos_grid[1], dim) * 0.02)
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def position_embedding(self, hw: Tuple[int, int]) -> Tensor:
        cls, grid = self.pos_embed[:, :1], self.pos_embed[:, 1:]
        if tuple(hw) != self.pos_grid:
            grid = grid.reshape(1, *self.pos_grid, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=hw, mode='bilinear',
                                 align_corners=False)
            grid = grid.flatten(2).transpose(1, 2)
        return torch.cat([cls, grid], dim=1)

    def forward(self, images: Tensor, attend: Callable) -> Tensor:
        x = self.patch_embed(images)
        hw = tuple(x.shape[2:])
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.position_embedding(hw)
        attend_hw = functools.partial(attend, hw=hw)
        for block in self.blocks:
            x = block(x, attend_hw)
        return self.norm(x)


class Transformer1d(nn.Module):
    """``depth`` pre-norm blocks and a final LayerNorm on a sequence;
    ``forward(x, attend)`` with x of shape [B, N, dim]."""

    def __init__(self, dim: int, depth: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, attend: Callable) -> Tensor:
        for block in self.blocks:
            x = block(x, attend)
        return self.norm(x)
