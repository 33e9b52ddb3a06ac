"""Hardware facts of the GPUs the kernels are compiled for, in one place.

Per compute capability (:data:`ARCHS`), from the CUDA C++ Programming
Guide's "Technical Specifications per Compute Capability" and the
architecture tuning guides: shared memory per SM (its largest carve-out)
and the most one block may use (the system keeps 1 KB of each SM's shared
memory for every resident block: per block = per SM - 1 KB), resident
threads and blocks per SM, the register file and the unit registers are
given to a warp in. Per part (:data:`PARTS`): the SM count of the
reference part of each architecture and, for the H200 (the part the cost
model times), the vendor's datasheet: HBM3e at 4.8 TB/s, dense bf16 / fp16
989 TFLOP/s on the tensor cores, fp32 67 TFLOP/s without them; 60 MB of L2
as PyTorch reports it on an H200.
"""
from typing import Dict, NamedTuple, Optional

KB = 1024


class Arch(NamedTuple):
    """Per-SM limits of one compute capability (``arch`` = 10 * major +
    minor)."""
    arch: int
    smem_per_sm: int  # bytes, the largest carve-out
    smem_per_block: int  # bytes a block may use (opt-in)
    smem_reserved_per_block: int  # bytes the system keeps per resident block
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int  # 32-bit registers (also the most a block may use)
    register_unit: int  # registers are given to a warp in units of this
    # Dense tensor-core multiply-adds per clock per SM by operand type (float32
    # accumulation), where the cost model uses them.
    mma_per_clock: Optional[Dict[str, int]] = None


ARCHS = {
    a.arch: a
    for a in (
        Arch(80, 164 * KB, 163 * KB, KB, 2048, 32, 65536, 256),
        Arch(89, 100 * KB, 99 * KB, KB, 1536, 24, 65536, 256),
        # Hopper: twice the A100's 1024 bf16 multiply-adds per clock per SM
        # (989 TFLOP/s = 2 * 2048 * 132 SMs * 1.83 GHz).
        Arch(90, 228 * KB, 227 * KB, KB, 2048, 32, 65536, 256,
             dict(BF16=2048, F16=2048, TF32=1024)),
    )
}


class Part(NamedTuple):
    """A GPU: its architecture and SM count; the throughputs the cost model
    needs where they are known (None: this part is not timed)."""
    name: str
    arch: int
    sms: int
    l2_bytes: Optional[int] = None
    hbm_bytes_per_s: Optional[float] = None
    # Dense FLOP/s by the dtype of the operands (tensor cores for bf16 and
    # fp16; IEEE float32 products run on the FP32 units).
    flops: Optional[Dict[str, float]] = None

    @property
    def clock_hz(self) -> float:
        """The SM clock at which the datasheet's dense bf16 rate equals the
        tensor cores' multiply-adds per clock (1.83 GHz for the H200)."""
        per_clock = 2 * ARCHS[self.arch].mma_per_clock['BF16'] * self.sms
        return self.flops['bfloat16'] / per_clock


PARTS = {
    p.name: p
    for p in (
        Part('A100', 80, 108),
        Part('RTX 4090', 89, 128),
        Part('H100 SXM', 90, 132),
        Part('H200', 90, 132, l2_bytes=60 * 10**6, hbm_bytes_per_s=4.8e12,
             flops=dict(bfloat16=989e12, float16=989e12, float32=67e12)),
    )
}
# The part each architecture's occupancy and waves are counted on.
REFERENCE_PART = {80: 'A100', 89: 'RTX 4090', 90: 'H200'}
# The part the cost model times (the GPU of tools/gpu_check.sh).
TIMED_PART = PARTS['H200']


def arch(value: int) -> Arch:
    """The facts of compute capability ``value`` (80, 89 or 90)."""
    if value not in ARCHS:
        raise ValueError(f'arch={value}: known compute capabilities are '
                         f'{sorted(ARCHS)}; add the facts of another to '
                         'mmseg_mita.bench.hardware.ARCHS')
    return ARCHS[value]


def registers_per_warp(facts: Arch, registers: int) -> int:
    """Registers a warp of ``registers``-per-thread code is given: 32 x
    ``registers`` rounded up to the allocation unit (at least one unit)."""
    return max(1, -(-registers * 32 // facts.register_unit)) * \
        facts.register_unit


def blocks_per_sm(facts: Arch, num_warps: int, registers: int,
                  shared: int) -> int:
    """Resident blocks per SM (occupancy) of a kernel with ``num_warps``
    warps, ``registers`` per thread and ``shared`` bytes of shared memory
    per block: the fewest that threads, the blocks limit, registers
    (:func:`registers_per_warp`) and shared memory
    (plus the system's reserve per block) allow; 0 when one block does not
    fit."""
    threads = num_warps * 32
    limits = [
        facts.max_threads_per_sm // threads, facts.max_blocks_per_sm,
        facts.registers_per_sm // registers_per_warp(facts, registers) //
        num_warps
    ]
    if shared > facts.smem_per_block:
        return 0
    limits.append(facts.smem_per_sm //
                  (shared + facts.smem_reserved_per_block))
    return max(0, min(limits))
