"""The flash-attn backend (and the torch backend on CUDA).

On CPU, the flash backend's bookkeeping (expert key sets, varlen offsets,
query order) runs against a plain-PyTorch stand-in for
``flash_attn_varlen_func`` (the ``plain_flash`` fixture); the real kernel
is checked where CUDA and flash-attn are present.
"""
import pytest
import torch
from low_precision import assert_as_accurate_as_torch
from mita_testing import (assert_matches_reference, experts_of,
                          flash_attn_runs, plan_of, random_qkv, reference)

from mmseg_mita.ops import mita_attention, select_backend
from mmseg_mita.ops.flash_backend import attend_experts

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='needs a CUDA device')
needs_flash = pytest.mark.skipif(
    not flash_attn_runs(),
    reason='needs flash-attn on a CUDA device (pip install -e .[flash])')


@pytest.mark.parametrize('b,h,hw,extra,pool,topk', [
    (2, 3, (7, 11), 1, 3, 5),
    (1, 2, (4, 6), 1, 4, 1000),
    (1, 1, (6, 6), 0, 3, 4),
])
def test_flash_bookkeeping_with_plain_varlen_attention(
        plain_flash, b, h, hw, extra, pool, topk):
    n = extra + hw[0] * hw[1]
    q, k, v = random_qkv(b, h, n, 8)
    pool_pair = (pool, pool) if isinstance(pool, int) else pool
    experts = experts_of(q, k, v, hw, extra, pool_pair, topk)
    assert_matches_reference(attend_experts(q, k, v, experts),
                             reference(q, k, v, hw, extra, pool, topk),
                             (q, k, v))


def test_flash_without_flash_attn_names_the_fix():
    if flash_attn_runs():
        pytest.skip('flash-attn is available here')
    q = torch.randn(1, 1, 17, 8)
    with pytest.raises(ValueError, match="backend='torch'"):
        mita_attention(q, q, q, (4, 4), pool_size=2, topk=3, backend='flash')


@needs_flash
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_flash_backend_as_accurate_as_torch_on_cuda(dtype):
    # Routing held fixed; at most twice the torch backend's error at the
    # same dtype (low_precision.py).
    inputs = [t.detach().to(dtype).double() for t in random_qkv(2, 6, 401, 64)]
    assert_as_accurate_as_torch(attend_experts, inputs, (20, 20), 1, (7, 7),
                                49, dtype, 'cuda')


@needs_flash
def test_auto_picks_flash_for_half_on_cuda():
    q = torch.randn(1, 1, 17, 64, device='cuda', dtype=torch.float16)
    for x, want in ((q, 'flash'), (q.float(), 'torch')):
        assert select_backend('auto', x, x, x,
                              plan_of(x, (4, 4), 1, 2, 3)).name == want


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
