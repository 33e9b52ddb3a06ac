"""The FLOP count of MiTAViT's dwc / gate branch, in closed form: per layer
the 3 x 3 depth-wise conv costs H * W * C * 9 multiply-adds, the gate
projection N * C * C; the attention itself counts the same as without the
branch (full attention then runs through SDPA instead of
nn.MultiheadAttention)."""
import pytest
import torch

from mmseg_mita.analysis.complexity import flop_analyzer, mita_as_one_op
from mmseg_mita.models import MiTAViT

SMALL = dict(img_size=(32, 48), patch_size=8, embed_dims=32, num_layers=3,
             num_heads=2, out_indices=(2, ))


def _total(mita_cfg, **flags):
    model = MiTAViT(**SMALL, **flags, mita_cfg=mita_cfg)
    model.eval()
    with mita_as_one_op(), torch.no_grad():
        return flop_analyzer(model, (torch.randn(1, 3, 32, 48), )).total()


@pytest.mark.parametrize('mita_cfg', [None, dict(pool_size=2, topk=4)])
def test_branch_adds_its_closed_form(mita_cfg):
    layers, hw, c = 3, 4 * 6, 32
    n = 1 + hw
    plain = _total(mita_cfg)
    assert _total(mita_cfg, dwc=True) - plain == layers * hw * c * 9
    assert _total(mita_cfg, dwc=True, gate=True) - plain == \
        layers * (hw * c * 9 + n * c * c)
