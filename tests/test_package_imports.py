"""What importing the package, its operator and its mmseg plugin loads,
registers and changes."""
import subprocess
import sys

import pytest

STACK = ('mmseg', 'mmengine', 'mmcv')
# mmengine's local-file checkpoint loader and torch's safe globals, printed
# after `import mmengine.runner`
STATE = ('import mmengine.runner, torch\n'
         'from mmengine.runner.checkpoint import CheckpointLoader\n'
         'loader = CheckpointLoader._schemes[""]\n'
         'print(loader.__module__, loader.__name__, sorted(\n'
         '    f"{g.__module__}.{g.__qualname__}"\n'
         '    for g in torch.serialization.get_safe_globals()))\n')
# The GPU suite's subcommands run where only torch, triton, numpy and
# pytest are; their modules must not even need triton.
BENCH = ', '.join(
    f'mmseg_mita.bench.{m}'
    for m in ('cli', 'measure', 'record', 'report', 'workloads', 'graphs',
              'launch_counter', 'models', 'targets', 'op', 'op_shapes',
              'encoder', 'throughput_1d', 'launches', 'gpu', '__main__'))


def _python(code: str, lines: int = 1) -> str:
    proc = subprocess.run([sys.executable, '-c', code],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return '\n'.join(proc.stdout.strip().splitlines()[-lines:])


def test_operator_imports_with_torch_alone():
    loaded = _python(
        'import sys\n'
        'import mmseg_mita, mmseg_mita.ops, mmseg_mita.bench, '
        'mmseg_mita.utils, mmseg_mita.safe_load\n'
        f'import {BENCH}\n'
        'print(sorted({m.split(".")[0] for m in sys.modules} & '
        f'{set(STACK + ("triton",))}))')
    assert loaded == '[]'


@pytest.fixture(scope='module')
def untouched():
    """The STATE printed without the plugin."""
    return _python(STATE)


def test_operator_import_leaves_the_stack_untouched(untouched):
    assert untouched.startswith('mmengine.runner.checkpoint load_from_local')
    meta_path = 'import sys\nfinders = list(sys.meta_path)\n'
    after = _python(
        meta_path + 'import mmseg_mita, mmseg_mita.ops, '
        'mmseg_mita.bench, mmseg_mita.utils, mmseg_mita.safe_load\n'
        'assert sys.meta_path == finders, sys.meta_path\n'
        'import mmseg\nfrom mmseg.registry import MODELS\n'
        'assert MODELS.get("MiTAViT") is None\n' + STATE)
    assert after == untouched


@pytest.mark.parametrize('order', ['plugin first', 'mmseg first'])
def test_plugin_registers_models_and_workarounds(order, untouched):
    imports = ['import mmseg_mita.mmseg_plugin', 'import mmseg']
    if order == 'mmseg first':
        imports.reverse()
    registered = _python(
        '\n'.join(imports) + '\n'
        'from mmseg.registry import MODELS, TRANSFORMS\n'
        'print(MODELS.get("MiTAViT") is not None, '
        'MODELS.get("CBTHead") is not None, '
        'TRANSFORMS.get("CheckSegMap") is not None)\n' + STATE, lines=2)
    assert registered == 'True True True\n' + untouched.replace(
        'mmengine.runner.checkpoint load_from_local',
        'mmseg_mita.checkpoint_schemes load_from_local')
