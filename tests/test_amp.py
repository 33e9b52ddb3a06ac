"""Mixed precision on CPU: bfloat16 autocast through the MiTA op, the
backbone, mmengine's AmpOptimWrapper and `tools/train.py --amp`."""
import glob
import json
import math
import os.path as osp

import pytest
import torch
from mmengine.optim import AmpOptimWrapper

from helpers import DEMO_CONFIG, data_opts, run_python
from mmseg_mita.models import MiTAViT
from mmseg_mita.ops import mita_attention

HW = (12, 12)
N = 1 + HW[0] * HW[1]
HEADS, DIM = 3, 32


def _qkv(scale=1.0):
    """q, k, v [2, HEADS, N, DIM] as the backbone makes them: a linear
    projection, in bfloat16 under autocast; and the same in float32."""
    torch.manual_seed(0)
    x = (torch.randn(2, N, HEADS * DIM) * scale).requires_grad_()
    proj = torch.nn.Linear(HEADS * DIM, 3 * HEADS * DIM)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        qkv16 = proj(x)
    qkv32 = proj(x)

    def split(qkv):
        return qkv.view(2, N, 3, HEADS, DIM).permute(2, 0, 3, 1, 4)

    return x, split(qkv16), split(qkv32)


def test_bf16_matches_fp32_when_routing_cannot_flip():
    # topk = N: every expert sees every key, so the output is a continuous
    # function of the inputs and only rounding separates the two dtypes.
    _, (q, k, v), (q32, k32, v32) = _qkv()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = mita_attention(q, k, v, HW, pool_size=4, topk=N)
    ref = mita_attention(q32, k32, v32, HW, pool_size=4, topk=N)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_bf16_matches_fp32_for_most_queries_with_routing():
    # With topk < N, bfloat16 rounding may flip a near-tie in the expert
    # argmax or the top-k of a few queries; all others agree to rounding.
    _, (q, k, v), (q32, k32, v32) = _qkv()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = mita_attention(q, k, v, HW, pool_size=4, topk=16)
    ref = mita_attention(q32, k32, v32, HW, pool_size=4, topk=16)
    row_err = (out.float() - ref).abs().amax(-1)
    # measured: 91.6% of the rows (torch 2.13, CPU)
    assert (row_err < 2e-2).float().mean() > 0.8


def test_no_nan_with_large_logits():
    # logits far beyond float16's range (65504): the softmax and the
    # shared expert's normalisation must not overflow
    x, (q, k, v), _ = _qkv(scale=300.0)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = mita_attention(q, k, v, HW, pool_size=4, topk=16)
    out.float().sum().backward()
    logits = (q.float() @ k.float().transpose(-1, -2)).abs().max()
    assert logits > 1e5
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def test_float32_inputs_under_autocast():
    # q, k, v made outside the autocast region stay float32 while the op's
    # own matmuls run in bfloat16: the op must compute in one dtype.
    _, _, (q, k, v) = _qkv()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = mita_attention(q, k, v, HW, pool_size=4, topk=N)
    ref = mita_attention(q, k, v, HW, pool_size=4, topk=N)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all()
               for g in grads)


def test_backbone_under_autocast():
    torch.manual_seed(0)
    model = MiTAViT(img_size=(96, 96), patch_size=8, embed_dims=96,
                    num_layers=2, num_heads=3, out_indices=(1, ),
                    mita_cfg=dict(pool_size=4, topk=N))
    x = torch.randn(2, 3, 96, 96)
    ref = model(x)[0]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model(x)[0]
    out.float().square().mean().backward()
    # routing cannot flip (topk = N); measured 0.4% of the output's range
    assert (out.float() - ref).abs().max() < 0.02 * ref.abs().max()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters()
               if p.grad is not None)


def test_amp_optim_wrapper_on_cpu():
    model = torch.nn.Linear(4, 4)
    wrapper = AmpOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with wrapper.optim_context(model):
        out = model(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    before = model.weight.detach().clone()
    wrapper.update_params(out.float().sum())
    assert not torch.equal(before, model.weight)
    state = wrapper.state_dict()
    wrapper.load_state_dict(state)  # what --resume does
    with pytest.raises(ValueError, match="dtype='bfloat16'"):
        AmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=1),
                        dtype='float16')


def test_train_tool_amp(repo_root, demo_data, tmp_path):
    work_dir = str(tmp_path)
    run_python(repo_root, ['tools/train.py', DEMO_CONFIG, '--amp',
                           '--work-dir', work_dir, '--cfg-options'] +
               data_opts(demo_data))
    dumped = open(osp.join(work_dir, osp.basename(DEMO_CONFIG))).read()
    assert "type='AmpOptimWrapper'" in dumped
    scalars = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    losses = [json.loads(line).get('loss') for line in open(scalars[0])]
    losses = [x for x in losses if x is not None]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    ckpt = torch.load(osp.join(work_dir, 'iter_4.pth'), weights_only=False)
    assert 'loss_scaler' in ckpt['optimizer']
