from .transforms import CheckSegMap

__all__ = ['CheckSegMap']
