"""Convert full-attention ViT checkpoints (timm, DeiT, AugReg/big_vision
.npz, mmpretrain, mmseg) to weights of mmseg's ``VisionTransformer``, which
``MiTAViT`` loads unchanged, and the authors' MiTA-DeiT checkpoints (their
depth-wise value conv and gate: ``MiTAViT(dwc=True, gate=True)``,
:mod:`.mita_deit`)."""
from .convert import (EXPECTED, FORMATS, Conversion, convert, convert_file,
                      detect_format, write_checkpoint)
from .loading import NpzWeights, read_checkpoint
from .settings import BackboneSettings, infer_settings

__all__ = [
    'EXPECTED', 'FORMATS', 'BackboneSettings', 'Conversion', 'NpzWeights',
    'convert', 'convert_file', 'detect_format', 'infer_settings',
    'read_checkpoint', 'write_checkpoint'
]
