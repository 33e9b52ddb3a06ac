"""The torch backend as one graph: ``torch.compile(fullgraph=True)``
forward and backward equal eager (gradients not all zero), no output of
its autograd Function modified in place (torch 2.11 compiles the backward
of such an output to zeros), and no host synchronisation in a forward and
backward (the block layout's sizes come from the shapes alone)."""
import pytest
import torch
from mita_testing import assert_same_gradients, random_qkv

from mmseg_mita.bench.launch_counter import no_host_sync
from mmseg_mita.ops import mita_attention

HW = (6, 7)
N = 1 + HW[0] * HW[1]
VARIANTS = [dict(), dict(experts_per_query=2),
            dict(experts_per_query=2, shared_expert=False)]


def _attention(**variant):
    def attention(q, k, v):
        return mita_attention(q, k, v, HW, pool_size=3, topk=5,
                              backend='torch', **variant)

    return attention


def _assert_compiled_equals_eager(fn, inputs, backend, tol=1e-6):
    compiled = torch.compile(fn, fullgraph=True, dynamic=False,
                             backend=backend)
    got = compiled(*inputs)
    want = fn(*inputs)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    grad = torch.randn_like(want)
    assert_same_gradients(torch.autograd.grad(got, inputs, grad),
                          torch.autograd.grad(want, inputs, grad), tol, tol)


@pytest.mark.parametrize('variant', VARIANTS,
                         ids=['default', 's2', 's2-no-shared'])
def test_compiled_fullgraph_equals_eager(variant):
    # aot_eager: Dynamo + AOTAutograd (the whole graph, forward and the
    # hand-written backward) without Inductor's compile time.
    inputs = random_qkv(2, 2, N, 8, dtype=torch.float32)
    _assert_compiled_equals_eager(_attention(**variant), inputs,
                                  'aot_eager')


def test_inductor_fullgraph_equals_eager():
    # One Inductor compile (40 to 120 s on 2 shared cores).
    inputs = random_qkv(1, 2, N, 8, dtype=torch.float32, seed=1)
    _assert_compiled_equals_eager(_attention(), inputs, 'inductor',
                                  tol=1e-5)


class _Block(torch.nn.Module):
    """Linear -> MiTA -> Linear, as in a transformer block."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(
            2, 0, 3, 1, 4)
        out = mita_attention(q, k, v, HW, pool_size=3, topk=5,
                             backend='torch')
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


def test_compiled_block_equals_eager():
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(2, N, 16, requires_grad=True)
    params = [x] + list(block.parameters())
    compiled = torch.compile(block, fullgraph=True, dynamic=False,
                             backend='aot_eager')
    got, want = compiled(x), block(x)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    grad = torch.randn_like(want)
    assert_same_gradients(torch.autograd.grad(got, params, grad),
                          torch.autograd.grad(want, params, grad), 1e-6,
                          1e-6)


@pytest.mark.parametrize('variant', VARIANTS + [dict(dropout_p=0.1)],
                         ids=['default', 's2', 's2-no-shared', 'dropout'])
def test_function_output_is_not_modified_in_place(variant):
    # torch 2.11's torch.compile gives all-zero gradients for an output of
    # an autograd Function that its forward modified in place; the version
    # counter shows such a write on any torch, eager.
    out = _attention(**variant)(*random_qkv(1, 2, N, 8))
    assert out.grad_fn is not None
    assert out._version == 0


@pytest.mark.parametrize('variant', VARIANTS,
                         ids=['default', 's2', 's2-no-shared'])
def test_forward_and_backward_without_host_sync(variant):
    inputs = random_qkv(1, 2, N, 8, dtype=torch.float32)
    with no_host_sync():
        out = _attention(**variant)(*inputs)
        torch.autograd.grad(out, inputs, torch.ones_like(out))


def test_host_sync_check_fails_on_item():
    with pytest.raises(RuntimeError, match='host synchronisation'):
        with no_host_sync():
            torch.ones(3).sum().item()
