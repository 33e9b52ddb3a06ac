"""Run mmsegmentation's own entry points (shipped in ``mmseg/.mim/tools``)
with the plugin loaded."""
import os.path as osp
import runpy
import sys
from typing import List, Optional


def mmseg_tool_path(name: str) -> str:
    """Path of one of mmseg's tools, e.g. ``'train.py'``."""
    import mmseg
    path = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', name)
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'mmsegmentation has no tools/{name} at {path}; reinstall '
            'mmsegmentation==1.2.2 from its wheel (`bash scripts/setup.sh`)')
    return path


def run_mmseg_tool(name: str, argv: Optional[List[str]] = None) -> None:
    """Run mmseg's ``tools/<name>`` as ``__main__`` with ``argv``."""
    import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
    path = mmseg_tool_path(name)
    sys.argv = [path] + list(sys.argv[1:] if argv is None else argv)
    runpy.run_path(path, run_name='__main__')
