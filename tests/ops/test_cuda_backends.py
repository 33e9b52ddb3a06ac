"""Every MiTA backend on a CUDA device against the dense float64 reference.

Skipped without CUDA (``conftest.py`` then selects Triton's CPU
interpreter, and ``test_triton_backend.py`` runs the kernels there).

Tolerances (relative Frobenius error against float64 on the same rounded
inputs): float32 ``1e-5`` forward, ``1e-4`` gradients; float16/bfloat16
(routing held fixed, see ``low_precision.py``): the Triton and flash-attn
backends within twice the torch backend's error at the same dtype, and
below ``2e-2`` forward, ``5e-2`` gradients.
"""
import importlib.util

import pytest
import torch
from low_precision import (assert_as_accurate_as_torch, relative_error,
                           triton_with_routing)
from mita_testing import (aligned_qkv, assert_topk_is_largest, experts_of,
                          flash_attn_runs, plan_of, random_qkv)

from mmseg_mita.ops import flash_backend, mita_attention, select_backend

from mita_testing import reference as reference_mita

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='needs a CUDA device')


def _backends():
    backends = ['torch']
    if importlib.util.find_spec('triton'):  # not imported: see conftest.py
        backends.append('triton')
    if flash_attn_runs():
        backends.append('flash')
    return backends


BACKENDS = _backends()
FP32_BACKENDS = [b for b in BACKENDS if b != 'flash']  # flash: fp16/bf16


def _skip_if_interpreted(backend):
    if backend == 'triton':
        from mmseg_mita.ops import triton_backend
        if triton_backend.interpreted():
            pytest.skip('TRITON_INTERPRET=1 is set in this process: run '
                        'this module in its own pytest process')


def _case(b, h, hw, extra, d, dtype, seed=0):
    """Inputs rounded to ``dtype``, as float64 leaves on the host."""
    n = extra + hw[0] * hw[1]
    return [
        t.detach().to(dtype).double().requires_grad_()
        for t in random_qkv(b, h, n, d, seed=seed)
    ]


def _run(backend, inputs, hw, extra, pool, topk, dtype, grad):
    low = [t.detach().to('cuda', dtype).requires_grad_() for t in inputs]
    out = mita_attention(*low, hw, num_extra_tokens=extra, pool_size=pool,
                         topk=topk, backend=backend)
    assert out.dtype == dtype and out.is_cuda
    grads = torch.autograd.grad(out, low, grad.to('cuda', dtype))
    return out, grads


def _errors(backend, inputs, hw, extra, pool, topk, dtype, ref, ref_grads,
            grad):
    out, grads = _run(backend, inputs, hw, extra, pool, topk, dtype, grad)
    return [relative_error(out, ref)] + [
        relative_error(g, w) for g, w in zip(grads, ref_grads)
    ]


def _reference(inputs, hw, extra, pool, topk, seed=1):
    ref = reference_mita(*inputs, hw, extra, pool, topk)
    gen = torch.Generator().manual_seed(seed)
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    return ref.detach(), torch.autograd.grad(ref, inputs, grad), grad


CASES = [
    # B, heads, hw, extra, pool, topk, head_dim
    (2, 3, (7, 11), 1, 3, 5, 16),
    (1, 2, (5, 5), 0, 2, 4, 32),
    (3, 2, (8, 5), 2, (3, 2), 6, 64),
    (1, 2, (4, 6), 1, 4, 1000, 64),   # topk >= N
    (1, 2, (20, 20), 1, 7, 49, 80),   # m = k = 49, padded head_dim
    (1, 1, (12, 13), 1, 3, 70, 128),  # head_dim 128
]


@pytest.mark.parametrize('backend', FP32_BACKENDS)
@pytest.mark.parametrize('b,h,hw,extra,pool,topk,d', CASES)
def test_float32_on_cuda_matches_reference(backend, b, h, hw, extra, pool,
                                           topk, d):
    _skip_if_interpreted(backend)
    inputs = _case(b, h, hw, extra, d, torch.float32)
    ref, ref_grads, grad = _reference(inputs, hw, extra, pool, topk)
    errors = _errors(backend, inputs, hw, extra, pool, topk, torch.float32,
                     ref, ref_grads, grad)
    assert errors[0] < 1e-5, errors
    assert max(errors[1:]) < 1e-4, errors


def test_one_expert_gets_every_query_on_cuda():
    hw, d = (16, 16), 64
    n = 1 + hw[0] * hw[1]
    inputs = [t.detach().float().double().requires_grad_()
              for t in aligned_qkv(1, 2, n, d)]
    experts = experts_of(*inputs, hw, 1, (3, 3), 20)
    assert (experts.expert == experts.expert[:, :1]).all()
    ref, ref_grads, grad = _reference(inputs, hw, 1, 3, 20)
    for backend in FP32_BACKENDS:
        _skip_if_interpreted(backend)
        errors = _errors(backend, inputs, hw, 1, 3, 20, torch.float32, ref,
                         ref_grads, grad)
        assert errors[0] < 1e-5 and max(errors[1:]) < 1e-4, (backend, errors)


def _backend_fn(backend):
    if backend == 'flash':
        return flash_backend.attend_experts
    return triton_with_routing((20, 20), 1, (7, 7))


@pytest.mark.parametrize('backend', [b for b in BACKENDS if b != 'torch'])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_half_precision_on_cuda_as_accurate_as_torch(backend, dtype):
    # Routing held fixed (low_precision.py): only numerical error counts;
    # at most twice the torch backend's error at the same dtype.
    _skip_if_interpreted(backend)
    inputs = _case(2, 3, (20, 20), 1, 64, dtype)
    assert_as_accurate_as_torch(_backend_fn(backend), inputs, (20, 20), 1,
                                (7, 7), 49, dtype, 'cuda')


def _require_triton():
    if 'triton' not in BACKENDS:
        pytest.skip('triton is not installed')
    _skip_if_interpreted('triton')


@pytest.mark.parametrize('n_side,d', [(64, 64), (45, 128), (180, 64)])
def test_triton_matches_torch_backend_at_larger_sizes(n_side, d):
    # Beyond the reference's reach (N up to 32401): same routing, so the
    # two backends must agree to float32 accuracy.
    _require_triton()
    hw = (n_side, n_side)
    n = 1 + n_side * n_side
    q, k, v = (torch.randn(1, 2, n, d, device='cuda', requires_grad=True)
               for _ in range(3))
    grad = torch.randn(1, 2, n, d, device='cuda')
    results = {}
    for backend in ('torch', 'triton'):
        out = mita_attention(q, k, v, hw, backend=backend)
        results[backend] = [out] + list(
            torch.autograd.grad(out, (q, k, v), grad))
    for got, want in zip(results['triton'], results['torch']):
        assert float((got - want).norm() / want.norm()) < 1e-5


@pytest.mark.parametrize('n_side', [32, 64, 256])
def test_triton_topk_is_the_largest_on_cuda(n_side):
    # The fused top-k by chunk maxima compiled (chunks of 1, 4 and 8
    # tokens at N = 1025, 4097, 65537; the last two recompute their
    # candidates' logits in the merge): every landmark's 49 keys are the
    # largest of R K^T up to a float32 product's rounding.
    _require_triton()
    from mmseg_mita.ops import triton_backend
    hw = (n_side, n_side)
    q, k, v = (torch.randn(1, 2, 1 + n_side * n_side, 64, device='cuda',
                           dtype=torch.bfloat16) for _ in range(3))
    outs = triton_backend.mita_triton_fwd(q, k, v, *hw, 1, 7, 7, 49, None,
                                          None)
    landmarks, topk_index = outs[2], outs[5]
    assert_topk_is_largest(landmarks, k, topk_index)


def test_triton_under_autocast_on_cuda():
    _require_triton()
    hw = (24, 24)
    q, k, v = (torch.randn(2, 3, 1 + 576, 64, device='cuda',
                           requires_grad=True) for _ in range(3))
    results = {}
    for backend in ('torch', 'triton'):
        with torch.autocast('cuda', dtype=torch.bfloat16):
            out = mita_attention(q, k, v, hw, backend=backend)
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        results[backend] = (out, grads)
    out, grads = results['triton']
    assert out.dtype == torch.bfloat16
    assert float((out - results['torch'][0]).float().norm() /
                 results['torch'][0].float().norm()) < 1e-2
    for got, want in zip(grads, results['torch'][1]):
        assert float((got - want).norm() / want.norm()) < 2e-2


def test_auto_keeps_the_torch_backend_without_flash():
    # 'auto' may choose triton only after a GPU run validated it.
    q = torch.randn(1, 1, 17, 64, device='cuda', dtype=torch.bfloat16)
    want = 'flash' if flash_attn_runs() else 'torch'
    for x, name in ((q, want), (q.float(), 'torch')):
        assert select_backend('auto', x, x, x,
                              plan_of(x, (4, 4), 1, 2, 3)).name == name
