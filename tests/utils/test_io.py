import os

import pytest

from mmseg_mita.utils import write_atomic


def test_write_atomic_replaces_whole_file(tmp_path):
    path = tmp_path / 'sub' / 'out.json'
    write_atomic(str(path), lambda tmp: open(tmp, 'w').write('new'))
    assert path.read_text() == 'new'
    assert os.listdir(path.parent) == ['out.json']


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / 'out.json'
    path.write_text('old')

    def fail(tmp):
        open(tmp, 'w').write('half')
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of a write

    with pytest.raises(KeyboardInterrupt):
        write_atomic(str(path), fail)
    assert path.read_text() == 'old'
    assert os.listdir(tmp_path) == ['out.json']


def test_write_json_to_file_and_stdout(tmp_path, capsys):
    import json

    from mmseg_mita.utils import write_json
    path = tmp_path / 'r.json'
    write_json({'a': [1, 2]}, str(path))
    assert json.loads(path.read_text()) == {'a': [1, 2]}
    write_json({'b': 1}, '-')
    assert json.loads(capsys.readouterr().out) == {'b': 1}
