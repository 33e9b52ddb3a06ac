"""mmengine's checkpoint schemes, each read by the plugin's safe loader.

mmengine's ``CheckpointLoader`` picks a loader by the start of the path:
local files (prefix ``''``), ``http://`` and ``https://``, ``pavi://``,
``s3://`` and ``petrel://`` (with an optional ``backend:`` before them),
``modelzoo://`` and ``torchvision://``, ``open-mmlab://`` and
``openmmlab://``, ``mmcls://``. Each of mmengine's loaders unpickles with
full ``torch.load`` (the ``http`` one through torch hub's
``load_state_dict_from_url``, which passes ``weights_only=False``), so a
file from a URL that ``init_cfg=dict(type='Pretrained', checkpoint=URL)``,
``load_from=URL`` or ``pretrained=URL`` names could run code.

:func:`register` replaces each of them by a loader of :data:`SCHEMES`
that fetches the file as mmengine does (the same download cache: torch
hub's ``checkpoints`` folder, a file downloaded once; mmengine's file
backends; the same model-zoo tables) and reads it with
:func:`mmseg_mita.safe_load.load_checkpoint`. :func:`covered_only` makes
``CheckpointLoader.load_checkpoint`` refuse a path whose scheme is served by
anything else, such as a scheme another package registers after the
plugin (``MMSEG_MITA_UNSAFE_LOAD=1`` lets it through);
:func:`uncovered_schemes` lists those.
"""
import logging
import os
import os.path as osp
import re
import tempfile
from typing import Any, Callable, Dict, Optional
from urllib.parse import urlparse

import torch
from mmengine.dist import get_dist_info
from mmengine.fileio import get_file_backend
from mmengine.logging import print_log
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

from mmseg_mita.safe_load import load_checkpoint, unsafe_load_allowed
from mmseg_mita.safe_load.errors import refused


def load_from_local(filename: str, map_location: Any = None,
                    name: Optional[str] = None) -> Any:
    """A local file (``.npz`` files are refused with the command that
    converts them); ``name``: what messages call it."""
    return load_checkpoint(osp.expanduser(filename), map_location, npz=False,
                           name=name)


def download(url: str, model_dir: Optional[str] = None,
             progress: bool = True) -> str:
    """The path of ``url``'s file in the download cache mmengine's
    ``load_url`` uses (``model_dir``, by default torch hub's
    ``checkpoints`` folder; the file named as the URL's path ends),
    downloaded first if it is not there."""
    model_dir = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints')
    file_name = osp.basename(urlparse(url).path)
    if file_name in ('', '.', '..'):
        raise ValueError(f'checkpoint URL {url} names no file: its path '
                         'must end in the file name (e.g. .../vit.pth)')
    os.makedirs(model_dir, exist_ok=True)
    cached = osp.join(model_dir, file_name)
    if not osp.exists(cached):
        torch.hub.download_url_to_file(url, cached, progress=progress)
    return cached


def load_from_http(filename: str, map_location: Any = None,
                   model_dir: Optional[str] = None,
                   progress: bool = os.isatty(0)) -> Any:
    """An ``http://`` or ``https://`` URL (in a distributed run, rank 0
    downloads it first, as in mmengine)."""
    rank, world_size = get_dist_info()
    if rank == 0:
        cached = download(filename, model_dir, progress)
    if world_size > 1:
        torch.distributed.barrier()
        cached = download(filename, model_dir, progress)  # cached now
    return load_from_local(cached, map_location,
                           name=f'{filename} (downloaded to {cached})')


def load_from_pavi(filename: str, map_location: Any = None) -> Any:
    """``pavi://PATH``: a model of pavi's model cloud."""
    try:
        from pavi import modelcloud
    except ImportError:
        raise ImportError(
            'Please install pavi to load checkpoint from modelcloud.')
    model = modelcloud.get(filename[len('pavi://'):])
    with tempfile.TemporaryDirectory() as folder:
        path = osp.join(folder, 'checkpoint')  # not the cloud's file name
        model.download(path)
        return load_from_local(path, map_location, name=filename)


def load_from_ceph(filename: str, map_location: Any = None,
                   backend: str = 'petrel') -> Any:
    """``s3://`` and ``petrel://`` paths, through mmengine's file backend
    ``backend``."""
    data = get_file_backend(filename, backend_args={
        'backend': backend
    }).get(filename)
    with tempfile.TemporaryDirectory() as folder:
        path = osp.join(folder, 'checkpoint')
        with open(path, 'wb') as f:
            f.write(data)
        return load_from_local(path, map_location, name=filename)


def load_from_torchvision(filename: str, map_location: Any = None) -> Any:
    """``torchvision://NAME`` (``modelzoo://NAME``, deprecated): the URL
    torchvision's model table gives ``NAME``."""
    if filename.startswith('modelzoo://'):
        print_log(
            'The URL scheme of "modelzoo://" is deprecated, please '
            'use "torchvision://" instead',
            logger='current',
            level=logging.WARNING)
    name = filename.split('://', 1)[1]
    url = mmengine_checkpoint.get_torchvision_models()[name]
    return load_from_http(url, map_location=map_location)


def load_from_openmmlab(filename: str, map_location: Any = None) -> Any:
    """``open-mmlab://NAME`` or ``openmmlab://NAME``: a URL, or a file in
    mmengine's home folder, as mmengine's tables of OpenMMLab models give
    ``NAME`` (deprecated names renamed)."""
    prefix, name = filename.split('://', 1)
    deprecated = mmengine_checkpoint.get_deprecated_model_names()
    if name in deprecated:
        print_log(
            f'{prefix}://{name} is deprecated in favor of '
            f'{prefix}://{deprecated[name]}',
            logger='current',
            level=logging.WARNING)
        name = deprecated[name]
    url = mmengine_checkpoint.get_external_models()[name]
    if url.startswith(('http://', 'https://')):
        return load_from_http(url, map_location=map_location)
    path = osp.join(mmengine_checkpoint._get_mmengine_home(), url)
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path} can not be found.')
    return load_from_local(path, map_location)


def load_from_mmcls(filename: str, map_location: Any = None) -> Any:
    """``mmcls://NAME``: an MMClassification model, its keys renamed as
    mmengine does."""
    url = mmengine_checkpoint.get_mmcls_models()[filename[len('mmcls://'):]]
    return mmengine_checkpoint._process_mmcls_checkpoint(
        load_from_http(url, map_location=map_location))


# mmengine's prefixes (as it registers them) -> the loader that replaces
# its own. Its loaders' names start with 'load_from_', as mmengine's do
# (CheckpointLoader logs the rest).
SCHEMES: Dict[tuple, Callable] = {
    ('', ): load_from_local,
    ('http://', 'https://'): load_from_http,
    ('pavi://', ): load_from_pavi,
    (r'(\S+\:)?s3://', r'(\S+\:)?petrel://'): load_from_ceph,
    ('modelzoo://', 'torchvision://'): load_from_torchvision,
    ('open-mmlab://', 'openmmlab://'): load_from_openmmlab,
    ('mmcls://', ): load_from_mmcls,
}
COVERED = frozenset(SCHEMES.values())


def register() -> None:
    """Each of mmengine's schemes read by its loader of :data:`SCHEMES`."""
    for prefixes, loader in SCHEMES.items():
        CheckpointLoader.register_scheme(list(prefixes), loader, force=True)


def uncovered_schemes() -> Dict[str, str]:
    """``{prefix: loader}`` of the schemes registered in mmengine's
    ``CheckpointLoader`` that the plugin does not read (none after
    :func:`register`, unless a package registered one later)."""
    return {
        prefix: f'{loader.__module__}.{loader.__qualname__}'
        for prefix, loader in CheckpointLoader._schemes.items()
        if loader not in COVERED
    }


def covered_only(load: Callable) -> Callable:
    """``CheckpointLoader.load_checkpoint`` refusing a path that no loader
    of :data:`SCHEMES` reads, unless ``MMSEG_MITA_UNSAFE_LOAD=1``."""

    def wrapper(filename, map_location=None, logger='current'):
        loader = CheckpointLoader._get_checkpoint_loader(filename)
        if loader not in COVERED and not unsafe_load_allowed():
            prefix = next(p for p in CheckpointLoader._schemes
                          if re.match(p, filename))
            raise refused(
                filename,
                f'its scheme {prefix!r} is read by '
                f'{loader.__module__}.{loader.__qualname__}, registered in '
                "mmengine's CheckpointLoader after mmseg_mita.mmseg_plugin "
                "(mmseg_mita's loader reads the schemes of mmengine only: "
                'mmseg_mita.checkpoint_schemes)')
        return load(filename, map_location, logger)

    return wrapper
