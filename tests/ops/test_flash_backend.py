"""The flash-attn backend (and the torch backend on CUDA).

On CPU, the flash backend's bookkeeping (expert key sets, varlen offsets,
query order) runs against a plain-PyTorch stand-in for
``flash_attn_varlen_func``; the real kernel is checked where CUDA and
flash-attn are present.
"""
import sys
import types

import pytest
import torch
from mita_testing import assert_as_close_as_baseline, random_qkv, reference

from mmseg_mita.ops import compute_experts, mita_attention
from mmseg_mita.ops.flash_backend import flash_attn_available, mita_flash

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='needs a CUDA device')
needs_flash = pytest.mark.skipif(
    not flash_attn_available(),
    reason='needs flash-attn on a CUDA device (pip install -e .[flash])')


def plain_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k,
                           max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False):
    """``flash_attn_varlen_func``'s contract, one sequence at a time."""
    assert q.dim() == k.dim() == v.dim() == 3 and not causal
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    assert dropout_p == 0.0
    len_q = cu_seqlens_q.diff()
    len_k = cu_seqlens_k.diff()
    assert int(len_q.min()) > 0, 'an empty query sequence reached the kernel'
    assert int(len_q.max()) == max_seqlen_q
    assert int(len_k.max()) == max_seqlen_k
    assert int(cu_seqlens_q[-1]) == q.shape[0]
    assert int(cu_seqlens_k[-1]) == k.shape[0]
    out = []
    for i in range(len(len_q)):
        qs = q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]].transpose(0, 1)
        ks = k[cu_seqlens_k[i]:cu_seqlens_k[i + 1]].transpose(0, 1)
        vs = v[cu_seqlens_k[i]:cu_seqlens_k[i + 1]].transpose(0, 1)
        probs = torch.softmax(softmax_scale * qs @ ks.transpose(1, 2), -1)
        out.append((probs @ vs).transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize('b,h,hw,extra,pool,topk', [
    (2, 3, (7, 11), 1, 3, 5),
    (1, 2, (4, 6), 1, 4, 1000),
    (1, 1, (6, 6), 0, 3, 4),
])
def test_flash_bookkeeping_with_plain_varlen_attention(
        monkeypatch, b, h, hw, extra, pool, topk):
    fake = types.ModuleType('flash_attn')
    fake.flash_attn_varlen_func = plain_varlen_attention
    monkeypatch.setitem(sys.modules, 'flash_attn', fake)

    n = extra + hw[0] * hw[1]
    q, k, v = random_qkv(b, h, n, 8)
    pool_pair = (pool, pool) if isinstance(pool, int) else pool
    experts = compute_experts(q, k, v, hw, extra, pool_pair, topk)
    out = mita_flash(q, k, v, experts)
    ref = reference(q, k, v, hw, extra, pool, topk)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for g1, g2 in zip(got, want):
        torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-9)


def test_flash_without_flash_attn_names_the_fix():
    if flash_attn_available():
        pytest.skip('flash-attn is available here')
    q = torch.randn(1, 1, 17, 8)
    with pytest.raises(ValueError, match="backend='torch'"):
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3, backend='flash')


@needs_flash
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_flash_backend_matches_reference_on_cuda(dtype):
    # Tolerance calibrated on the torch backend at the same dtype.
    def run(backend):
        return lambda q, k, v: mita_attention(q, k, v, (20, 20),
                                              backend=backend)

    inputs = [
        t.detach().to('cuda', dtype) for t in random_qkv(2, 6, 401, 64)
    ]
    assert_as_close_as_baseline(
        run('flash'), run('torch'), inputs,
        lambda q, k, v: reference(q, k, v, (20, 20), 1, 7, 49))


@needs_flash
def test_auto_picks_flash_for_half_on_cuda():
    from mmseg_mita.ops import resolve_backend
    q = torch.randn(1, 1, 17, 64, device='cuda', dtype=torch.float16)
    assert resolve_backend('auto', q) == 'flash'
    assert resolve_backend('auto', q.float()) == 'torch'


@needs_cuda
def test_torch_backend_on_cuda_matches_reference():
    q, k, v = random_qkv(2, 3, 1 + 77, 16)
    ref = reference(q, k, v, (7, 11), 1, 3, 5)
    dev = [t.detach().cuda().requires_grad_() for t in (q, k, v)]
    out = mita_attention(*dev, (7, 11), pool_size=3, topk=5,
                         backend='torch')
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(ref)
    out.backward(grad.cuda())
    ref.backward(grad)
    for a, b in zip(dev, (q, k, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-9,
                                   atol=1e-9)
