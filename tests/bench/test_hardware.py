"""Occupancy from the per-architecture facts of mmseg_mita.bench.hardware,
against counts worked by hand."""
import pytest

from mmseg_mita.bench import hardware


@pytest.mark.parametrize(
    'arch, warps, registers, shared, blocks',
    [
        (90, 4, 255, 115200, 2),  # registers: 8192 a warp -> 8 warps
        (90, 4, 32, 0, 16),  # threads: 2048 / 128
        (90, 1, 32, 0, 32),  # the blocks limit
        (89, 4, 32, 0, 12),  # sm_89 keeps 1536 threads
        (90, 4, 97, 0, 4),  # 104 registers a thread (units of 8): 19 warps
        (90, 4, 32, 57 * 1024, 3),  # shared: 228 KB / (57 KB + 1 KB)
        (90, 4, 32, 227 * 1024, 1),  # the most a block may use
        (90, 4, 32, 227 * 1024 + 1, 0),  # one byte more does not launch
        (89, 4, 32, 99 * 1024 + 1, 0),
        (80, 8, 129, 0, 1),  # 136 registers a thread: 15 warps fit
    ])
def test_blocks_per_sm(arch, warps, registers, shared, blocks):
    facts = hardware.arch(arch)
    assert hardware.blocks_per_sm(facts, warps, registers, shared) == blocks


def test_shared_memory_limits_and_the_timed_clock():
    assert [hardware.arch(a).smem_per_block for a in (80, 89, 90)] == [
        166912, 101376, 232448
    ]
    assert hardware.TIMED_PART.clock_hz == pytest.approx(1.83e9, rel=1e-3)


def test_unknown_arch_is_refused():
    with pytest.raises(ValueError, match='arch=75'):
        hardware.arch(75)
