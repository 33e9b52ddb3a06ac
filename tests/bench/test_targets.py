"""mmseg_mita.bench.targets on synthetic documents of a GPU suite run:
met, unmet, missing, an incorrect backend left out."""
import json

import pytest

from mmseg_mita.bench.targets import TARGET_KEYS, evaluate, format_targets

JUNIT = '''<testsuites><testsuite>
<testcase name="test_float32[1-torch]"/>
<testcase name="test_float32[1-triton]"><failure message="x"/></testcase>
<testcase name="test_flash[dtype0]"><skipped/></testcase>
</testsuite></testsuites>'''


def _op(n, bh, sdpa_s, **methods):
    """The op-shapes rows of one shape; methods: name -> {mode: seconds or
    a dict of the row's values}."""
    rows = [dict(tokens=n, bh=bh, method='sdpa', mode='eager',
                 best_s=sdpa_s)]
    for name, modes in methods.items():
        for mode, v in modes.items():
            rows.append(dict(v if isinstance(v, dict) else dict(best_s=v),
                             tokens=n, bh=bh, method=name, mode=mode))
    return rows


def _write(path, rows, backends=('torch', 'triton')):
    path.write_text(json.dumps(dict(settings=dict(backends=list(backends)),
                                    rows=rows)))


@pytest.fixture
def run_dir(tmp_path):
    _write(tmp_path / 'op_shapes_cuda_bfloat16.json',
           # met: 2 ms / 1 ms from torch's eager run
           _op(1025, 12, 2e-3, mita_torch=dict(eager=1e-3, cudagraph=dict(
               error='RuntimeError: capture'))) +
           # triton is 100x faster but failed its CUDA test: left out, so
           # the target is missed with torch's 0.5x
           _op(1025, 96, 1e-3, mita_torch=dict(eager=2e-3),
               mita_triton=dict(eager=1e-5)) +
           # the graph run beyond the tolerance does not count
           _op(65537, 1, 9e-3, mita_torch=dict(eager=3e-3, cudagraph=dict(
               best_s=1e-4, rel_err_vs_eager=0.5))))
    # A second op file (the compile run) adds a mode at 4097 x 12.
    _write(tmp_path / 'op_shapes_compile_cuda_bfloat16.json',
           _op(4097, 12, 6e-4, mita_torch=dict(compiled=1e-4)))
    _write(tmp_path / 'throughput_1d_cuda_bfloat16.json', [
        dict(tokens=65536, method='sdpa', m=None, speedup_vs_sdpa=1.0),
        dict(tokens=65536, method='mita_torch', m=49, speedup_vs_sdpa=2.0),
        dict(tokens=65536, method='mita_triton', m=128,
             speedup_vs_sdpa=20.0)])
    enc = [dict(kind='train', tokens=1025, method='sdpa', mode='eager',
                best_s=1.0, peak_bytes=2**20),
           dict(kind='train', tokens=1025, method='mita_torch',
                mode='eager', best_s=0.9, peak_bytes=2**20),
           dict(kind='infer', tokens=8193, method='mita_torch',
                mode='eager', best_s=0.1, peak_bytes=2**20)]
    _write(tmp_path / 'encoder_cuda_bfloat16.json', enc)
    (tmp_path / 'op_tests.xml').write_text(JUNIT)
    return tmp_path


def test_targets_met_unmet_and_missing(run_dir):
    result = evaluate(str(run_dir))
    rows = {r['key']: r for r in result['targets']}
    assert tuple(rows) == TARGET_KEYS
    assert rows['op_fwd_bwd_1025x12']['measured'] == pytest.approx(2.0)
    assert rows['op_fwd_bwd_1025x12']['met'] is True
    assert rows['op_fwd_bwd_1025x96']['measured'] == pytest.approx(0.5)
    assert rows['op_fwd_bwd_1025x96']['met'] is False
    assert rows['op_fwd_bwd_4097x12']['measured'] == pytest.approx(6.0)
    assert 'compiled' in rows['op_fwd_bwd_4097x12']['detail']
    assert rows['op_fwd_bwd_65537x1']['measured'] == pytest.approx(3.0)
    assert rows['throughput_1d_64k']['measured'] == pytest.approx(20.0)
    assert rows['throughput_1d_64k']['met'] is True
    assert rows['encoder_train_1025']['measured'] == pytest.approx(0.9)
    assert rows['encoder_train_1025']['met'] is True
    for key in ('throughput_1d_256k', 'encoder_train_4097',
                'encoder_infer_8193'):  # the last has MiTA but no SDPA
        assert rows[key]['measured'] is None and rows[key]['met'] is False
        assert rows[key]['why']
    auto = rows['auto_backend']
    assert auto['met'] is None
    assert auto['correct'] == dict(torch=True, triton=False)
    assert auto['measured']['1025x96']['backend'] == 'torch'
    assert (result['met'], result['scored']) == (4, 9)


def test_an_empty_run_lists_every_target_unmeasured(tmp_path):
    result = evaluate(str(tmp_path))
    assert [r['key'] for r in result['targets']] == list(TARGET_KEYS)
    for r in result['targets']:
        assert r['measured'] is None and r['met'] in (False, None)
        assert r['why']
    table = format_targets(result)
    assert '0 of 9 targets met' in table and 'no op_shapes' in table
