from .mita_vit import (MiTAEncoderLayer, MiTAMultiheadAttention, MiTAViT,
                       parse_mita_cfg)

__all__ = [
    'MiTAEncoderLayer', 'MiTAMultiheadAttention', 'MiTAViT', 'parse_mita_cfg'
]
