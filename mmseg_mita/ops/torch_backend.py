"""Pure PyTorch MiTA backend: blocked attention over per-expert key sets.

The backend (``BACKEND``, declared at the end: any device and floating
dtype, every option) is :func:`mita_torch`: the shared part
(:func:`~.experts.compute_experts`), then :func:`attend_experts` (the seam
of :mod:`.experts`), whose autograd reaches ``q``, ``k``, ``v``,
``experts.route_logits`` and ``experts.shared_values``.

The queries, sorted by expert, sit in blocks of ``block`` slots that all
belong to one expert (:func:`~.routing.block_layout`; unused slots hold a
zero query whose output is dropped). The number of blocks follows from the
shapes: no host read, and the whole call, hand-written backward included,
traces into one graph under ``torch.compile(fullgraph=True)``. Per query the
logits are ``[s^2 (q . R_j)]_j`` (the routing logits, reused) followed by
``[s q . K_t]`` for the ``k`` routed keys of its expert, scored by one
batched matmul per block. One softmax covers both, so no merge of partial
softmaxes is needed; the compressed probabilities meet the shared values
``Vt`` in one matmul per group. Cost and memory are linear in N: no N x N
tensor, and the routed keys are gathered once per block, never per query.

:class:`ExpertBlockAttention` writes the backward by hand. It keeps only the
probabilities (plus the inputs, which the rest of the graph keeps anyway),
gathers the slotted queries and each block's routed keys and values again
instead of storing them, and sums key/value gradients per expert before
adding them into ``dk``/``dv``.

The variants: ``experts_per_query = s > 1`` fills the same blocks with
(query, expert) pairs, routing-only leaves the compressed logits out, both
in :class:`ExpertBlockAttention`; compression-only is a plain softmax over
the compressed logits (:func:`_compression_only`).
"""
import torch
import torch.nn.functional as F
from torch import Tensor

from .declaration import MiTABackend
from .experts import MiTAExperts, compute_dtype, compute_experts, softmax_fp32
from .plan import MiTAPlan
from .routing import BlockLayout, block_layout, routed_index, to_slots


def _gather_blocks(x: Tensor, rows: Tensor, num_blocks: int) -> Tensor:
    """Rows ``rows`` [num_blocks * k] of ``x`` [G, N, d] as [blocks, k, d]."""
    d = x.shape[-1]
    return x.reshape(-1, d).index_select(0, rows).view(num_blocks, -1, d)


def _sum_into_keys(grad_blocks: Tensor, key_rows: Tensor,
                   block_expert: Tensor, shape: torch.Size) -> Tensor:
    """Gradients [blocks, k, d] of each block's routed keys (or values)
    summed into a zero tensor of ``shape`` [G, N, d]: over each expert's
    blocks first (few long rows), then into the key rows (G * m * k rows of
    d, not blocks * k)."""
    d = shape[-1]
    per_expert = grad_blocks.new_zeros(key_rows.shape + (d, ))
    per_expert.index_add_(0, block_expert, grad_blocks)
    return grad_blocks.new_zeros(shape).view(-1, d).index_add_(
        0, key_rows.flatten(), per_expert.view(-1, d)).view(shape)


class ExpertBlockAttention(torch.autograd.Function):
    """Each query's one softmax over its compressed logits (if any) and the
    routed logits of its ``s`` experts.

    The block layout holds (query, expert) pairs: pair ``i * s + j`` is
    flat query ``i`` with its ``j``-th expert, so each query sits in ``s``
    blocks (with ``s = 1`` the pairs are the queries). Routed logits are
    scored per block, gathered per query to [G * N, s * k] beside the
    compressed logits for the softmax, and the routed probabilities go
    back to the blocks for the value matmul; the ``s`` pair outputs of a
    query are summed.

    Inputs: ``q``, ``k``, ``v`` [G, N, d]; ``route_logits`` (the compressed
    logits ``s^2 q . R``) [G, N, m] and ``shared_values`` (Vt) [G, m, d],
    both None without a shared expert; ``key_rows`` [G * m, k], the rows of
    each expert's routed keys in ``k.view(G * N, d)``; ``layout``:
    :func:`~.routing.block_layout` of the experts [G, N * s]; ``s``;
    ``dropout_p`` on the probabilities. Output [G, N, d].
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, route_logits,
                shared_values, key_rows: Tensor, layout: BlockLayout, s: int,
                dropout_p: float) -> Tensor:
        g, n, d = q.shape
        m = 0 if shared_values is None else shared_values.shape[1]
        topk = key_rows.shape[1]
        slots = g * layout.slots_per_group
        num_blocks = layout.block_expert.numel()
        rows = key_rows.index_select(0, layout.block_expert).flatten()

        # Matmuls write contiguous outputs only: into a strided view, CPU
        # bmm falls back to one small GEMM call per block (70x slower under
        # load).
        q_pairs = to_slots(_pairs(q.reshape(g * n, d), s), layout.slot,
                           slots).view(num_blocks, layout.block, d)
        routed = _scaled_bmm(
            q_pairs, _gather_blocks(k, rows, num_blocks).transpose(1, 2),
            d**-0.5)
        del q_pairs
        routed = routed.view(slots, topk).index_select(0, layout.slot)
        logits = routed.view(g * n, s * topk)
        if m:
            logits = torch.cat([route_logits.reshape(g * n, m), logits], -1)
        probs = softmax_fp32(logits, inplace=True)
        del logits, routed

        mask = _keep_mask(probs, dropout_p)
        used = _dropped(probs, mask, dropout_p, v.dtype)
        used_routed = to_slots(used[:, m:].reshape(g * n * s, topk),
                               layout.slot, slots)
        out = torch.bmm(used_routed.view(num_blocks, layout.block, topk),
                        _gather_blocks(v, rows, num_blocks))
        out = _sum_pairs(out.view(slots, d).index_select(0, layout.slot),
                         s).view(g, n, d)
        if m:
            # Out of place: torch 2.11's torch.compile drops the gradient
            # of a Function output that forward modified in place.
            out = torch.baddbmm(out, used[:, :m].view(g, n, m),
                                shared_values)

        ctx.save_for_backward(probs, mask, q, k, v, shared_values, key_rows,
                              layout.block_expert, layout.slot)
        ctx.sizes = (m, s, layout.block, slots)
        ctx.dropout_p = dropout_p
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (probs, mask, q, k, v, shared_values, key_rows, block_expert,
         slot) = ctx.saved_tensors
        g, n, d = q.shape
        m, s, block, slots = ctx.sizes
        topk = key_rows.shape[1]
        num_blocks = block_expert.numel()
        need = ctx.needs_input_grad
        rows = key_rows.index_select(0, block_expert).flatten()

        def to_blocks(per_pair: Tensor) -> Tensor:
            width = per_pair.shape[-1]
            return to_slots(per_pair, slot, slots).view(
                num_blocks, block, width)

        def to_pairs(blocks: Tensor) -> Tensor:
            width = blocks.shape[-1]
            return blocks.view(slots, width).index_select(0, slot)

        grad_flat = grad_out.reshape(g * n, d)
        grad_blocks = to_blocks(_pairs(grad_flat, s))
        used = _dropped(probs, mask, ctx.dropout_p, v.dtype)
        grad_q = grad_k = grad_v = grad_route = grad_shared = None
        if need[4]:
            grad_shared = torch.bmm(used[:, :m].view(g, n, m).transpose(1, 2),
                                    grad_out)
        if need[2]:
            used_routed = to_blocks(used[:, m:].reshape(g * n * s, topk))
            grad_v = _sum_into_keys(
                torch.bmm(used_routed.transpose(1, 2), grad_blocks),
                key_rows, block_expert, q.shape)
        if not (need[0] or need[1] or need[3]):
            return grad_q, grad_k, grad_v, grad_route, grad_shared, None, \
                None, None, None
        del used

        grad_probs = to_pairs(
            torch.bmm(grad_blocks,
                      _gather_blocks(v, rows, num_blocks).transpose(1, 2)))
        grad_probs = grad_probs.view(g * n, s * topk)
        if m:
            grad_probs = torch.cat([
                torch.bmm(grad_out, shared_values.transpose(1, 2)).view(
                    g * n, m), grad_probs
            ], -1)
        del grad_blocks
        grad_logits = _softmax_backward(probs, grad_probs, mask,
                                        ctx.dropout_p, q.dtype)
        if need[3]:
            grad_route = grad_logits[:, :m].reshape(g, n, m)
        grad_routed = to_blocks(grad_logits[:, m:].reshape(g * n * s, topk))
        if need[0]:
            grad_q = _sum_pairs(
                to_pairs(
                    _scaled_bmm(grad_routed,
                                _gather_blocks(k, rows, num_blocks),
                                d**-0.5)), s).view(g, n, d)
        if need[1]:
            q_pairs = to_blocks(_pairs(q.reshape(g * n, d), s))
            grad_k = _sum_into_keys(
                _scaled_bmm(grad_routed.transpose(1, 2), q_pairs, d**-0.5),
                key_rows, block_expert, q.shape)
        return grad_q, grad_k, grad_v, grad_route, grad_shared, None, None, \
            None, None


def _pairs(per_query: Tensor, s: int) -> Tensor:
    """Rows [Q, w] of the queries as rows [Q * s, w] of their (query,
    expert) pairs: each query ``s`` times in a row (itself for ``s = 1``).
    """
    return per_query if s == 1 else per_query.repeat_interleave(s, dim=0)


def _sum_pairs(per_pair: Tensor, s: int) -> Tensor:
    """Rows [Q * s, w] of the (query, expert) pairs summed per query,
    [Q, w] (themselves for ``s = 1``)."""
    return per_pair if s == 1 else per_pair.view(-1, s,
                                                 per_pair.shape[-1]).sum(1)


def _compression_only(route_logits: Tensor, shared_values: Tensor,
                      dropout_p: float) -> Tensor:
    """``softmax(route_logits) @ Vt`` [G, N, d]: attention over the ``m``
    compressed keys alone (autograd keeps the [G, N, m] probabilities)."""
    probs = softmax_fp32(route_logits).to(shared_values.dtype)
    if dropout_p > 0:
        probs = F.dropout(probs, dropout_p)
    return probs @ shared_values


def _keep_mask(probs: Tensor, dropout_p: float):
    """Attention dropout's keep mask (``None`` without dropout)."""
    return torch.rand_like(probs) >= dropout_p if dropout_p > 0 else None


def _dropped(probs: Tensor, mask, dropout_p: float,
             dtype: torch.dtype) -> Tensor:
    """The probabilities the values see, in ``dtype``: after dropout, the
    kept ones rescaled by ``1 / (1 - dropout_p)``."""
    used = probs.to(dtype)
    if mask is not None:
        used = used * mask / (1 - dropout_p)
    return used


def _softmax_backward(probs: Tensor, grad_probs: Tensor, mask,
                      dropout_p: float, dtype: torch.dtype) -> Tensor:
    """Gradient of the logits, in ``dtype``, from that of the probabilities
    after dropout (``mask``): ``p * (dp - p . dp)``, computed in place in
    the dtype of ``probs``."""
    grad_logits = grad_probs.to(probs.dtype)
    if mask is not None:
        grad_logits.mul_(mask).div_(1 - dropout_p)
    row_dot = probs.unsqueeze(-2) @ grad_logits.unsqueeze(-1)
    grad_logits.sub_(row_dot.squeeze(-1)).mul_(probs)
    return grad_logits.to(dtype)


def _scaled_bmm(a: Tensor, b: Tensor, scale: float) -> Tensor:
    """``scale * (a @ b)`` in one pass."""
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
    return out.baddbmm_(a, b, beta=0, alpha=scale)


def attend_experts(q: Tensor, k: Tensor, v: Tensor, experts: MiTAExperts,
                   dropout_p: float = 0.0) -> Tensor:
    """Each query's one softmax given the shared part ``experts`` (the
    seam of :mod:`.experts`): any device and dtype, every variant, dropout
    included; under autocast it computes in the autocast dtype."""
    b, h, n, d = q.shape
    g = b * h
    m = experts.landmarks.shape[1]
    device = q.device.type
    # The Function computes in one dtype, outside autocast, with its
    # softmax in float32.
    dtype = compute_dtype(q, v)
    q, k, v, route_logits, shared_values = (
        None if t is None else t.to(dtype)
        for t in (q.reshape(g, n, d), k.reshape(g, n, d), v.reshape(g, n, d),
                  experts.route_logits, experts.shared_values))
    with torch.autocast(device, enabled=False):
        if experts.expert is None:
            out = _compression_only(route_logits, shared_values, dropout_p)
            return out.view(b, h, n, d)
        s = experts.experts_per_query
        layout = block_layout(experts.expert.reshape(g, n * s), m)
        key_rows = routed_index(experts.topk_index, n)
        if shared_values is None:
            route_logits = None  # routing only: no compressed logits
        out = ExpertBlockAttention.apply(q, k, v, route_logits,
                                         shared_values, key_rows, layout, s,
                                         dropout_p)
    return out.view(b, h, n, d)


def mita_torch(q: Tensor, k: Tensor, v: Tensor, plan: MiTAPlan) -> Tensor:
    """The torch backend's run: MiTA of ``q``, ``k``, ``v`` [B, heads, N,
    d] for the call's ``plan``."""
    return attend_experts(q, k, v, compute_experts(q, k, v, plan),
                          plan.dropout_p)


BACKEND = MiTABackend('torch', mita_torch)
