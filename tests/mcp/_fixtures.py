"""Fixtures the MCP test files import: the anyio backend, a fresh lab under the test's tmp_path
(a file that wants one for every test marks ``usefixtures("lab_root")``) and the server in
process behind the SDK's in-memory client. Each is named for pytest by ``name=`` (so that a test
taking ``client`` does not shadow the import). Not a conftest.py: one here would stand in for
tests/conftest.py wherever a later test module does ``from conftest import ...``."""

from __future__ import annotations

import pytest
from mcp import Client

from rlhf_lab.mcp_server import server
from tests._lab_processes import kill_live_runs


@pytest.fixture(name="anyio_backend")
def asyncio_backend():
    return "asyncio"


@pytest.fixture(name="lab_root")
def fresh_lab(tmp_path, monkeypatch):
    """A fresh, offline lab under ``tmp_path`` (one math thread per trainer); the trainers a
    test left running are killed after it."""
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield tmp_path
    kill_live_runs(tmp_path)


@pytest.fixture(name="client")
async def in_memory_client():
    """The server in process, through the SDK's in-memory client."""
    async with Client(server) as c:
        yield c
