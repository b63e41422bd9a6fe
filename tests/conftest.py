from __future__ import annotations

from pathlib import Path

import pytest

from agentobs.config import load_settings
from agentobs.model import connect
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


SAMPLE_BUNDLE = Path(__file__).parent.parent / "sample_data" / "fleet"


@pytest.fixture(scope="session")
def sample_db(tmp_path_factory) -> Path:
    """sample_data/fleet imported once for the whole test session (read it only: tests share it)."""
    if not (SAMPLE_BUNDLE / "manifest.json").exists():
        pytest.skip("sample_data/fleet not in this checkout")
    from agentobs.collect.bundle import import_bundle
    from agentobs.config import Settings

    path = tmp_path_factory.mktemp("sample_shared") / "sample.duckdb"
    con = connect(path)
    with Writer(con) as w:
        import_bundle(SAMPLE_BUNDLE, w, Settings())
    con.close()
    return path
