"""MiTA attention for mmsegmentation.

Importing the package (``custom_imports=dict(imports=['mmseg_mita'])`` in a
config) registers the models and applies the stack workarounds of
:mod:`mmseg_mita.compat`.
"""
from . import compat
from .datasets import *  # noqa: F401,F403
from .models import *  # noqa: F401,F403
from .ops import mita_attention

compat.apply()

__version__ = '0.1.0'
__all__ = ['mita_attention', '__version__']
