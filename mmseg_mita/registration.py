"""Register the plugin in mmseg, and apply the stack workarounds, once the
stack is imported.

``import mmseg_mita`` must register the models (configs load the plugin
with ``custom_imports``) and fix mmengine, while ``import mmseg_mita.ops``
(which imports the package first) must load nothing but PyTorch. So the
package acts right away on what is already imported, and otherwise the
moment it is: when mmengine finishes importing, its workarounds
(:func:`mmseg_mita.compat.apply_mmengine`); when mmseg does, the models,
transforms and dataset checks. A finder on ``sys.meta_path`` wraps the
loader of each of those two packages once.
"""
import importlib.abc
import importlib.util
import sys
from typing import Callable, Dict


def _fix_mmengine() -> None:
    from . import compat
    compat.apply_mmengine()


def _register_in_mmseg() -> None:
    from . import compat
    from . import datasets, models  # noqa: F401  (fill mmseg's registries)
    compat.apply()


_ACTIONS: Dict[str, Callable[[], None]] = {
    'mmengine': _fix_mmengine,
    'mmseg': _register_in_mmseg,
}


class _RunAfterExec(importlib.abc.Loader):
    """Delegates to ``loader``, then calls ``callback`` once the module has
    executed."""

    def __init__(self, loader, callback: Callable[[], None]):
        self.loader = loader
        self.callback = callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader
        self.callback()

    def __getattr__(self, name):
        return getattr(self.loader, name)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds the packages of ``_ACTIONS`` with the other finders and wraps
    their loaders; removes itself once none is left."""

    def __init__(self, pending: Dict[str, Callable[[], None]]):
        self.pending = pending

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.pending:
            return None
        callback = self.pending.pop(fullname)
        if not self.pending:
            sys.meta_path.remove(self)
        spec = _find_without(self, fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RunAfterExec(spec.loader, callback)
        return spec


def _find_without(finder, fullname: str):
    """``importlib.util.find_spec`` with ``finder`` out of the way."""
    present = finder in sys.meta_path
    if present:
        sys.meta_path.remove(finder)
    try:
        return importlib.util.find_spec(fullname)
    finally:
        if present:
            sys.meta_path.insert(0, finder)


def act_when_stack_is_imported() -> None:
    """Act now on mmengine / mmseg if imported, else as soon as they are."""
    if any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        return
    pending = {}
    for name, action in _ACTIONS.items():
        if name in sys.modules:
            action()
        else:
            pending[name] = action
    if pending:
        sys.meta_path.insert(0, _AfterImportFinder(pending))
