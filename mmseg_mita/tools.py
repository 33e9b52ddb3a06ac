"""Run mmsegmentation's own entry points (shipped in ``mmseg/.mim/tools``)
with the plugin loaded.

From any directory, with the package installed::

    python -m mmseg_mita.tools train CONFIG [train.py options]
    python -m mmseg_mita.tools test CONFIG CHECKPOINT [test.py options]

CONFIG is a config file or the name of a packaged config
(:func:`mmseg_mita.list_configs`).
"""
import os.path as osp
import runpy
import sys
from typing import List, Optional

from .config_files import config_path

TOOLS = ('train', 'test')


def mmseg_tool_path(name: str) -> str:
    """Path of one of mmseg's tools, e.g. ``'train.py'``."""
    import mmseg
    path = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', name)
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'mmsegmentation has no tools/{name} at {path}; reinstall '
            'mmsegmentation==1.2.2 from its wheel (`bash scripts/setup.sh`)')
    return path


def resolve_config(arg: str) -> str:
    """``arg`` if it is a file or a path, else the packaged config of that
    name (:func:`mmseg_mita.config_path`)."""
    if osp.isfile(arg) or osp.dirname(arg):
        return arg
    return config_path(arg)


def run_mmseg_tool(name: str, argv: Optional[List[str]] = None) -> None:
    """Run mmseg's ``tools/<name>`` as ``__main__`` with ``argv``, whose
    first item, the config, may be a packaged config's name."""
    import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
    path = mmseg_tool_path(name)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith('-'):
        argv[0] = resolve_config(argv[0])
    sys.argv = [path] + argv
    runpy.run_path(path, run_name='__main__')


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m mmseg_mita.tools {train,test} CONFIG ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in TOOLS:
        sys.exit(f'usage: python -m mmseg_mita.tools {{{",".join(TOOLS)}}} '
                 'CONFIG [options of mmseg\'s tools/train.py or test.py]\n'
                 'CONFIG: a config file or a packaged config\'s name '
                 '(mmseg_mita.list_configs())')
    run_mmseg_tool(argv[0] + '.py', argv[1:])


if __name__ == '__main__':
    main()
