from .io import write_atomic

__all__ = ['write_atomic']
