"""MiTA (default variant) as one fused Triton pipeline (CUDA; CPU through
``TRITON_INTERPRET=1``), shared part included.

Per group ``g = (batch, head)``, ``s = d ** -0.5`` (spec:
:func:`~..naive.naive_mita`), the forward is FOUR launches:

1. ``_pool``, grid (G, m): landmark ``j`` is the mean of the patch queries
   of its bin (PyTorch's adaptive bins, which may overlap) -> ``R``;
2. ``_keys``, grid (G, S): the tokens in ``S`` splits of ``chunk`` (about
   two waves of programs over the groups, at least two key tiles each).
   Split ``s`` streams its keys once per tile of landmarks (every
   landmark in one tile of up to 64 on sm_90 in 16 bits, head_dim <= 64,
   chunks of several tokens; else 16 a tile: ``Config.keys_l``): ``R
   K^T`` feeds a partial online
   softmax of ``s R K^T`` (the split's output and log-sum-exp, as in
   flash-decoding) and, per landmark, the largest logit
   of each chunk of ``c`` tokens (a split starts and ends on chunk bounds),
   stored as int32 bits that order as the float32 logit (NaN above every
   number, as in ``torch.topk``). Then it routes its own queries,
   ``argmax_j q . R_j`` (the first index on ties; a NaN score counts as
   +inf, so an all-NaN row goes to expert 0, as ``torch.argmax`` sends it;
   an id outside ``[0, m)``, what a compiled argmax may return for a row it
   cannot order, becomes 0: every query gets its output rows), and counts
   them per expert;
3. ``_merge``, grid (G, max(m, S)): program ``p < m`` merges expert ``p``'s
   S partial softmaxes into its shared values ``Vt`` and their log-sum-exp
   (saved for the backward), selects its ``k`` keys from its chunk maxima
   (below) and marks its blocks; program ``p < S`` writes the queries of
   split ``p``
   to their slots, a stable counting sort: a query's slot is its expert's
   first slot (after the blocks of the experts before it, from the splits'
   counts), plus its expert's queries in earlier splits, plus its rank
   among them in the split (by bit masks over rows of 32 queries, a row
   a warp). Fixed-capacity layout: a group has
   ``NB = N // BLOCK + min(m, N)`` blocks of ``BLOCK`` slots (an expert
   with ``c`` queries takes ``ceil(c / BLOCK)`` consecutive blocks, in
   expert order; ``sum ceil(c_e / BLOCK) <= N / BLOCK + #non-empty``);
   ``slots`` maps slot -> query (-1 empty), ``block_expert`` block ->
   expert (-1 unused);
4. ``_experts_fwd``, one program per ``BLOCK_M`` slots (a part of one
   block; it returns at once if they hold no query): ONE online softmax
   (float32, base 2) over the ``m`` compressed logits ``s^2 q . R``
   (recomputed from ``R``: cheaper than storing [G, N, m]) with values
   ``Vt`` and the expert's ``k`` routed keys, read
   by index from K and V; writes the output and its log-sum-exp.

The top-k selects exactly the set ``torch.topk`` would, ties to the lower
token: each key is an int64, the order-preserving bits of its float32
logit above ``2^32 - 1 - token``. A chunk's key is its maximum's bits
above ``2^32 - 1 - chunk`` (ties to the lower chunk, whose tokens are all
lower); the ``K_PAD`` chunks of the largest keys (``k`` rounded up to a
power of two) hold the ``K_PAD`` largest token keys, as no key of another
chunk beats the maximum of each of them. The merge folds a landmark's
chunk keys ``K_PAD`` at a time into a sorted list (a bitonic sort of the
tile, the elementwise max with the list, one bitonic merge); at large N
first the maxima of groups of ``g`` chunks, then the chunks of the best
``K_PAD`` groups (the same argument one level up); then it recomputes the
logits of the best chunks' ``K_PAD c`` tokens with the keys pass's own
product (bit for bit: a landmark in every row of as many rows as the keys
pass's tile, in 16-row tensor-core products in both, :func:`~.topk._logits`)
and folds their keys. No trip count depends on the data.

For ``k > 64`` (:data:`~.settings.TOPK_FUSED_MAX`) ``_keys`` stores ``R K^T``
(float32 [G, m, N]) instead of the chunk maxima and
``torch.topk(min(topk, N), sorted=False)`` selects: 5 launches.

Backward (flash-style: probabilities recomputed from the saved
log-sum-exp), THREE launches after ONE zero-filled float32 buffer:

1. ``_experts_bwd``, grid (G, P): program ``p`` takes the group's tiles
   of ``BLOCK_M`` slots ``p, p + P, ..`` (strided: the unused blocks, at
   the layout's end, are shared out; ``P`` makes about two waves of
   programs). Per tile holding queries: ``delta = rowsum(dO * O)``;
   compressed keys: ``dq += s^2 dS R``, ``dR += s^2 dS^T q``, ``dVt += P^T
   dO``; routed keys: ``dq += s dS K``, ``dk += s dS^T q``, ``dv += P^T
   dO`` (atomics: a key may be routed by several experts, an expert span
   several blocks). ``dq`` (float32) is stored. ``dR``, ``dVt``
   (float32): with ``SUM_LANDMARKS`` (sm_90, 16 bits, head_dim <= 64,
   experts of at most 64 queries: where registers hold it) every landmark
   in one tile, summed in registers over the program's tiles (every query
   attends to every landmark, so the sums run across experts) and added
   once at its end (``P`` atomic adds a landmark and group: 6 instead of
   49 at N = 1025); else added atomically a tile;
2. ``_shared_bwd``, one program per (group, key block): the shared
   expert's backward from its saved log-sum-exp,
   ``dS = P (dVt V^T - rowsum(dVt * Vt))``, ``dR += s dS K`` (atomics),
   ``dk += s dS^T R``, ``dv += P^T dVt``; it owns its keys, so it adds the
   routed sums of step 1 and writes ``dk``, ``dv`` in their dtype;
3. ``_pool_bwd``, one program per (group, token block): ``dq += dR / bin
   size`` of each bin holding the patch query, gathered (a patch lies in at
   most 2 x 2 bins, as the pool size is at most the grid), written in its
   dtype.

Every atomic is a relaxed float32 add whose sum a later launch reads (the
kernel boundary orders it): no kernel has a memory fence, and no program
waits for another. Tiles and launch settings (:class:`~.settings.Config`) are a
function of the shapes, the dtype and the target that triton's active
driver compiles for (``get_current_target().arch``, which an
ahead-of-time check can stub): per target, every launch fits the shared
memory of a block and compiles without register spills in bf16 / fp16
(docs/gpu.md lists them).

Launches per call (ATen ops that do work + Triton kernels; measured in the
interpreter at N = 1025 and 4097, bf16, 6 heads, k = 49): 4 forward, 8
forward + backward (the 4 above, the fill, 3 kernels); for k > 64 plus
``torch.topk``; under autocast, plus the casts of q, k, v to the autocast
dtype.
No host synchronisation and no host-to-device copy: every buffer is sized
from the shapes, no count is read on the host. The forward and the backward
are ``torch.library`` custom ops (``mmseg_mita::mita_triton_fwd`` /
``mmseg_mita::mita_triton_bwd``, with fake implementations and autograd),
so ``torch.compile(fullgraph=True)`` captures a call without a graph break
(and, with no host sync and shape-only sizes, a CUDA graph can replay it).

Entry points: :func:`mita_triton` (the default variant, either landmark
convention), the run of ``mita_attention(backend='triton')``;
:func:`mita_triton_routed` (the same with the routing given, for the
low-precision tests). Both take the call's :class:`~.plan.MiTAPlan`.

Contract: q, k, v [B, heads, N, d] (any strides with a contiguous last
dim: strided views are read in place), float32 / float16 / bfloat16 (under
autocast: the autocast dtype), d <= 128; softmax and accumulation in
float32, float32 products in IEEE precision (never tf32). The gradients
are summed with float32 atomics: not bitwise deterministic on CUDA (as
``index_add_`` is not). What it does not compute (dropout, float64,
``head_dim > 128``, several experts per query, the ablations, CPU tensors
without the interpreter) is declared in ``BACKEND``: the dispatcher
refuses those calls, naming each reason, before they reach the entry
points. The registry (:mod:`..backends`) imports this package when
``backend='triton'`` is first asked for.

Layout, a module per pass (fla's ``ops/`` style; the plain reference is
:func:`..naive.naive_mita`, beside this package):

- :mod:`.pooling`: ``_pool`` and ``_pool_bwd``;
- :mod:`.keys`: ``_keys`` (the split softmax, chunk maxima, routing);
- :mod:`.topk`: the exact top-k (bits, keys, bitonic folds, the merge's
  selection);
- :mod:`.merge`: ``_merge`` (shared values, top-k, block layout, slots);
- :mod:`.experts_fwd`: ``_experts_fwd``;
- :mod:`.backward`: ``_experts_bwd`` and ``_shared_bwd``;
- :mod:`.helpers`: the jit helpers the passes share;
- :mod:`.settings`: tiles and launch settings per target
  (:class:`~.settings.Config`), the interpreter check;
- :mod:`.custom_ops`: the custom ops, autograd, entry points and
  ``BACKEND``.
"""
from .backward import _experts_bwd, _shared_bwd
from .custom_ops import (BACKEND, mita_triton, mita_triton_bwd,
                         mita_triton_fwd, mita_triton_routed)
from .experts_fwd import _experts_fwd
from .keys import _keys
from .merge import _merge
from .pooling import _pool, _pool_bwd
from .settings import Config, interpreted

# The Triton kernels of a forward and a backward, in launch order (what an
# ahead-of-time compile records; helpers are inlined into them), and their
# names as Config.grid and Config.launch take them.
KERNEL_FUNCTIONS = (_pool, _keys, _merge, _experts_fwd, _experts_bwd,
                    _shared_bwd, _pool_bwd)
KERNELS = tuple(fn.__name__.lstrip('_') for fn in KERNEL_FUNCTIONS)

__all__ = [
    'BACKEND', 'Config', 'KERNELS', 'KERNEL_FUNCTIONS', 'interpreted',
    'mita_triton', 'mita_triton_bwd', 'mita_triton_fwd',
    'mita_triton_routed'
]
