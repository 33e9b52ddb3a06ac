"""The block layout shared by the torch, export and flash backends, against
a plain per-query check."""
import pytest
import torch

from mmseg_mita.ops.routing import (block_layout, block_size,
                                    blocks_per_group, gather_routed,
                                    routed_index)


def _experts(kind, g, n, m, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if kind == 'random':
        return torch.randint(0, m, (g, n), generator=gen)
    if kind == 'one_expert':  # every query of a group to one expert
        return torch.randint(0, m, (g, 1), generator=gen).expand(g, n)
    if kind == 'skewed':  # a few big experts, many empty ones
        return (torch.rand(g, n, generator=gen)**4 * m).long()
    if kind == 'all_used':  # every expert c_e = 1 (mod block): worst case
        return torch.arange(n)[None].expand(g, n) % m
    raise ValueError(kind)


def _check_layout(layout, expert, m):
    """Per query: one slot, in a block of its expert, at its rank among the
    expert's queries in sequence order; blocks: ceil(c_e / block) per
    expert, in expert order; none for an empty expert."""
    g, n = expert.shape
    blk, slots = layout.block, layout.slots_per_group
    assert slots == blk * (n // blk + min(m, n))
    assert layout.slot.shape == (g * n, )
    assert layout.block_expert.shape == (g * slots // blk, )
    slot = layout.slot.tolist()
    block_expert = layout.block_expert.tolist()
    assert len(set(slot)) == g * n  # one query per slot
    for gi in range(g):
        first = gi * slots // blk
        for b in range(slots // blk):  # every block: an expert of its group
            assert 0 <= block_expert[first + b] - gi * m < m
        start = 0  # the next expert's first block (experts in order)
        for e in range(m):
            queries = [i for i in range(n) if int(expert[gi, i]) == e]
            needed = -(-len(queries) // blk)
            owned = [b for b in range(start, slots // blk)
                     if block_expert[first + b] == gi * m + e]
            # its blocks: ceil(c / block) from `start`; unused trailing
            # blocks may carry any expert but sit after every used one
            assert owned[:needed] == list(range(start, start + needed))
            for rank, i in enumerate(queries):
                assert slot[gi * n + i] == (first + start) * blk + rank
            start += needed
        assert start <= slots // blk


@pytest.mark.parametrize('onehot', [False, True], ids=['sort', 'onehot'])
@pytest.mark.parametrize('kind', ['random', 'one_expert', 'skewed',
                                  'all_used'])
@pytest.mark.parametrize('block', [0, 1, 8, 64])
def test_block_layout_places_each_query_in_a_block_of_its_expert(
        kind, block, onehot):
    g, n, m = 3, 83, 7
    expert = _experts(kind, g, n, m)
    layout = block_layout(expert, m, block=block, onehot=onehot)
    if block:
        assert layout.block == block
    _check_layout(layout, expert, m)


def test_block_layout_with_more_experts_than_queries():
    expert = torch.tensor([[5, 5, 2], [0, 9, 9]])
    _check_layout(block_layout(expert, 10, block=2), expert, 10)


def test_blocks_per_group_bounds_the_blocks_of_any_routing():
    # ceil summed over the non-empty experts: at most N // block + min(m, N)
    for n, m, blk in [(83, 7, 8), (5, 10, 4), (64, 64, 64), (1025, 49, 32)]:
        counts = torch.zeros(m, dtype=torch.long)
        worst = min(m, n)
        counts[:worst] = 1
        counts[0] += n - worst  # one big expert, the others one query each
        assert int((-(-counts // blk)).sum()) <= blocks_per_group(n, m, blk)
    traced = blocks_per_group(torch.tensor(83), 7, 8)
    assert isinstance(traced, torch.Tensor) and int(traced) == 83 // 8 + 7


def test_block_size_follows_the_mean_expert_size():
    # Least padded slots + per-block cost near sqrt(24 N / m), from shapes.
    sizes = [block_size(n, 49) for n in (50, 1025, 4097, 16385)]
    assert sizes == sorted(sizes) and sizes[0] == 8 and sizes[-1] == 64
    assert block_size(16385, 49, candidates=(16, 32)) == 32


def test_gather_routed_matches_indexing():
    g, n, m, k, d = 3, 10, 4, 5, 6
    keys, values = torch.randn(2, g, n, d)
    index = torch.randint(0, n, (g, m, k))
    k_sel, v_sel = gather_routed(keys, values, index)
    rows = routed_index(index, n)
    for gi in range(g):
        for j in range(m):
            assert torch.equal(k_sel[gi * m + j], keys[gi, index[gi, j]])
            assert torch.equal(v_sel[gi * m + j], values[gi, index[gi, j]])
            assert torch.equal(rows[gi * m + j], index[gi, j] + gi * n)
