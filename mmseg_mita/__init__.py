"""MiTA attention for mmsegmentation.

Importing the package (or :mod:`mmseg_mita.ops`, the operator) loads
PyTorch alone and changes nothing in torch, mmengine or mmseg. The mmseg
part of the plugin is one explicit import, :mod:`mmseg_mita.mmseg_plugin`
(configs: ``custom_imports=dict(imports=['mmseg_mita.mmseg_plugin'])``).
"""
from .ops import mita_attention

__version__ = '0.1.0'
__all__ = ['mita_attention', '__version__']
