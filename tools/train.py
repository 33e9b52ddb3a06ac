"""Train a segmentor with mmsegmentation's own ``tools/train.py``.

Every flag of mmseg's tool works (``--work-dir``, ``--resume``, ``--amp``,
``--cfg-options``, ``--launcher``); this file only makes sure the plugin is
loaded first.
"""
from mmseg_mita.tools import run_mmseg_tool

if __name__ == '__main__':
    run_mmseg_tool('train.py')
