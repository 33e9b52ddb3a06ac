"""The shared argument validators."""
import pytest

from mmseg_mita.utils import check_choice, check_int, check_int_pair


def test_check_int():
    assert check_int(3, 'x') == 3
    assert check_int(0, 'x', minimum=0) == 0
    for bad in (0, -1, 2.0, True, '3', None):
        with pytest.raises(ValueError, match=r'^x must be an int >= 1'):
            check_int(bad, 'x')


def test_check_int_pair():
    assert check_int_pair(4, 'p') == (4, 4)
    assert check_int_pair([2, 3], 'p') == (2, 3)
    for bad in (0, (1, 0), (1, 2, 3), (1.0, 2), (True, 2), 'ab', None):
        with pytest.raises(ValueError, match=r'^p must be an int >= 1 or a '
                           'pair of them'):
            check_int_pair(bad, 'p')


def test_check_choice():
    assert check_choice('a', 'mode', ('a', 'b')) == 'a'
    with pytest.raises(ValueError, match=r"mode must be one of \('a', 'b'\)"):
        check_choice('c', 'mode', ('a', 'b'))
