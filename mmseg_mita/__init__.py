"""MiTA attention for mmsegmentation.

Importing the package (or :mod:`mmseg_mita.ops`, the operator) loads
PyTorch alone and changes nothing in torch, mmengine or mmseg. The mmseg
part of the plugin is one explicit import, :mod:`mmseg_mita.mmseg_plugin`
(configs: ``custom_imports=dict(imports=['mmseg_mita.mmseg_plugin'])``).
The packaged configs: :func:`list_configs`, :func:`config_path`.
"""
from .config_files import config_path, list_configs
from .ops import mita_attention
from .version import __version__

__all__ = ['mita_attention', 'config_path', 'list_configs', '__version__']
