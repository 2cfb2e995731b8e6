import doctest

import pytest

import hetmem


def test_package_docstring_example_runs():
    pytest.importorskip("numpy")
    r = doctest.testmod(hetmem)
    assert r.attempted >= 8 and r.failed == 0
