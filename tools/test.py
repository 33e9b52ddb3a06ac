"""Evaluate a checkpoint with mmsegmentation's own ``tools/test.py``.

Every flag of mmseg's tool works (``--work-dir``, ``--out``, ``--show-dir``,
``--tta``, ``--cfg-options``, ``--launcher``); this file only makes sure the
plugin is loaded first.
"""
from mmseg_mita.tools import run_mmseg_tool

if __name__ == '__main__':
    run_mmseg_tool('test.py')
