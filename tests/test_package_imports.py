"""What importing the package and its operator loads and registers."""
import subprocess
import sys

import pytest

STACK = ('mmseg', 'mmengine', 'mmcv')
# The GPU check's tools run where only torch, triton, numpy and pytest are;
# the benchmark modules must not even need triton.
BENCHMARKS = ('mmseg_mita.benchmarks.encoder, mmseg_mita.benchmarks.graphs, '
              'mmseg_mita.benchmarks.targets')


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, '-c', code],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_operator_imports_with_torch_alone():
    loaded = _python(
        'import sys\n'
        'import mmseg_mita.ops, mmseg_mita.benchmarks, mmseg_mita.utils\n'
        f'import {BENCHMARKS}\n'
        'print(sorted({m.split(".")[0] for m in sys.modules} & '
        f'{set(STACK + ("triton",))}))')
    assert loaded == '[]'


@pytest.mark.parametrize('order', ['plugin first', 'mmseg first'])
def test_package_registers_models_and_workarounds(order):
    imports = ['import mmseg_mita', 'import mmseg']
    if order == 'mmseg first':
        imports.reverse()
    registered = _python(
        '\n'.join(imports) + '\n'
        'from mmseg.registry import MODELS, TRANSFORMS\n'
        'from mmengine.runner.checkpoint import CheckpointLoader\n'
        'loader = CheckpointLoader._schemes[""]\n'
        'print(MODELS.get("MiTAViT") is not None, '
        'MODELS.get("CBTHead") is not None, '
        'TRANSFORMS.get("CheckSegMap") is not None, '
        'getattr(loader, "__module__", "") == "mmseg_mita.compat")')
    assert registered == 'True True True True'
