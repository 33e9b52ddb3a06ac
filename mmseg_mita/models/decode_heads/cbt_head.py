"""CBT: the Contract-and-Broadcast Transformer decode head (arXiv 2509.16875).

The head refines the last backbone stage's patch tokens together with one
learnable token per class, through ``num_layers`` pre-norm residual layers of
contract-and-broadcast self-attention (no FFN). Per head ``h``, with the
normalised tokens ``x`` (patches then classes, ``T`` of them):

* ``Z = x W_h^T``, one shared projection to ``head_dims`` (``[T, d]``);
* representatives ``P`` = adaptive average pooling of the patch rows of
  ``Z`` to a ``p x p`` grid (``[p^2, d]``);
* contract: ``A = softmax(P Z^T / sqrt(d))`` (``[p^2, T]``) and
  ``P1 = P + alpha_h * A Z``;
* the representatives self-attend: ``P2 = softmax(P1 P1^T / sqrt(d)) P1``;
* broadcast: every token receives ``beta_h * A^T P2`` (``[T, d]``).

The heads are concatenated and projected back to the token width ``C``.
After a final LayerNorm, patches and class tokens are L2-normalised, the
masks are their cosine similarities, and a LayerNorm over the classes gives
the logits ``[B, num_classes, h, w]``. Attention between the ``T`` tokens
thus goes through ``p^2`` representatives: cost ``O(T p^2)``, not ``O(T^2)``.
"""
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.registry import MODELS
from torch import Tensor

from mmseg_mita.utils import IntPair, check_int, check_int_pair

class ContractBroadcastAttention(nn.Module):
    """Contract-and-broadcast self-attention of ``num_patches`` patch tokens
    (laid out as an ``hw`` grid) followed by other tokens (the classes)."""

    def __init__(self, embed_dims: int, num_heads: int, head_dims: int,
                 pool_size: Tuple[int, int], step_init: float):
        super().__init__()
        self.num_heads = num_heads
        self.head_dims = head_dims
        self.pool_size = pool_size
        # A module (no parameters), so that export can swap in a pooling
        # with an ONNX form for any grid (mmseg_mita.deploy).
        self.pool = nn.AdaptiveAvgPool2d(pool_size)
        self.proj = nn.Linear(embed_dims, num_heads * head_dims, bias=False)
        self.contract_step = nn.Parameter(torch.full((num_heads, ), step_init))
        self.broadcast_step = nn.Parameter(
            torch.full((num_heads, ), step_init))
        self.out_proj = nn.Linear(num_heads * head_dims, embed_dims)

    def forward(self, x: Tensor, hw: Tuple[int, int]) -> Tensor:
        b, t, _ = x.shape
        heads, d = self.num_heads, self.head_dims
        z = self.proj(x).view(b, t, heads, d).transpose(1, 2)  # [B, h, T, d]
        patches = z[:, :, :hw[0] * hw[1]].transpose(2, 3)
        reps = self.pool(patches.reshape(b * heads, d, *hw))
        reps = reps.view(b, heads, d, -1).transpose(2, 3)  # [B, h, P, d]
        scale = d**-0.5
        contract = torch.softmax(reps @ z.transpose(2, 3) * scale, dim=-1)
        alpha = self.contract_step.view(1, heads, 1, 1)
        reps = reps + alpha * (contract @ z)
        mixing = torch.softmax(reps @ reps.transpose(2, 3) * scale, dim=-1)
        reps = mixing @ reps
        beta = self.broadcast_step.view(1, heads, 1, 1)
        out = beta * (contract.transpose(2, 3) @ reps)  # [B, h, T, d]
        return self.out_proj(out.transpose(1, 2).reshape(b, t, heads * d))


class CBTLayer(nn.Module):
    """Pre-norm residual contract-and-broadcast attention, no FFN."""

    def __init__(self, embed_dims: int, **attn_kwargs):
        super().__init__()
        self.norm = nn.LayerNorm(embed_dims)
        self.attn = ContractBroadcastAttention(embed_dims, **attn_kwargs)

    def forward(self, x: Tensor, hw: Tuple[int, int]) -> Tensor:
        return x + self.attn(self.norm(x), hw)


@MODELS.register_module()
class CBTHead(BaseDecodeHead):
    """Contract-and-Broadcast Transformer decode head (arXiv 2509.16875).

    Takes the tokens of one backbone stage (``in_index``, default the last)
    as ``[B, in_channels, h, w]`` and returns ``[B, num_classes, h, w]``
    logits; loss and resizing are :class:`BaseDecodeHead`'s. The tokens keep
    the width ``in_channels`` throughout.

    Args:
        in_channels (int): token width ``C`` of the backbone stage.
        num_layers (int): contract-and-broadcast layers. Default: 3.
        num_heads (int): attention heads per layer. Default: 3.
        head_dims (int): width of each head's projection. Default: 100.
        pool_size (int | (int, int)): representatives grid ``p x p``
            (any grid works: smaller token grids are pooled up). Default: 10.
        step_init (float): initial value of the learnable per-head contract
            and broadcast steps. Default: 1.0.
        init_std (float): std of the truncated-normal init of the class
            tokens and linear layers. Default: 0.02.
        **kwargs: :class:`BaseDecodeHead` arguments (``num_classes``,
            ``in_index``, ``loss_decode``, ``align_corners``, ...).
    """

    def __init__(self,
                 in_channels: int,
                 num_layers: int = 3,
                 num_heads: int = 3,
                 head_dims: int = 100,
                 pool_size: IntPair = 10,
                 step_init: float = 1.0,
                 init_std: float = 0.02,
                 **kwargs):
        if isinstance(in_channels, bool) or not isinstance(in_channels, int):
            raise ValueError('CBTHead takes the tokens of one backbone '
                             'stage: in_channels must be an int, got '
                             f'{in_channels!r}')
        for name, value in (('num_layers', num_layers),
                            ('num_heads', num_heads),
                            ('head_dims', head_dims)):
            check_int(value, name)
        pool_size = check_int_pair(pool_size, 'pool_size')
        if kwargs.setdefault('dropout_ratio', 0.0):
            raise ValueError('CBTHead applies no dropout: leave dropout_ratio '
                             f'out or 0, got {kwargs["dropout_ratio"]!r}')
        kwargs.setdefault('init_cfg', [
            dict(type='TruncNormal', std=init_std, layer='Linear'),
            dict(type='Constant', val=1.0, bias=0.0, layer='LayerNorm')
        ])
        super().__init__(in_channels=in_channels, channels=in_channels,
                         **kwargs)
        if self.out_channels != self.num_classes:
            raise ValueError(
                'CBTHead predicts one mask per class: out_channels must '
                f'equal num_classes, got out_channels={self.out_channels}, '
                f'num_classes={self.num_classes}')
        del self.conv_seg  # the masks come from the class tokens
        self.class_tokens = nn.Parameter(
            nn.init.trunc_normal_(
                torch.empty(1, self.num_classes, in_channels), std=init_std))
        self.layers = nn.ModuleList(
            CBTLayer(in_channels, num_heads=num_heads, head_dims=head_dims,
                     pool_size=pool_size, step_init=step_init)
            for _ in range(num_layers))
        self.norm = nn.LayerNorm(in_channels)
        self.mask_norm = nn.LayerNorm(self.num_classes)

    def forward(self, inputs) -> Tensor:
        x = self._transform_inputs(inputs)
        b, _, h, w = x.shape
        tokens = torch.cat(
            [x.flatten(2).transpose(1, 2),
             self.class_tokens.expand(b, -1, -1)], dim=1)
        for layer in self.layers:
            tokens = layer(tokens, (h, w))
        tokens = self.norm(tokens)
        patches = F.normalize(tokens[:, :h * w], dim=-1)
        classes = F.normalize(tokens[:, h * w:], dim=-1)
        masks = self.mask_norm(patches @ classes.transpose(1, 2))
        return masks.transpose(1, 2).reshape(b, self.num_classes, h, w)
