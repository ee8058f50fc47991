"""The ``trl`` fixture through which the comparisons with TRL import it, lazily, so that the
rest of a test file never depends on trl importing. A file takes it by importing
``trl_fixture`` (registered under the name ``trl``)."""

from __future__ import annotations

import pytest

TRL_VERSION = "1.16.0"  # the dev pin the comparisons are written against


@pytest.fixture(scope="module", name="trl")
def trl_fixture():
    """The ``trl`` module; the test is skipped when trl is missing or another version."""
    trl = pytest.importorskip("trl")
    if trl.__version__ != TRL_VERSION:
        pytest.skip(f"comparisons are written against trl=={TRL_VERSION}, found {trl.__version__}")
    return trl
