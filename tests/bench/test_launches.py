"""The launch counter (mmseg_mita.bench.launch_counter) and the
subcommand ``launches`` on small shapes."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mmseg_mita.bench.launch_counter import count_launches

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@torch.library.custom_op('mita_launch_test::twice_plus_one',
                         mutates_args=())
def twice_plus_one(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).add(1)


def _matmul_of_transpose(x):
    y = x * 2  # mul
    z = y.transpose(0, 1).contiguous()  # a view, then clone
    return torch.mm(z, z.t()).sum()  # mm, sum (t: a view)


def test_counts_the_leaf_ops_of_a_known_function_exactly():
    x = torch.randn(4, 3, requires_grad=True)
    counts = count_launches(_matmul_of_transpose, [x], torch.tensor(1.0))
    assert dict(counts['forward'].aten) == {
        'aten::mul': 1, 'aten::clone': 1, 'aten::mm': 1, 'aten::sum': 1}
    # sum's backward is an expand (a view); mm's two mms; the two gradients
    # of z added; transpose's and clone's are views or nothing; mul's mul.
    assert dict(counts['backward'].aten) == {
        'aten::mm': 2, 'aten::add': 1, 'aten::mul': 1}
    for stage in counts.values():
        assert not stage.syncs and not stage.triton
        assert stage.launches == 4


def test_item_is_a_host_sync():
    x = torch.randn(5)
    counts = count_launches(lambda x: x * x.sum().item(), [x])
    assert dict(counts['forward'].syncs) == {'aten::_local_scalar_dense': 1}
    assert dict(counts['forward'].aten) == {'aten::sum': 1, 'aten::mul': 1}
    assert 'backward' not in counts  # nothing requires grad


def test_inner_ops_of_a_custom_op_are_counted():
    counts = count_launches(twice_plus_one, [torch.randn(3)])
    assert dict(counts['forward'].aten) == {'aten::mul': 1, 'aten::add': 1}


@pytest.mark.skipif(importlib.util.find_spec('triton') is None,
                    reason='needs triton')
def test_triton_launches_are_counted_without_the_interpreters_ops():
    # In a fresh interpreter: TRITON_INTERPRET must precede the import.
    script = textwrap.dedent('''
        import os
        os.environ['TRITON_INTERPRET'] = '1'
        import torch
        import triton
        import triton.language as tl
        from mmseg_mita.bench.launch_counter import count_launches

        @triton.jit
        def add_one(X, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(X + offs, tl.load(X + offs, mask=mask) + 1, mask=mask)

        def twice(x):
            y = x * 1
            add_one[(2, )](y, y.numel(), BLOCK=8)
            add_one[(2, )](y, y.numel(), BLOCK=8)
            return y

        counts = count_launches(twice, [torch.zeros(16)])['forward']
        assert torch.equal(twice(torch.zeros(16)), torch.full((16, ), 2.))
        print(dict(counts.aten), dict(counts.triton))
    ''')
    out = subprocess.run([sys.executable, '-c', script], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("{'aten::mul': 1} "
                                  "{'triton::add_one': 2}")


def test_subcommand_counts_the_torch_backend_without_host_sync(tmp_path,
                                                             capsys):
    from mmseg_mita.bench.cli import main
    path = str(tmp_path / 'launches.json')
    assert main(['launches', '--backends', 'torch', '--tokens', '65',
                 '--heads', '2', '--dtype', 'float32', '--json', path]) == 0
    assert '\ntorch   | 65 |' in capsys.readouterr().out
    with open(path) as f:
        (row, ) = json.load(f)['rows']
    assert (row['backend'], row['tokens'], row['hw']) == ('torch', 65,
                                                          [8, 8])
    for stage in ('forward', 'backward'):
        assert row[stage]['host_syncs'] == 0
        assert row[stage]['triton'] == 0
        assert row[stage]['launches'] == row[stage]['aten'] > 10
