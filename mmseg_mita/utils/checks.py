"""Argument validators shared by the operator, the models, the transforms
and the analysis tools.

Each returns the normalised value or raises ``ValueError`` naming the
parameter (``name``, e.g. ``'mita_cfg.topk'``) and what it accepts. Booleans
are not integers here, although Python treats them as such.
"""
from typing import Sequence, Tuple, Union

IntPair = Union[int, Sequence[int]]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value, name: str, minimum: int = 1) -> int:
    """An int ``>= minimum``."""
    if not _is_int(value) or value < minimum:
        raise ValueError(f'{name} must be an int >= {minimum}, '
                         f'got {value!r}')
    return value


def check_int_pair(value: IntPair, name: str,
                   minimum: int = 1) -> Tuple[int, int]:
    """An int or a pair of ints, each ``>= minimum``, as a pair."""
    pair = (value, value) if _is_int(value) else value
    try:
        pair = tuple(pair)
    except TypeError:
        pair = ()
    if len(pair) != 2 or not all(_is_int(p) and p >= minimum for p in pair):
        raise ValueError(f'{name} must be an int >= {minimum} or a pair of '
                         f'them, got {value!r}')
    return pair


def check_flag(value, name: str) -> bool:
    """A bool (not 0 or 1)."""
    if not isinstance(value, bool):
        raise ValueError(f'{name} must be True or False, got {value!r}')
    return value


def check_choice(value, name: str, choices: Sequence) -> object:
    """One of ``choices``."""
    if value not in choices:
        raise ValueError(f'{name} must be one of {tuple(choices)}, '
                         f'got {value!r}')
    return value
