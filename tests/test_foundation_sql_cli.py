"""Read-only SQL, the CLI's error handling, settings and the writer."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pytest
from cli_run import run_cli

from agentobs.collect import files
from agentobs.config import SETTINGS, Settings, load_settings
from agentobs.errors import ConfigError, QueryError
from agentobs.model import connect
from agentobs.sql import run_query
from agentobs.store.writer import Writer


@pytest.fixture
def filled(db_path, fixtures, settings):
    con = connect(db_path)
    with Writer(con) as w:
        files.import_otlp([fixtures / "otlp" / "agent_task_3turns.json"], w, settings)
    con.close()
    return db_path


REFUSED = [
    ("DROP TABLE spans", "refused: DROP statements are not allowed"),
    ("INSERT INTO spans (trace_id, span_id) VALUES ('a', 'b')", "refused: INSERT statements are not allowed"),
    ("COPY spans TO '/tmp/x.csv'", "refused: COPY statements are not allowed"),
    ("ATTACH '/tmp/other.duckdb' AS o", "refused: ATTACH statements are not allowed"),
    ("INSTALL httpfs", "refused: LOAD statements are not allowed"),
    ("LOAD httpfs", "refused: LOAD statements are not allowed"),
    ("SET enable_external_access = true", "refused: SET statements are not allowed"),
    ("SELECT 1; DROP TABLE spans", "one statement at a time, got 2"),
    ("SELECT * FROM read_csv('/etc/passwd')", "refused: file and network access is disabled in agentobs SQL"),
    ("SELECT * FROM read_parquet('https://example.com/x.parquet')", "refused: file and network access is disabled in agentobs SQL"),
    ("SELEC 1", "SQL syntax error"),
]


@pytest.mark.parametrize("sql,message", REFUSED)
def test_sql_refusals(filled, sql, message):
    with pytest.raises(QueryError) as e:
        run_query(sql, filled)
    assert str(e.value).startswith(message)
    # nothing changed
    assert run_query("SELECT count(*) AS n FROM spans", filled).table.to_pylist() == [{"n": 6}]


def test_sql_row_cap_and_timeout(filled):
    r = run_query("SELECT * FROM range(25) t(i)", filled, row_cap=10)
    assert r.truncated and r.table.num_rows == 10 and "truncated" in r.notice()
    r = run_query("SELECT * FROM range(10) t(i)", filled, row_cap=10)
    assert not r.truncated and r.notice() is None
    with pytest.raises(QueryError, match="time limit"):
        run_query("SELECT count(*) FROM range(10000000000) a", filled, timeout_s=0.2)


def agentobs(*args):
    return run_cli(*args)


def test_cli_import_sql_sessions(tmp_path, fixtures):
    db = str(tmp_path / "c.duckdb")
    r = agentobs("import", "otlp", str(fixtures / "otlp" / "agent_task_3turns.json"), "--db", db)
    assert r.returncode == 0, r.stderr
    assert "6 accepted (6 new), 0 rejected" in r.stderr
    r = agentobs("sql", "SELECT call_id, cached_tokens FROM llm_calls ORDER BY start_s", "--db", db, "--format", "json")
    assert json.loads(r.stdout) == [{"call_id": "1c5e9a3b7d2f4e61", "cached_tokens": 3072},
                                    {"call_id": "3e7a1c5d9f4b6083", "cached_tokens": 3408},
                                    {"call_id": "5a9c3e7f1b6d82a5", "cached_tokens": 3072}]
    r = agentobs("sessions", "--db", db, "--format", "json")
    # hit rate ΣC/ΣP = 9552/15661 = 0.610
    assert json.loads(r.stdout)[0]["hit_rate"] == 0.61
    r = agentobs("calls", "--session", "sess-0199e1a2-6c40-7d2e-b7a1-3f9e5c2d8a1", "--db", db)
    assert r.returncode == 1
    assert "did you mean 'sess-0199e1a2-6c40-7d2e-b7a1-3f9e5c2d8a10'" in r.stderr.replace("\n", "")
    out = tmp_path / "o.parquet"
    r = agentobs("sql", "SELECT * FROM llm_calls", "--db", db, "--format", "parquet", "--out", str(out))
    assert r.returncode == 0 and pa.parquet.read_table(out).num_rows == 3 if hasattr(pa, "parquet") else out.stat().st_size > 0


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    r = agentobs("import", "otlp", str(bad), "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 1  # nothing importable
    # (the line wraps at the console's width wherever the tmp path ends: compare it unwrapped)
    assert "Traceback" not in r.stderr and "invalid JSON at line 1 column 2" in " ".join(r.stderr.split())
    r = agentobs("sql", "DROP TABLE spans", "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 3 and "Traceback" not in r.stderr and "refused" in r.stderr
    r = agentobs("sessions", "--db", str(tmp_path / "missing.duckdb"))
    assert r.returncode == 1 and "no agentobs database" in r.stderr
    r = agentobs("sessions", "--db", str(tmp_path / "missing.duckdb"), "--debug")
    assert "Traceback" in r.stderr


def test_settings_file_env_and_errors(tmp_path):
    p = tmp_path / "a.toml"
    p.write_text('default_block_size = 32\nsession_keys = ["x.sid"]\n[cost]\nusd_per_hour = 4.0\n')
    s = load_settings(p, env={"AGENTOBS_SQL_ROW_CAP": "7"})
    assert (s.default_block_size, s.session_keys, s.sql_row_cap) == (32, ["x.sid"], 7)
    assert s.cost == {"usd_per_hour": 4.0} and Settings().cost == {}
    p.write_text("default_blok_size = 32\n")
    with pytest.raises(ConfigError, match="unknown setting 'default_blok_size' \\(did you mean 'default_block_size'\\?\\)"):
        load_settings(p, env={})
    p.write_text('default_block_size = "big"\n')
    with pytest.raises(ConfigError, match="setting 'default_block_size' must be int, got 'big'"):
        load_settings(p, env={})


def test_writer_batches_concurrent_submitters(db_path):
    con = connect(db_path)
    ts = pa.array([0], pa.timestamp("us"))
    def table(i):
        return pa.table({"ts": pa.array([i * 1_000_000], pa.timestamp("us")), "instance": ["i"], "url": [None],
                         "ok": [True], "error": [None], "duration_s": [0.1], "samples": [1]})
    assert ts is not None
    with Writer(con, batch_rows=1000, flush_s=0.05) as w:
        tickets = []
        def producer(base):
            for i in range(200):
                tickets.append(w.submit("scrapes", table(base + i)))
        threads = [threading.Thread(target=producer, args=(b,)) for b in (0, 1000, 2000)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for t in tickets:
            t.wait(10)
        batches = w.stats.batches
    assert con.execute("SELECT count(*) FROM scrapes").fetchone()[0] == 600
    assert batches < 600  # rows were committed in batches, not one transaction per row


def test_docs_cover_every_setting_and_command():
    from pathlib import Path

    from agentobs.cli import cli

    root = Path(__file__).resolve().parents[1]
    settings_doc = (root / "docs" / "settings.md").read_text()
    for s in SETTINGS:
        assert f"`{s.name}`" in settings_doc, f"docs/settings.md misses setting {s.name}"
    cli_doc = (root / "docs" / "cli.md").read_text()

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            full = f"{prefix} {name}".strip()
            if hasattr(cmd, "commands"):
                yield from walk(cmd, full)
            else:
                yield full

    for full in walk(cli, "agentobs"):
        assert f"`{full}" in cli_doc, f"docs/cli.md misses `{full}`"


def test_writer_counts_new_rows_per_table(db_path):
    """Two tables committed in one batch: each ticket gets its own table's count of new rows."""
    con = connect(db_path)

    def scrapes(n, base=0):
        return pa.table({"ts": pa.array([(base + i) * 1_000_000 for i in range(n)], pa.timestamp("us")),
                         "instance": ["i"] * n, "url": [None] * n, "ok": [True] * n, "error": [None] * n,
                         "duration_s": [0.1] * n, "samples": [1] * n})

    def config(n):
        return pa.table({"instance": ["i"] * n, "ts": pa.array([0] * n, pa.timestamp("us")), "engine": ["vllm"] * n,
                         "key": [f"k{i}" for i in range(n)], "value": ["v"] * n, "source": ["t"] * n})

    with Writer(con, batch_rows=10_000, flush_s=10) as w:
        w.submit("scrapes", scrapes(3))
        w.flush()  # 3 rows already present (committed now: write() would wait flush_s for its group commit)
        a = w.submit("scrapes", scrapes(5))  # 3 duplicates + 2 new
        b = w.submit("engine_config", config(4))  # 4 new
        w.flush()  # both tickets commit in one transaction
        assert (a.wait(), b.wait()) == (2, 4)


def test_bool_settings_coerce_from_toml_and_env():
    from agentobs.config import Setting, _coerce

    flag = Setting("x", False, "a flag", bool)
    assert (_coerce(flag, True, "f"), _coerce(flag, "false", "env"), _coerce(flag, "1", "env")) == (True, False, True)
    with pytest.raises(ConfigError, match="setting 'x' must be bool, got 'maybe'"):
        _coerce(flag, "maybe", "env")
