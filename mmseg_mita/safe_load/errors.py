"""The two ways a checkpoint file is turned down, and their messages."""
import os
import reprlib

UNSAFE_ENV = 'MMSEG_MITA_UNSAFE_LOAD'


class Refused(Exception):
    """Raised where a check fails, with what the file does; the loader adds
    the file (:class:`UnsafeCheckpointError`)."""


class Damaged(Exception):
    """Raised where the file cannot be read as a checkpoint (truncated,
    corrupt, another kind of file), with the cause; the loader adds the file
    (:class:`CorruptCheckpointError`)."""


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds something the loader does not admit; nothing of it
    was run."""


class CorruptCheckpointError(ValueError):
    """A file is damaged, truncated or no checkpoint at all."""


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother = 3, 60, 60


def brief(value) -> str:
    """``repr(value)``, short whatever the value (depth, size) of a file's
    content."""
    return _BRIEF.repr(value)


def unsafe_load_allowed() -> bool:
    """The user opted in to full unpickling (``MMSEG_MITA_UNSAFE_LOAD=1``)."""
    return os.environ.get(UNSAFE_ENV) == '1'


def refused(path: str, reason: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f'refused to load checkpoint {path}: {reason}. Nothing of the file '
        'was run. The loader of mmseg_mita admits tensors, plain containers '
        'and what mmengine, timm, DeiT, mmpretrain and mmseg checkpoints '
        f'hold (mmseg_mita/safe_load). If you trust {path}, set the '
        f'environment variable {UNSAFE_ENV}=1 to load it with full '
        f'unpickling (e.g. `{UNSAFE_ENV}=1 python tools/test.py ...`), or '
        'load it once where you trust it and save its tensors alone '
        "(`torch.save({'state_dict': ...})` or safetensors).")


def damaged(path: str, size: int, cause: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f'checkpoint {path} ({size} bytes) is corrupt or '
        f'truncated ({cause}), e.g. by an interrupted download, copy or '
        'save, or is no checkpoint: PyTorch files (.pth/.pt/.bin), '
        'safetensors and NumPy .npz are read. Download, convert or save it '
        'again; to resume from an earlier checkpoint instead, add '
        '`--cfg-options load_from=PATH` to `--resume`.')
