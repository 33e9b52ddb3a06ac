"""Atomic writes for every file a tool produces."""
import json
import os
import os.path as osp
import tempfile
from typing import Callable


def write_atomic(path: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it to
    ``path``: readers never see a partial file, and an interrupted or failed
    write leaves none behind."""
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.tmp-', suffix=osp.splitext(path)[1],
                               dir=folder)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private (0600)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(obj, path: str, indent: int = 1) -> None:
    """``obj`` as JSON to ``path`` (atomically), or to stdout for ``'-'``."""
    text = json.dumps(obj, indent=indent)
    if path == '-':
        print(text)
        return

    def write(tmp):
        with open(tmp, 'w') as f:
            f.write(text + '\n')

    write_atomic(path, write)
