"""Mixed precision on CPU: bfloat16 autocast through the MiTA op, the
backbone, mmengine's AmpOptimWrapper and `tools/train.py --amp`.

Tolerances are calibrated the way flash-attention's tests calibrate theirs:
the error of MiTA under autocast to MiTA in float64 (on the same input
values) may be at most twice the error that plain full attention
(``F.scaled_dot_product_attention``) makes under the same autocast to its
own float64 result. Full attention put in MiTA's place is ~10x off.
"""
import copy
import glob
import json
import math
import os.path as osp

import pytest
import torch
import torch.nn.functional as F
from mmengine.optim import AmpOptimWrapper

import mmseg_mita.mmseg_plugin  # noqa: F401  (AmpOptimWrapper on CPU)
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


def _mita(topk):
    return lambda q, k, v: mita_attention(q, k, v, HW, pool_size=4,
                                          topk=topk)


def _full_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def _outputs_and_grads(fn, inputs, grad, autocast):
    """``fn``'s output and its gradients w.r.t. ``inputs`` (fresh leaves)
    for the output gradient ``grad``, with or without bfloat16 autocast."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        out = fn(*leaves)
    return [out] + list(torch.autograd.grad(out, leaves, grad.to(out)))


def _autocast_errors(fn, inputs):
    """Largest absolute error of out, dq, dk, dv of ``fn`` under autocast to
    ``fn`` in float64 on the same values."""
    exact = [t.detach().double() for t in inputs]
    grad = torch.randn(exact[0].shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(1))
    want = _outputs_and_grads(fn, exact, grad, autocast=False)
    got = _outputs_and_grads(fn, inputs, grad, autocast=True)
    return [float((g.double() - w).abs().max()) for g, w in zip(got, want)]


def _assert_as_close_as_full_attention(inputs, topk=N):
    errors = _autocast_errors(_mita(topk), inputs)
    baseline = _autocast_errors(_full_attention, inputs)
    for name, err, base in zip(('out', 'dq', 'dk', 'dv'), errors, baseline):
        # measured: at most 1.6x (dq)
        assert err <= 2 * base + 1e-6, (
            f'{name}: error {err:.3g} to float64, more than twice full '
            f"attention's {base:.3g}")


def test_bf16_as_accurate_as_full_attention_when_routing_cannot_flip():
    # topk = N: every expert sees every key, so the output is a continuous
    # function of the inputs and only rounding separates it from float64.
    _, (q, k, v), _ = _qkv()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert _mita(N)(q, k, v).dtype == torch.bfloat16
    _assert_as_close_as_full_attention((q, k, v))


def test_bf16_as_accurate_as_full_attention_for_most_queries_with_routing():
    # With topk < N, bfloat16 rounding may flip a near-tie in the expert
    # argmax or the top-k of a few queries; all others agree to rounding.
    _, qkv, _ = _qkv()
    exact = [t.detach().double() for t in qkv]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = _mita(16)(*qkv)
        full = _full_attention(*qkv)
    row_err = (out.double() - _mita(16)(*exact)).abs().amax(-1)
    allowed = 2 * float((full.double() - _full_attention(*exact)).abs().max())
    # measured: 94.5% of the rows (torch 2.13, CPU)
    assert (row_err <= allowed).double().mean() > 0.85


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
        out = _mita(N)(q, k, v)
    assert out.dtype == torch.bfloat16
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all()
               for g in grads)
    _assert_as_close_as_full_attention((q, k, v))


def test_backbone_under_autocast():
    torch.manual_seed(0)
    model = MiTAViT(img_size=(96, 96), patch_size=8, embed_dims=96,
                    num_layers=2, num_heads=3, out_indices=(1, ),
                    mita_cfg=dict(pool_size=4, topk=N))
    model.init_weights()
    x = torch.randn(2, 3, 96, 96)

    def autocast_error(mita_cfg):
        """Backbone output under autocast against float64."""
        model.set_mita(mita_cfg)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = model(x)[0]
        exact = copy.deepcopy(model).double()(x.double())[0]
        return out, float((out.double() - exact).abs().max())

    baseline = autocast_error(None)[1]  # mmseg's ViT: full attention
    out, error = autocast_error(dict(pool_size=4, topk=N))
    # measured: 0.97x mmseg's ViT (2 layers, same weights)
    assert error <= 2 * baseline
    out.float().square().mean().backward()
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
