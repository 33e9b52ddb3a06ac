"""MiTA attention for mmsegmentation.

Importing the package (``custom_imports=dict(imports=['mmseg_mita'])`` in a
config) registers the models and transforms in mmseg's registries and
applies the stack workarounds of :mod:`mmseg_mita.compat`, as soon as
mmengine and mmseg are imported (:mod:`mmseg_mita.registration`). The operator,
:mod:`mmseg_mita.ops`, needs PyTorch alone.
"""
from .ops import mita_attention
from .registration import act_when_stack_is_imported

act_when_stack_is_imported()

__version__ = '0.1.0'
__all__ = ['mita_attention', '__version__']
