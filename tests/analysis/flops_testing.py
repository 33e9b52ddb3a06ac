"""A ViT layer counted the way the FLOPs tool counts it."""
import torch
import torch.nn as nn

from mmseg_mita.analysis import attention_flops, flop_analyzer, mita_as_one_op
from mmseg_mita.models.backbones import MiTAEncoderLayer


class OneLayer(nn.Module):
    """Layer 0 of a ViT on ``[B, N, C]`` tokens of an ``hw`` grid."""

    def __init__(self, vit, hw):
        super().__init__()
        self.layer = vit.layers[0]
        self.hw = hw

    def forward(self, x):
        if isinstance(self.layer, MiTAEncoderLayer):
            return self.layer(x, self.hw)
        return self.layer(x)  # mmseg's own layer


def layer_counts(vit, b, hw, c):
    """The attention FLOPs of ``vit``'s layer 0 on ``b`` images of an ``hw``
    grid (+ cls) and ``c`` channels, its analyzer, and how many times the
    MiTA op was called."""
    model = OneLayer(vit, hw).eval()
    x = torch.randn(b, 1 + hw[0] * hw[1], c)
    with mita_as_one_op() as calls, torch.no_grad():
        analyzer = flop_analyzer(model, (x, ))
        analyzer.total()
    return attention_flops(analyzer, model), analyzer, calls['calls']
