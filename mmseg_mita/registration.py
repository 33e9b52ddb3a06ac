"""Register the plugin in mmseg once mmseg is imported.

``import mmseg_mita`` must register the models (configs load the plugin
with ``custom_imports``), while ``import mmseg_mita.ops`` (which imports
the package first) must load nothing but PyTorch. So the package registers
right away only when mmseg is already imported; otherwise it registers the
moment mmseg finishes importing, through a finder on ``sys.meta_path``
that wraps mmseg's loader once and then removes itself.
"""
import importlib.abc
import importlib.util
import sys
from typing import Callable

_TRIGGER = 'mmseg'


def _register() -> None:
    from . import compat
    from . import datasets, models  # noqa: F401  (fill mmseg's registries)
    compat.apply()


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
    """Finds ``_TRIGGER`` with the other finders and wraps its loader."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TRIGGER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RunAfterExec(spec.loader, _register)
        return spec


def register_when_mmseg_is_imported() -> None:
    """Register now if mmseg is imported, else as soon as it is."""
    if _TRIGGER in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())
