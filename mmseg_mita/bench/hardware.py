"""Hardware facts of the GPUs the kernels are compiled for, in one place.

Per compute capability (:data:`ARCHS`), from the CUDA C++ Programming
Guide's "Technical Specifications per Compute Capability" and the
architecture tuning guides: shared memory per SM and the most one block may
use (1 KB of each SM's shared memory is kept by the system for every
resident block, hence per block = per SM - 1 KB), resident threads and
blocks per SM, the register file. Per part (:data:`PARTS`): the SM count of
the reference part of each architecture and, for the H200 (the one part the
cost model times), the vendor datasheet's HBM bandwidth and dense tensor
rates (H200 SXM: 4.8 TB/s, bf16/fp16 989 TFLOP/s, tf32 494 TFLOP/s, fp32
67 TFLOP/s without tensor cores). ``/work/.library/device/KINDS.md``-style
readings of this workplace's H200 (PyTorch: 132 SMs, 60 MB L2; a device
copy at 4.3 TB/s, an 8192^3 bf16 matmul at 769-798 TFLOP/s) are what the
datasheet numbers are checked against on a GPU run.
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
    registers_per_sm: int  # 32-bit registers
    max_registers_per_thread: int
    register_unit: int  # registers are given to a warp in units of this
    # Dense tensor-core multiply-adds per clock per SM by operand type (float32
    # accumulation), where the cost model uses them.
    mma_per_clock: Optional[Dict[str, int]] = None

    @property
    def name(self) -> str:
        return f'sm_{self.arch}'


ARCHS = {
    a.arch: a
    for a in (
        Arch(80, 164 * KB, 163 * KB, KB, 2048, 32, 65536, 255, 256),
        Arch(89, 100 * KB, 99 * KB, KB, 1536, 24, 65536, 255, 256),
        # Hopper: twice the A100's 1024 bf16 multiply-adds per clock per SM
        # (989 TFLOP/s = 2 * 2048 * 132 SMs * 1.83 GHz).
        Arch(90, 228 * KB, 227 * KB, KB, 2048, 32, 65536, 255, 256,
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


def blocks_per_sm(facts: Arch, num_warps: int, registers: int,
                  shared: int) -> int:
    """Resident blocks per SM (occupancy) of a kernel with ``num_warps``
    warps, ``registers`` per thread and ``shared`` bytes of shared memory
    per block: the fewest that threads, the blocks limit, registers
    (``ceil(registers * 32 / unit) * unit`` per warp) and shared memory
    (plus the system's reserve per block) allow; 0 when one block does not
    fit."""
    threads = num_warps * 32
    per_warp = -(-registers * 32 // facts.register_unit) * facts.register_unit
    limits = [
        facts.max_threads_per_sm // threads, facts.max_blocks_per_sm,
        facts.registers_per_sm // max(per_warp, 1) // num_warps
    ]
    if shared > facts.smem_per_block:
        return 0
    limits.append(facts.smem_per_sm //
                  (shared + facts.smem_reserved_per_block))
    return max(0, min(limits))
