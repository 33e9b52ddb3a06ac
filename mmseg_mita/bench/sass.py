"""What a kernel's SASS (``cuobjdump -sass``) says, counted statically.

:func:`profile` reads the disassembly of one kernel and returns, per loop
nest, the instructions it holds: a loop is a backward branch (its target
at or before the branch; branches sharing a target are one loop), and an
instruction belongs to every loop whose span holds it. The unconditional
branch to itself that ends a kernel (after its ``EXIT``) is not code.
Counted per region (the instructions of one loop nest, outside any inner
loop):

* ``instructions``: warp instructions issued (every instruction once,
  both sides of a branch included: predicates are not evaluated);
* ``mma``: tensor-core multiply-adds per warp, by operand type: an
  ``HMMA.16816`` is 16 x 8 x 16 for its warp, an ``HGMMA.64x64x16`` is
  64 x 64 x 16 for its warpgroup of 4 warps, so a quarter per warp;
* ``atomics`` and ``atomic_bytes``: global atomic instructions
  (``ATOMG``, ``ATOM``, ``RED``; ``REDG`` on sm_90: a relaxed
  ``tl.atomic_add``) and the bytes a warp moves with them
  (32 lanes x the vector width, e.g. 16 for ``F32x4``);
* ``gpu_fences``: ``MEMBAR`` at GPU or system scope (``MEMBAR.ALL.GPU``,
  ``MEMBAR.SC.GPU``... ; ``MEMBAR.ALL.CTA`` is CTA scope and not counted)
  and ``l1_invalidations`` (``CCTL.IVALL``, which drops the SM's L1): what
  an acquire/release global atomic costs;
* ``spill_store_bytes`` / ``spill_load_bytes``: per thread, the widths of
  ``STL`` / ``LDL`` (Triton keeps no arrays in local memory, so these are
  register spills; the totals equal ``ptxas -v``'s spill stores / loads).

:func:`source_lines` reads the source line of each instruction from
``nvdisasm --print-line-info``: a loop's line (that of its backward
branch) names the ``for`` it comes from. One source loop may give two SASS
loops (unrolled, with a remainder loop) and an inlined helper's loop
appears once per call.
"""
import re
from collections import Counter
from typing import Dict, List, NamedTuple, Tuple

_LINE = re.compile(
    r'^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;\s*/\*\s*0x[0-9a-f]+\s*\*/')
_PREDICATE = re.compile(r'^@!?U?P[T0-9]+\s+')
_TARGET = re.compile(r'\b0x([0-9a-f]+)\b')
_SOURCE = re.compile(r'//## File "(.*)", line (\d+)')
_ADDRESS = re.compile(r'^\s*/\*([0-9a-f]+)\*/')
_HGMMA = re.compile(r'^(\d+)x(\d+)x(\d+)$')
# mma.sync shapes as HMMA spells them (M, N, K).
HMMA_SHAPES = {'16816': (16, 8, 16), '1688': (16, 8, 8), '884': (8, 8, 4)}
GLOBAL_ATOMICS = ('ATOMG', 'ATOM', 'RED', 'REDG')  # not REDUX (a warp sum)
FIELDS = ('instructions', 'atomics', 'atomic_bytes', 'gpu_fences',
          'l1_invalidations', 'spill_store_bytes', 'spill_load_bytes')


class Instruction(NamedTuple):
    address: int
    opcode: str  # with its modifiers, e.g. 'ATOMG.E.ADD.F32x4.FTZ.RN'
    operands: str
    predicated: bool


class Region(NamedTuple):
    """The instructions of one loop nest: ``loops`` are the indices (in
    address order) of the loops holding them, outermost first."""
    loops: Tuple[int, ...]
    counts: Dict[str, int]
    mma: Dict[str, int]  # multiply-adds per warp, by operand type

    def as_dict(self) -> dict:
        return dict(loops=list(self.loops), counts=self.counts, mma=self.mma)


def parse(text: str) -> List[Instruction]:
    """The instructions of ``cuobjdump -sass`` output (one kernel), up to
    the kernel's final branch to itself."""
    found = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        address, body = int(match.group(1), 16), match.group(2)
        predicated = bool(_PREDICATE.match(body))
        body = _PREDICATE.sub('', body)
        opcode, _, operands = body.partition(' ')
        ins = Instruction(address, opcode, operands.strip(), predicated)
        if _branch_target(ins) == address and not predicated:
            break  # the trap after EXIT
        found.append(ins)
    return found


def _branch_target(ins: Instruction):
    if not ins.opcode.startswith('BRA'):
        return None
    match = _TARGET.search(ins.operands)
    return int(match.group(1), 16) if match else None


def loops(instructions: List[Instruction]) -> List[Tuple[int, int]]:
    """(first, last) address of every loop, in address order (outer before
    inner at the same start)."""
    ends = {}
    for ins in instructions:
        target = _branch_target(ins)
        if target is not None and target <= ins.address:
            ends[target] = max(ends.get(target, target), ins.address)
    return sorted(ends.items(), key=lambda span: (span[0], -span[1]))


def source_lines(text: str) -> Dict[int, Tuple[str, int]]:
    """Address -> (file, line) of each instruction, from the output of
    ``nvdisasm --print-line-info`` (Triton compiles with line info)."""
    found, where = {}, None
    for line in text.splitlines():
        source = _SOURCE.search(line)
        if source:
            where = source.group(1), int(source.group(2))
            continue
        address = _ADDRESS.match(line)
        if address and where is not None:
            found[int(address.group(1), 16)] = where
    return found


def _width(modifiers: List[str]) -> int:
    """Bytes per lane of a memory instruction from its modifiers."""
    for mod in modifiers:
        vector = re.match(r'^[A-Z]*?(\d+)x(\d+)$', mod)
        if vector:
            return int(vector.group(1)) * int(vector.group(2)) // 8
    for mod in modifiers:
        if mod in ('64', '128', 'U64', 'S64', 'F64'):
            return int(mod.lstrip('USF')) // 8
        if mod in ('U16', 'S16', 'F16', 'BF16'):
            return 2
        if mod in ('U8', 'S8'):
            return 1
    return 4


def _mma(opcode: str) -> Tuple[str, int]:
    """(operand type, multiply-adds per warp) of a tensor-core instruction,
    or ('', 0)."""
    parts = opcode.split('.')
    kind = parts[-1]  # the operands' type ends the opcode: HMMA.16816.F32.BF16
    if parts[0] == 'HGMMA':
        m, n, k = map(int, _HGMMA.match(parts[1]).groups())
        return kind, m * n * k // 4  # one warpgroup = 4 warps
    if parts[0] == 'HMMA':
        if parts[1] not in HMMA_SHAPES:
            raise ValueError(f'{opcode}: unknown HMMA shape; add it to '
                             'mmseg_mita.bench.sass.HMMA_SHAPES')
        m, n, k = HMMA_SHAPES[parts[1]]
        return kind, m * n * k
    return '', 0


def _count(ins: Instruction, counts: Counter, mma: Counter) -> None:
    parts = ins.opcode.split('.')
    counts['instructions'] += 1
    kind, fma = _mma(ins.opcode)
    if fma:
        mma[kind] += fma
    if parts[0] in GLOBAL_ATOMICS:
        counts['atomics'] += 1
        counts['atomic_bytes'] += 32 * _width(parts[1:])
    if parts[0] == 'MEMBAR' and set(parts[1:]) & {'GPU', 'SYS', 'GL'}:
        counts['gpu_fences'] += 1
    if parts[0] == 'CCTL' and 'IVALL' in parts:
        counts['l1_invalidations'] += 1
    if parts[0] == 'STL':
        counts['spill_store_bytes'] += _width(parts[1:])
    if parts[0] == 'LDL':
        counts['spill_load_bytes'] += _width(parts[1:])


def profile(text: str) -> List[Region]:
    """The regions of one kernel's SASS: what each loop nest holds."""
    instructions = parse(text)
    spans = loops(instructions)
    counts, mma = {}, {}
    for ins in instructions:
        nest = tuple(i for i, (first, last) in enumerate(spans)
                     if first <= ins.address <= last)
        _count(ins, counts.setdefault(nest, Counter()),
               mma.setdefault(nest, Counter()))
    return [
        Region(nest, {f: counts[nest][f]
                      for f in FIELDS}, dict(mma[nest]))
        for nest in sorted(counts)
    ]


def totals(regions: List[Region]) -> Dict[str, int]:
    """Static totals over every region (each instruction once)."""
    total = Counter()
    for region in regions:
        total.update(region.counts)
    return {f: total[f] for f in FIELDS}
