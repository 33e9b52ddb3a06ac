"""``python -m mmseg_mita.bench``: the subcommand table, the common
options, the record format and the table and plot writers."""
import importlib.metadata
import json
import subprocess
import sys

import pytest

from mmseg_mita.bench import cli
from mmseg_mita.bench.record import document, finish
from mmseg_mita.bench.report import (Column, Curve, Panel, format_table,
                                     plot_panels, significant)

SUBCOMMANDS = ('op', 'op-shapes', 'encoder', 'segmentor', 'scaling', 'onnx',
               'throughput-1d', 'launches', 'kernels', 'gpu')


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', code], text=True,
                          capture_output=True, timeout=300)


def test_help_lists_every_subcommand_without_importing_mmseg():
    proc = _python(
        'import sys\n'
        'from mmseg_mita.bench.cli import main\n'
        'for argv in (["--help"], ["op", "--help"]):\n'
        '    try:\n'
        '        main(argv)\n'
        '    except SystemExit as e:\n'
        '        print("EXIT", e.code)\n'
        'print(sorted(m for m in ("mmseg", "mmengine", "mmcv", "triton")\n'
        '             if m in sys.modules))')
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert out.count('EXIT 0') == 2 and out.strip().endswith('[]')
    listing = out.split('subcommands:')[1]
    for name in SUBCOMMANDS:
        assert f'\n  {name} ' in listing
    assert '--tokens' in out and '--time-budget' in out  # op's own help


def test_the_entry_point_runs_as_a_module():
    proc = subprocess.run([sys.executable, '-m', 'mmseg_mita.bench', 'nope'],
                          text=True, capture_output=True, timeout=300)
    assert proc.returncode == 2 and "invalid choice: 'nope'" in proc.stderr


def test_each_summary_is_its_modules_first_docstring_paragraph():
    import importlib
    for name in SUBCOMMANDS:
        module = importlib.import_module(
            f'mmseg_mita.bench.{cli.SUBCOMMANDS[name]}')
        first = module.__doc__.split('\n\n')[0]
        assert cli.summary(name) == ' '.join(first.split())
        assert callable(module.add_arguments) and callable(module.run)


def test_a_subcommand_without_its_module_says_so(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUBCOMMANDS, 'ghost', 'no_such_module')
    assert 'not in this installation' in cli.summary('ghost')
    with pytest.raises(SystemExit, match='no_such_module.py'):
        cli.main(['ghost'])


def test_only_the_declared_common_options_are_taken(capsys):
    # launches times nothing: no --repeats; gpu runs the others: no --device
    for argv in (['launches', '--repeats', '3'], ['gpu', 'x', '--device',
                                                  'cpu']):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2
        assert 'unrecognized arguments' in capsys.readouterr().err


def test_usage_errors_are_reported_like_argparse_errors(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(['op', '--tokens', '30', '--pool-size', '2'])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert 'python -m mmseg_mita.bench op: error: --tokens 30' in err
    assert 'smaller than --pool-size 2' in err


def test_document_holds_machine_versions_settings_rows(tmp_path, capsys):
    import argparse

    import torch
    args = argparse.Namespace(command='op', tokens=[17], json=str(
        tmp_path / 'r.json'), markdown=str(tmp_path / 'r.md'), fn=print)
    doc = document(args, torch.device('cpu'))
    doc['rows'].append(dict(a=1.5, b='x'))
    columns = [Column('A', 'a', '{:.1f}'), Column('B', 'b', left=True)]
    finish(doc, args, lambda d, md: format_table(d['rows'], columns, md))
    saved = json.loads((tmp_path / 'r.json').read_text())
    assert set(saved) == {'command', 'machine', 'versions', 'settings',
                          'rows'}
    assert saved['command'] == 'op' and saved['rows'] == [dict(a=1.5,
                                                               b='x')]
    assert {'cpu', 'cores', 'load_average', 'torch_threads'} <= set(
        saved['machine'])
    assert saved['versions']['torch'] == importlib.metadata.version('torch')
    assert saved['versions']['python'] and 'mmsegmentation' in saved[
        'versions']
    assert saved['settings']['tokens'] == [17] and 'argv' in saved[
        'settings']
    assert 'fn' not in saved['settings']  # not JSON: left out
    assert (tmp_path / 'r.md').read_text() == '| A | B |\n|---:|---|\n' \
        '| 1.5 | x |\n'
    assert capsys.readouterr().out == '  A | B\n1.5 | x\n'


def test_table_cells_formats_and_notes():
    rows = [dict(n=1025, s=0.5), dict(n=17)]
    columns = [Column('N', 'n'), Column('ms', 's', lambda v: f'{v * 1e3:g}'),
               Column('twice', lambda r: 2 * r['n'])]
    assert format_table(rows, columns, notes=['a note']).splitlines() == [
        '   N |  ms | twice', '1025 | 500 |  2050', '  17 |   - |    34',
        'a note']
    assert format_table(rows, columns, True, notes=['a note']).splitlines(
    )[-2:] == ['', 'a note']


def test_rates_keep_three_significant_digits():
    column = significant('fps', 'fps')
    cells = [column.cell(dict(fps=v))
             for v in (0.015349, 0.8912, 1.7, 12.345, 99.96, 999.6, 1234.4, 0.0)]
    assert cells == ['0.0153', '0.891', '1.70', '12.3', '100', '1000', '1234', '0.00']


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / 'p.png'
    plot_panels(str(path), [
        Panel('t', 'x', 'y', [Curve('a', [1, 10], [2, 20])]),
        Panel('u', 'x', 'y', [], log=False)], columns=2, title='T')
    assert path.read_bytes()[:4] == b'\x89PNG'
