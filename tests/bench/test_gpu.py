"""tools/gpu_check.sh (``python -m mmseg_mita.bench gpu``) in its CPU smoke
mode (GPU_CHECK_CPU_SMOKE=1: tiny sizes, the torch backend): every part
runs and passes, and targets.json lists every target (unmeasured ones null
and unmet, with a reason: the smoke sizes are not the targets' sizes).
Slow (a minute or more: each part starts its own Python)."""
import json
import os
import subprocess
import sys

from mmseg_mita.bench.targets import TARGET_KEYS

PARTS = ('environment', 'op_tests', 'op_shapes', 'encoder', 'attention',
         'throughput_1d', 'graph_tests', 'op_shapes_compile',
         'encoder_compiled')


def test_gpu_check_cpu_smoke_writes_every_part_and_targets(tmp_path,
                                                           repo_root):
    out = tmp_path / 'gc'
    env = dict(os.environ, GPU_CHECK_CPU_SMOKE='1', PYTHON=sys.executable)
    proc = subprocess.run(['bash', 'tools/gpu_check.sh', str(out)],
                          cwd=repo_root, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split('\t') for line in
            (out / 'summary.tsv').read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == list(PARTS)
    assert {r[1] for r in rows} == {'pass'}
    for name in ('op_shapes_cpu_float32', 'op_shapes_compile_cpu_float32',
                 'encoder_cpu_float32', 'encoder_compiled_cpu_float32',
                 'throughput_1d_cpu_float32', 'attention_cpu_float32'):
        doc = json.loads((out / f'{name}.json').read_text())
        assert doc['rows'] and doc['machine'] and doc['versions']
    environment = json.loads((out / 'environment.json').read_text())
    assert 'torch' in environment['backends']
    targets = json.loads((out / 'targets.json').read_text())
    assert [r['key'] for r in targets['targets']] == list(TARGET_KEYS)
    for r in targets['targets']:
        assert {'measured', 'met', 'target', 'baseline'} <= set(r)
        assert r['measured'] is not None or r['why']
    summary = (out / 'summary.txt').read_text()
    assert '== targets' in summary and summary.strip() in proc.stdout


def test_gpu_check_without_time_records_skipped_parts(tmp_path, repo_root):
    out = tmp_path / 'gc'
    env = dict(os.environ, GPU_CHECK_CPU_SMOKE='1', PYTHON=sys.executable,
               GPU_CHECK_SECONDS='18')
    proc = subprocess.run(['bash', 'tools/gpu_check.sh', str(out)],
                          cwd=repo_root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1
    rows = [line.split('\t') for line in
            (out / 'summary.tsv').read_text().splitlines()[1:]]
    assert rows[0][:2] == ['environment', 'pass']
    assert {r[1] for r in rows[1:]} <= {'skipped (no time left)', 'pass',
                                        'timeout'}
    assert rows[-1][1] == 'skipped (no time left)'
    assert (out / 'targets.json').is_file() and (out / 'summary.txt').is_file()
