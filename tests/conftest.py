from __future__ import annotations

from pathlib import Path

import pytest

from agentobs.config import load_settings
from agentobs.store.db import connect
from agentobs.store.writer import Writer

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def settings():
    return load_settings(env={})


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "test.duckdb"


@pytest.fixture
def store(db_path):
    """A fresh read-write store and its writer: (connection, writer)."""
    con = connect(db_path)
    w = Writer(con, batch_rows=10_000, flush_s=0.05)
    yield con, w
    w.close()
    con.close()
