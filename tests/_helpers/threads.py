"""``one_torch_thread``: an autouse fixture a test file takes by importing it."""

from __future__ import annotations

import pytest
from conftest import torch_threads


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """torch on one intra-op thread for the file's tests: the tiny model gains nothing from
    more, and on a contended machine spinning OpenMP workers slow every step."""
    with torch_threads(1):
        yield
