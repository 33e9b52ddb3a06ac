"""The static SASS counts of ``mmseg_mita.bench.sass`` on a hand-written
kernel listing in ``cuobjdump -sass`` format."""
import pytest

from mmseg_mita.bench import sass


def _line(address: int, text: str) -> str:
    return (f'        /*{address:04x}*/                   {text} ;'
            '                   /* 0x000fe20000000f00 */\n'
            '                                                     '
            '/* 0x000fe20000000f00 */')


LISTING = '\n'.join([
    '\tcode for sm_90a',
    '\t\tFunction : kernel',
    _line(0x00, 'S2R R0, SR_CTAID.X'),
    _line(0x10, 'STL.64 [R1], R2'),  # spill: 8 bytes
    # loop 0: 0x20 .. 0x80
    _line(0x20, 'HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT'),
    _line(0x30, 'MEMBAR.ALL.GPU'),
    _line(0x40, 'ATOMG.E.ADD.F32x4.FTZ.RN.STRONG.GPU PT, RZ, [R2.64], R4'),
    _line(0x50, 'CCTL.IVALL'),
    # loop 1, nested: 0x60 .. 0x70
    _line(0x60, 'LDL.LU R5, [R1]'),  # 4 bytes
    _line(0x70, '@!P1 BRA 0x60'),
    _line(0x80, '@P0 BRA 0x20'),
    _line(0x90, 'MEMBAR.ALL.CTA'),  # CTA scope: not a GPU fence
    _line(0xa0, 'RED.E.ADD.F32.FTZ.RN.STRONG.GPU [R2.64], R4'),
    _line(0xb0, 'HMMA.16816.F32.BF16 R8, R12, R16, R8'),
    _line(0xb8, 'REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU [R2.64], R4'),  # sm_90
    _line(0xbc, 'REDUX.SUM.S32 UR4, R5'),  # a warp's sum: no atomic
    _line(0xc0, 'EXIT'),
    _line(0xd0, 'BRA 0xd0'),  # the trap after EXIT: not code
    _line(0xe0, 'NOP'),
])


def test_regions_count_each_loop_nest():
    regions = {r.loops: r for r in sass.profile(LISTING)}
    assert sorted(regions) == [(), (0, ), (0, 1)]
    top, outer, inner = regions[()], regions[(0, )], regions[(0, 1)]
    assert top.counts['instructions'] == 8  # the trap and NOP left out
    assert outer.counts['instructions'] == 5
    assert inner.counts['instructions'] == 2
    assert outer.counts['gpu_fences'] == 1 and top.counts['gpu_fences'] == 0
    assert outer.counts['l1_invalidations'] == 1
    assert outer.counts['atomics'] == 1 and top.counts['atomics'] == 2
    assert outer.counts['atomic_bytes'] == 32 * 16  # F32x4 per lane
    assert top.counts['atomic_bytes'] == 32 * (4 + 16)
    assert top.counts['spill_store_bytes'] == 8
    assert inner.counts['spill_load_bytes'] == 4
    assert outer.mma == {'BF16': 64 * 64 * 16 // 4}  # a warpgroup's
    assert top.mma == {'BF16': 16 * 8 * 16}  # one warp's
    assert sass.totals(list(regions.values()))['instructions'] == 15


def test_unknown_mma_shape_is_refused():
    with pytest.raises(ValueError, match='HMMA_SHAPES'):
        sass.profile(_line(0, 'HMMA.161616.F32.BF16 R8, R12, R16, R8'))


def test_source_lines_of_an_nvdisasm_listing():
    listing = '\n'.join([
        '\t//## File "/x/kernel.py", line 12',
        '        /*0000*/                   LDC R1, c[0x0][0x28] ;',
        '        /*0010*/                   S2R R0, SR_CTAID.Y ;',
        '\t//## File "/x/kernel.py", line 15',
        '        /*0020*/               @P0 BRA `(.L_x_0) ;',
    ])
    assert sass.source_lines(listing) == {
        0x00: ('/x/kernel.py', 12),
        0x10: ('/x/kernel.py', 12),
        0x20: ('/x/kernel.py', 15)
    }
