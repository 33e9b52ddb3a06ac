from .cbt_head import CBTHead

__all__ = ['CBTHead']
