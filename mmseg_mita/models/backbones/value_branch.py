"""The two additions of the authors' MiTA-DeiT attention, in every layer,
both applied to the merged heads' attention output ``o`` [B, N, C] before
the output projection:

* ``dwc``: ``o[patches] += DWConv3x3(V)``, the value tokens of the patches
  (all heads, channel ``head * d + j``, as [B, C, H, W]) through a 3 x 3
  depth-wise convolution; the extra (cls) tokens get nothing;
* ``gate``: ``o *= SiLU(g)`` for every token, ``g = W_g x + b_g`` from the
  layer's (normed) input ``x``: the 4th chunk of the authors' fused ``qkvg``
  projection, kept here as its own Linear so that ``attn.in_proj_*`` keeps
  the shape and keys of a plain ViT.

Constructed (``reset_parameters``) so that they change nothing: the conv is
zero and ``SiLU(g) = 1`` (weight 0, bias ``SILU_INVERSE_OF_ONE``). A
full-attention checkpoint loaded into a model with them therefore starts as
the checkpoint's own model. Training from scratch (``init_weights``
without a checkpoint) replaces this with mmseg's ViT initialisation of every
Conv2d and Linear.
"""
import re

import torch
from torch import Tensor, nn

# x with x * sigmoid(x) = 1 (Newton's method in float64)
SILU_INVERSE_OF_ONE = 1.278464542761074
# state-dict keys of these parameters, relative to the backbone
VALUE_BRANCH_KEY = re.compile(
    r'layers\.\d+\.attn\.(dwc|gate_proj)\.(weight|bias)')


class DepthwiseValueConv(nn.Conv2d):
    """3 x 3 depth-wise convolution (zero padding) of the patches' value
    tokens; zero at construction."""

    def __init__(self, channels: int):
        super().__init__(channels, channels, 3, padding=1, groups=channels)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, patch_values: Tensor, hw_shape) -> Tensor:
        """``patch_values`` [B, heads, H * W, d] -> [B, H * W, heads * d]."""
        b, heads, hw, d = patch_values.shape
        if hw_shape is None or hw_shape[0] * hw_shape[1] != hw:
            raise ValueError(
                f'the depth-wise value conv needs the patch grid (hw_shape) '
                f'of the {hw} patch tokens, got {hw_shape}; MiTAViT records '
                "it in each layer's attention from its patch embedding")
        grid = patch_values.transpose(2, 3).reshape(b, heads * d, *hw_shape)
        return super().forward(grid).flatten(2).transpose(1, 2)


class GateProjection(nn.Linear):
    """``g = W_g x + b_g`` of the gate ``SiLU(g)``; ``SiLU(g) = 1`` at
    construction."""

    def __init__(self, channels: int):
        super().__init__(channels, channels)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        nn.init.constant_(self.bias, SILU_INVERSE_OF_ONE)


def add_value_branch(out: Tensor, x: Tensor, v: Tensor, hw_shape,
                     num_extra_tokens: int, dwc, gate_proj) -> Tensor:
    """``(out + DWConv(V)) * SiLU(gate_proj(x))``, each factor only where
    its module is given. ``out``, ``x`` [B, N, C]; ``v`` [B, heads, N, d]."""
    if dwc is not None:
        e = num_extra_tokens
        conv = dwc(v[:, :, e:], hw_shape)
        out = torch.cat([out[:, :e], out[:, e:] + conv], dim=1)
    if gate_proj is not None:
        out = out * nn.functional.silu(gate_proj(x))
    return out
