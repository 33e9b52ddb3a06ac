"""Attention FLOPs (one multiply-add = 1 FLOP).

Full attention is counted by mmengine's own handles on the matmuls of
``nn.MultiheadAttention`` and checked against ``2 N^2 C``. MiTA is counted
from its shapes by :func:`mmseg_mita.analysis.flop_handles.mita_op_flops`;
the tests check that count against an independent one: mmengine's own
matmul handle on :class:`MatmulMiTA`, MiTA written out with one matmul per
product of its definition (its output is checked against the operator).
"""
import json
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from flops_testing import layer_counts
from mmengine.analysis import FlopAnalyzer
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.models.backbones import VisionTransformer
from mmseg.registry import MODELS

from mmseg_mita.analysis import (attention_flops, flop_analyzer,
                                 mita_as_one_op, segmentor_complexity)
from mmseg_mita.models import MiTAViT
from mmseg_mita.models.backbones import mita_vit
from mmseg_mita.ops import mita_attention

DEMO = 'configs/mita_vit/mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py'


def full_attention_closed_form(b, n, c):
    return b * (n * n * c + n * n * c)  # Q K^T, then A V


class MatmulMiTA(nn.Module):
    """MiTA on q, k, v [G, N, d] with one ``torch.matmul`` per product:
    ``R K^T``, ``softmax(s R K^T) V``, ``Q R^T`` (routing and compressed
    logits), each query's routed logits and its weighted sum of the
    ``m + k`` values."""

    def __init__(self, hw, num_extra_tokens, pool_size, topk):
        super().__init__()
        self.hw, self.extra = hw, num_extra_tokens
        self.pool_size, self.topk = pool_size, topk

    def forward(self, q, k, v):
        g, n, d = q.shape
        s = d**-0.5
        grid = q[:, self.extra:].transpose(1, 2).reshape(g, d, *self.hw)
        landmarks = F.adaptive_avg_pool2d(grid, self.pool_size).flatten(2)
        landmarks = landmarks.transpose(1, 2)  # [G, m, d]
        m = landmarks.shape[1]
        key_scores = torch.matmul(landmarks, k.transpose(1, 2))
        shared_values = torch.matmul(torch.softmax(s * key_scores, -1), v)
        route = torch.matmul(q, landmarks.transpose(1, 2))  # [G, N, m]
        chosen = key_scores.topk(min(self.topk, n), dim=-1).indices
        keys_of = chosen.gather(  # each query's routed keys [G, N, k]
            1, route.argmax(-1, keepdim=True).expand(-1, -1,
                                                     chosen.shape[-1]))
        rows = torch.arange(g)[:, None, None]
        k_routed, v_routed = k[rows, keys_of], v[rows, keys_of]
        routed = torch.matmul(k_routed, q.unsqueeze(-1)).squeeze(-1)
        probs = torch.softmax(torch.cat([s * s * route, s * routed], -1), -1)
        return torch.matmul(probs[..., :m], shared_values) + torch.matmul(
            probs[..., None, m:], v_routed).squeeze(-2)


def matmul_mita_counts(b, heads, hw, extra, pool, topk, head_dim=16):
    """mmengine's FLOP counts (by operator) of :class:`MatmulMiTA` on
    ``b x heads`` groups, after checking that it computes MiTA."""
    n = extra + hw[0] * hw[1]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b * heads, n, head_dim, generator=gen,
                           dtype=torch.float64) for _ in range(3))
    model = MatmulMiTA(hw, extra, pool, topk)
    op = mita_attention(*(t.view(b, heads, n, head_dim) for t in (q, k, v)),
                        hw, num_extra_tokens=extra, pool_size=pool,
                        topk=topk, backend='torch')
    torch.testing.assert_close(model(q, k, v).view(op.shape), op)
    analyzer = FlopAnalyzer(model, (q, k, v)).unsupported_ops_warnings(
        False).uncalled_modules_warnings(False)
    return analyzer.by_operator()


SMALL = dict(img_size=(64, 64), patch_size=8, embed_dims=48, num_layers=1,
             num_heads=3)


@pytest.mark.parametrize('b,hw', [(1, (8, 8)), (2, (5, 7))])
def test_full_attention_layer(b, hw):
    n = 1 + hw[0] * hw[1]
    for vit in (VisionTransformer(**SMALL), MiTAViT(**SMALL, mita_cfg=None)):
        count, analyzer, calls = layer_counts(vit, b, hw, 48)
        assert count == full_attention_closed_form(b, n, 48)
        assert count == 2 * b * n**2 * 48
        assert calls == 0
        # the projections are linear, outside the attention part
        assert analyzer.by_operator()['linear'] > 0


@pytest.mark.parametrize('b,hw,pool,topk', [(1, (8, 8), 4, 16),
                                            (2, (5, 7), (2, 3), 9),
                                            (1, (4, 4), 2, 100)])
def test_mita_layer(b, hw, pool, topk):
    vit = MiTAViT(**SMALL, mita_cfg=dict(pool_size=pool, topk=topk))
    count, analyzer, calls = layer_counts(vit, b, hw, 48)
    assert calls == 1
    independent = matmul_mita_counts(b, 3, hw, 1, pool, topk)
    assert count == independent['matmul']
    # the landmark pooling is counted, outside the attention part
    assert analyzer.by_operator()['mita_landmark_pool'] == \
        independent['adaptive_avg_pool2d'] == b * 48 * hw[0] * hw[1]


def test_mita_paper_setting_cost_ratio():
    # ViT-S at 512 x 512: N = 1025, C = 384 (6 heads of 64), m = k = 49:
    # MiTA costs 6 m N C (k = m) against 2 N^2 C.
    n, c = 1025, 384
    mita = matmul_mita_counts(1, 6, (32, 32), 1, 7, 49, head_dim=64)
    ratio = mita['matmul'] / full_attention_closed_form(1, n, c)
    assert ratio == pytest.approx(6 * 49 / (2 * n))


def test_counted_op_gives_the_same_output():
    torch.manual_seed(0)
    vit = MiTAViT(**SMALL, mita_cfg=dict(pool_size=3, topk=5))
    vit.eval()  # mmseg's ViT.train() returns None
    x = torch.randn(2, 3, 64, 40)
    expected = vit(x)[-1]
    with mita_as_one_op() as calls:
        got = vit(x)[-1]
    assert calls['calls'] == 1
    torch.testing.assert_close(got, expected)
    assert mita_vit.mita_attention.__module__ == \
        'mmseg_mita.ops.mita_attention'  # restored


class SDPA(nn.Module):

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def test_sdpa_handle():
    q = torch.randn(2, 3, 10, 8)
    k, v = torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 5)
    analyzer = flop_analyzer(SDPA(), (q, k, v))
    assert analyzer.total() == 2 * 3 * 10 * 7 * (8 + 5)


def test_masked_torch_attention_counts_baddbmm():
    mha = nn.MultiheadAttention(24, 2).eval()
    n, b = 9, 2
    x = torch.randn(n, b, 24)
    mask = torch.zeros(n, n)

    class Masked(nn.Module):

        def __init__(self):
            super().__init__()
            self.attn = mha

        def forward(self, x):
            return self.attn(x, x, x, attn_mask=mask)[0]

    model = Masked()
    with mita_as_one_op(), torch.no_grad():
        analyzer = flop_analyzer(model, (x, ))
        assert attention_flops(analyzer, model) == \
            full_attention_closed_form(b, n, 24)


@pytest.fixture(scope='module')
def demo_pair(repo_root):
    init_default_scope('mmseg')
    models = []
    for path in (DEMO, DEMO.replace('mita-vit', 'vit')):
        cfg = Config.fromfile(f'{repo_root}/{path}')
        torch.manual_seed(0)
        models.append(MODELS.build(cfg.model).eval())
    return models


def test_segmentor_parts(demo_pair):
    mita, full = (segmentor_complexity(m, (96, 96)) for m in demo_pair)
    n, c, layers = 1 + 12 * 12, 96, 4  # patch 8, 96 dims
    assert full['attention_flops'] == layers * 2 * n * n * c
    assert mita['attention_flops'] == layers * matmul_mita_counts(
        1, 3, (12, 12), 1, 4, 16, head_dim=32)['matmul']
    for r in (mita, full):
        assert r['flops'] == (r['backbone_flops'] + r['neck_flops'] +
                              r['decode_head_flops'])
    # the two differ by their attention (and MiTA's landmark pooling) only
    pooling = layers * c * 12 * 12
    assert full['flops'] - full['attention_flops'] == \
        mita['flops'] - mita['attention_flops'] - pooling
    assert mita['params'] == full['params']
    assert mita['auxiliary_head_params'] > 0


def test_segmentor_must_be_in_eval_mode(demo_pair):
    model = demo_pair[0]
    model.train()
    try:
        with pytest.raises(ValueError, match=r'segmentor.eval\(\)'):
            segmentor_complexity(model, (96, 96))
    finally:
        model.eval()


def test_get_flops_json(repo_root, tmp_path):
    out = tmp_path / 'flops.json'
    proc = subprocess.run(
        [sys.executable, 'tools/get_flops.py', DEMO, '--shape', '96', '80',
         '--json', str(out), '--markdown'], cwd=repo_root,
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    row = proc.stdout.splitlines()[-1].split(' | ')
    assert row[1:3] == ['96x80', f'{result["flops"] / 1e9:.2f}']
    assert result['shape'] == [96, 80]
    for key in ('flops', 'backbone_flops', 'attention_flops',
                'decode_head_flops', 'params'):
        assert isinstance(result[key], int) and result[key] > 0, key
    assert result['attention_flops'] == 4 * matmul_mita_counts(
        1, 3, (12, 10), 1, 4, 16, head_dim=32)['matmul']
