"""The rows of scripts/mutation_pass.py follow the code they mutate: each
row's text occurs exactly once in its file (else the pass stops on it), its
mutation changes that text, and every test it names exists."""
import importlib.util
import os.path as osp
import re

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _rows():
    spec = importlib.util.spec_from_file_location(
        'mutation_pass', osp.join(ROOT, 'scripts', 'mutation_pass.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTATIONS


ROWS = _rows()


def test_row_names_are_unique():
    names = [row[0] for row in ROWS]
    assert len(names) == len(set(names)), sorted(
        n for n in set(names) if names.count(n) > 1)


@pytest.mark.parametrize('name,path,old,new,tests', ROWS,
                         ids=[row[0] for row in ROWS])
def test_row_matches_its_file_once(name, path, old, new, tests):
    assert isinstance(path, str) and osp.isfile(osp.join(ROOT, path)), path
    with open(osp.join(ROOT, path)) as f:
        source = f.read()
    assert source.count(old) == 1, f'{old!r} is not in {path} exactly once'
    assert new != old
    assert isinstance(tests, list) and tests
    for test in tests:
        file, _, function = test.partition('::')
        assert osp.isfile(osp.join(ROOT, file)), test
        if function:
            with open(osp.join(ROOT, file)) as f:
                assert re.search(rf'^def {re.escape(function)}\b', f.read(),
                                 re.M), test
