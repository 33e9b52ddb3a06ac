"""Block layout of the torch backend against a plain per-query check."""
import pytest
import torch

from mmseg_mita.ops.routing import (block_layout, choose_block,
                                    gather_routed, routed_index)


def _experts(kind, g, n, m, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if kind == 'random':
        return torch.randint(0, m, (g, n), generator=gen)
    if kind == 'one_expert':  # every query of a group to one expert
        return torch.randint(0, m, (g, 1), generator=gen).expand(g, n)
    if kind == 'skewed':  # a few big experts, many empty ones
        return (torch.rand(g, n, generator=gen)**4 * m).long()
    raise ValueError(kind)


@pytest.mark.parametrize('kind', ['random', 'one_expert', 'skewed'])
@pytest.mark.parametrize('block', [0, 1, 8, 64])
def test_block_layout_places_each_query_in_a_block_of_its_expert(
        kind, block):
    g, n, m = 5, 83, 7
    expert = _experts(kind, g, n, m)
    layout = block_layout(expert, m, block=block)
    blk, slots = layout.block, layout.slots_per_group
    if block:
        assert blk == block
    assert slots % blk == 0
    assert layout.block_expert.numel() * blk == g * slots

    slot = layout.slot
    assert slot.unique().numel() == g * n  # one query per slot
    group = torch.arange(g)[:, None].expand(g, n).flatten()
    assert torch.equal(slot // slots, group)  # inside its group's slots
    block_of_query = slot // blk
    assert torch.equal(layout.block_expert[block_of_query],
                       (expert + group.view(g, n) * m).flatten())

    # Blocks are as few as possible: ceil(count / block) per expert in the
    # fullest group, no more.
    counts = torch.stack([torch.bincount(e, minlength=m) for e in expert])
    needed = ((counts + blk - 1) // blk).sum(1)
    assert slots == int(needed.max()) * blk


def test_choose_block_trades_padding_against_block_count():
    many_small = torch.full((49, ), 20)
    few_large = torch.full((49, ), 1000)
    assert choose_block(many_small) < choose_block(few_large)
    assert choose_block(few_large, candidates=(16, 32)) == 32


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
