"""The configs shipped with the package, found by name.

The repository's ``configs/`` tree is package data, installed as
``mmseg_mita/.mim/configs`` (where OpenMMLab's tools look for a package's
configs; in a checkout that folder is a link to ``configs/``). The leaf
configs (``configs/mita_vit/*.py``) are named by their file name; their
``_base_`` files resolve relative to them and to the installed mmseg
(``mmseg::``), so a packaged config loads from any working directory.
"""
import difflib
import os
import os.path as osp
from typing import List

CONFIG_DIR = osp.join(osp.dirname(osp.abspath(__file__)), '.mim', 'configs')
LEAF_DIR = osp.join(CONFIG_DIR, 'mita_vit')


def list_configs() -> List[str]:
    """The names :func:`config_path` takes, sorted."""
    if not osp.isdir(LEAF_DIR):
        raise FileNotFoundError(
            f'the packaged configs are missing ({LEAF_DIR}); reinstall '
            'mmseg_mita (in a checkout, mmseg_mita/.mim/configs is a link '
            'to ../../configs)')
    return sorted(f[:-3] for f in os.listdir(LEAF_DIR) if f.endswith('.py'))


def config_path(name: str) -> str:
    """Absolute path of the packaged config ``name``: its file name, with
    or without ``.py``, e.g.
    ``config_path('mita-vit-s16_upernet_8xb2-160k_ade20k-512x512')``."""
    if not isinstance(name, str):
        raise ValueError(
            f'name must be a config name (str), got {type(name).__name__}; '
            'mmseg_mita.list_configs() lists them')
    stem = name[:-3] if name.endswith('.py') else name
    names = list_configs()
    if stem not in names:
        near = difflib.get_close_matches(stem, names, n=5, cutoff=0.6)
        near += [n for n in names if stem and stem in n and n not in near]
        near = near[:8]
        hint = ('near matches: ' + ', '.join(near) if near else
                f'mmseg_mita.list_configs() lists all {len(names)}')
        raise ValueError(f'name={name!r} is no packaged config; {hint}')
    return osp.join(LEAF_DIR, stem + '.py')
