from .mita_vit import MiTAMultiheadAttention, MiTAViT, parse_mita_cfg

__all__ = ['MiTAMultiheadAttention', 'MiTAViT', 'parse_mita_cfg']
