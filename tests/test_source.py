"""The data-source seam (agentobs/source.py): what a Source is made from, what it tells about itself, and that the
DuckDB and ClickHouse sources read the same SQL the same way."""

from __future__ import annotations

import duckdb
import pytest

from agentobs.config import Settings
from agentobs.errors import ConfigError, QueryError, StoreError
from agentobs.model import connect
from agentobs.source import (
    ClickHouseSource,
    DuckDBSource,
    Source,
    as_source,
    dialect_of,
    from_stamp,
    make_source,
    query,
    table_exists,
)


def test_what_becomes_a_source(tmp_path, monkeypatch):
    path = tmp_path / "s.duckdb"
    src = as_source(path)
    assert isinstance(src, DuckDBSource) and src.path == str(path) and as_source(src) is src
    monkeypatch.setenv("AGENTOBS_DB", str(tmp_path / "env.duckdb"))
    assert as_source(None).path == str(tmp_path / "env.duckdb")  # None: the setting db, environment included
    con = duckdb.connect()
    assert as_source(con).con is con and dialect_of(con) == "duckdb"
    with pytest.raises(QueryError, match="db must be a Source, a store path or a DuckDB connection, got int"):
        as_source(3)
    assert isinstance(src, Source)  # the runtime-checkable protocol


def test_the_entry_points_take_a_source_only(tmp_path):
    """A path or a raw connection becomes a Source at the edge (as_source); the library refuses anything else,
    naming the entry point, before it touches a store."""
    from agentobs.exporter import compute_snapshot
    from agentobs.findings import build as ledger
    from agentobs.metrics import compute, compute_all, prepare
    from agentobs.report import build as report
    from agentobs.report import iso_week

    path = str(tmp_path / "s.duckdb")
    con = duckdb.connect()
    calls = {
        "agentobs.metrics.prepare": [lambda: prepare(path), lambda: compute("reuse", con), lambda: compute_all(path),
                                     lambda: ledger(con, settings=Settings())],
        "agentobs.report.build": [lambda: report(path, iso_week("2026-W48"), Settings())],
        "agentobs.exporter.compute_snapshot": [lambda: compute_snapshot(path, Settings())],
    }
    for who, fns in calls.items():
        for fn in fns:
            with pytest.raises(QueryError, match=f"{who} takes a Source, got (str|DuckDBPyConnection)"):
                fn()
    assert not (tmp_path / "s.duckdb").exists()  # refused before anything opened the store


def test_make_source_follows_the_flag_then_the_setting(tmp_path):
    s = Settings(values={"db": str(tmp_path / "set.duckdb")})
    assert make_source(s).label() == str(tmp_path / "set.duckdb")
    assert make_source(s, db=tmp_path / "flag.duckdb").label() == str(tmp_path / "flag.duckdb")
    with pytest.raises(ConfigError, match="backend 'mysql': choose duckdb or clickhouse"):
        make_source(s, backend="mysql")


def test_a_store_file_source(tmp_path):
    path = tmp_path / "s.duckdb"
    src = DuckDBSource(path)
    with pytest.raises(StoreError, match="no agentobs database at"):
        src.check()
    assert src.stamp() is None  # no file, no stamp
    connect(path).close()  # tables and the model's views
    src.check()
    before = src.stamp()
    assert before[:2] == ("duckdb", str(path.resolve())) and src.where() == f"store {path} (read-only)"
    assert from_stamp(before).label() == str(path.resolve())
    cur = src.cursor()
    assert table_exists(cur, "spans") and table_exists(cur, "llm_calls") and not table_exists(cur, "nope")
    cur.close()
    assert query(src, "SELECT count(*) AS n FROM llm_calls")["n"].to_list() == [0]
    names = set(src.schema()["name"].to_list())
    assert {"spans", "llm_calls", "sessions"} <= names and "schema_migrations" not in names
    res = src.user_sql("SELECT 1 + 1 AS two", row_cap=10, timeout_s=5)
    assert res.table.to_pylist() == [{"two": 2}]
    with pytest.raises(QueryError, match="read-only"):
        src.user_sql("DELETE FROM spans", row_cap=10, timeout_s=5)
    con = connect(path)
    con.execute("CREATE TABLE grow AS SELECT range AS x FROM range(100000)")
    con.close()
    assert src.stamp() != before  # the store grew: caches keyed on the stamp see it


def test_a_connection_source_is_its_owners():
    con = connect(":memory:")
    src = as_source(con)
    assert src.stamp() is None and src.label() == ":memory:"  # nothing to key a cache on
    cur = src.cursor()
    cur.execute("CREATE TEMP TABLE t AS SELECT 1 AS x")
    cur.close()
    assert con.sql("SELECT 42").fetchall() == [(42,)]  # closing the cursor left the connection open
    with pytest.raises(QueryError, match="user SQL runs on a store file"):
        src.user_sql("SELECT 1", row_cap=1, timeout_s=1)


def test_a_clickhouse_source():
    pytest.importorskip("chdb", reason="chdb is not installed: pip install 'agentobs[clickhouse]'")
    from agentobs.backends.clickhouse import model
    from agentobs.backends.clickhouse.conn import ClickHouse

    ch = ClickHouse("chdb:")
    try:
        src = as_source(ch)
        assert isinstance(src, ClickHouseSource) and src.dialect == "clickhouse"
        with pytest.raises(StoreError, match="no agentobs model at chdb:"):
            src.check()
        model.create_tables(ch, Settings())
        model.create_views(ch, Settings())
        src.check()
        assert src.run_stamp() == ClickHouseSource(ch=ch).run_stamp()  # one connection, one shared run
        cur = src.cursor()
        assert dialect_of(cur) == "clickhouse" and table_exists(cur, "llm_calls") and not table_exists(cur, "nope")
        cur.close()
        # the same DuckDB SQL as on the store, transpiled
        assert query(src, "SELECT count(*) AS n FROM llm_calls")["n"].to_list() == [0]
        first = src.stamp()
        assert first[0] == "clickhouse" and src.stamp(max_age_s=3600) is first  # a recent one is reused
        assert src.user_sql("SELECT 1 + 1 AS two", row_cap=10, timeout_s=5).table.to_pylist() == [{"two": 2}]
        src.close()  # not its own connection: left open
        assert ch.arrow("SELECT 1 AS one").to_pylist() == [{"one": 1}]
    finally:
        ch.close()


def test_a_clickhouse_url_label_hides_the_password():
    pytest.importorskip("clickhouse_connect")
    src = ClickHouseSource.__new__(ClickHouseSource)  # no server here: only the label is under test

    class Conn:
        url = "http://alice:s3cret@db.example:8123/agentobs"

    src.ch = Conn()
    assert src.label() == "http://alice:***@db.example:8123/agentobs" and "s3cret" not in src.where()
