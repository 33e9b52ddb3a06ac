"""Helpers with no dependency beyond the standard library."""
from .checks import (IntPair, check_choice, check_flag, check_int,
                     check_int_pair)
from .io import write_atomic, write_json

__all__ = [
    'IntPair', 'check_choice', 'check_flag', 'check_int', 'check_int_pair',
    'write_atomic', 'write_json'
]
