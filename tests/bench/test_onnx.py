"""The subcommand ``onnx``: ONNX Runtime against PyTorch, one tiny run."""
import json

import pytest

MISSING = 'the deploy extra is not installed: pip install -e .[deploy]'
pytest.importorskip('onnxruntime', reason=MISSING)
pytest.importorskip('onnx', reason=MISSING)
from mmseg_mita import config_path  # noqa: E402
from mmseg_mita.bench.cli import main  # noqa: E402

# a packaged config's name and a config file
DEMO = 'mita-vit-mini8_upernet_1xb8-1k_demo-96x96'
DEMO_FULL = config_path('vit-mini8_upernet_1xb8-1k_demo-96x96')


def test_onnx_runtime_against_pytorch(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # configs found outside a checkout
    path = tmp_path / 'o.json'
    assert main(['onnx', '--configs', DEMO, DEMO_FULL, '--size', '64x64',
                 '--repeats', '1', '--threads', '1', '--json',
                 str(path)]) == 0
    rows = json.loads(path.read_text())['rows']
    assert [(r['config'], r['runtime']) for r in rows] == [
        (c, r) for c in (DEMO, DEMO_FULL) for r in ('pytorch', 'onnxruntime')]
    best = {(r['config'], r['runtime']): r['best_s'] for r in rows}
    for r in rows:
        assert r['max_abs_logit_diff'] < 1e-3
        assert r['ort_vs_torch'] == pytest.approx(
            best[(r['config'], 'onnxruntime')] /
            best[(r['config'], 'pytorch')])
        assert r['vs_baseline'] == pytest.approx(
            best[(r['config'], r['runtime'])] /
            best[(DEMO_FULL, r['runtime'])])
    assert 'ORT / PyTorch' in capsys.readouterr().out
