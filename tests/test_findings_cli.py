"""`agentobs findings` and acknowledgements: formats, ack with expiry through the CLI (the only
writer), read-only readers, bad input."""

from __future__ import annotations

import datetime as dt
import json

import duckdb
import pytest
from click.testing import CliRunner
from test_findings_rules import SG, WINDOW, Fleet, build, settings, two_turn_sessions

from agentobs.cli import cli
from agentobs.errors import InputError
from agentobs.findings import run
from agentobs.findings.acks import parse_until
from agentobs.source import as_source

FID = f"hicache_off/instance={SG}"


@pytest.fixture
def db(store, tmp_path, db_path):
    build(store, tmp_path, Fleet(two_turn_sessions(SG), sglang={SG: {}}))
    con, w = store
    w.close()
    con.close()
    cfg = tmp_path / "agentobs.toml"
    cfg.write_text("[cost]\nusd_per_hour = 3.6\nprefill_tokens_per_s = 1000.0\ndecode_tokens_per_s = 1000.0\n")
    return db_path, cfg


def invoke(args, db):
    path, cfg = db
    return CliRunner().invoke(cli, [*args, "--db", str(path), "--config", str(cfg)], catch_exceptions=False)


def window():
    return ["--since", str(WINDOW[0]), "--until", str(WINDOW[1])]


def test_findings_json_and_markdown(db):
    r = invoke(["findings", *window(), "--format", "json"], db)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    ids = [d["id"] for d in data]
    assert FID in ids
    d = data[ids.index(FID)]
    assert d["tax"]["usd_week"] == pytest.approx(16.8) and d["scope"]["instance"] == SG
    assert d["evidence"]["params"]["instance"] == SG
    r = invoke(["findings", *window(), "--format", "markdown"], db)
    assert "**Fix**: Launch SGLang with `--enable-hierarchical-cache" in r.stdout and "```sql" in r.stdout


def test_ack_hides_until_expiry(db):
    r = invoke(["findings", "ack", FID, "--reason", "HiCache rollout planned for December", "--until", "2099-01-01"], db)
    assert r.exit_code == 0, r.output
    r = invoke(["findings", *window(), "--format", "json"], db)
    assert FID not in [d["id"] for d in json.loads(r.stdout)]
    r = invoke(["findings", *window(), "--format", "json", "--all"], db)
    acked = {d["id"]: d["acked"] for d in json.loads(r.stdout)}
    assert acked[FID]["reason"] == "HiCache rollout planned for December"
    # the console/report path: a read-only connection, and a clock past the expiry → it is back
    con = duckdb.connect(str(db[0]), read_only=True)
    after = dt.datetime(2099, 1, 2, tzinfo=dt.UTC).timestamp()
    assert FID in [f.id for f in run(as_source(con), *WINDOW, settings=settings(), clock=lambda: after)]
    assert FID not in [f.id for f in run(as_source(con), *WINDOW, settings=settings())]
    con.close()
    r = invoke(["findings", "acks", "--format", "json"], db)
    assert json.loads(r.stdout)[0]["finding_id"] == FID
    assert invoke(["findings", "unack", FID], db).exit_code == 0
    r = invoke(["findings", *window(), "--format", "json"], db)
    assert FID in [d["id"] for d in json.loads(r.stdout)]


@pytest.mark.parametrize(("args", "message"), [
    (["not-an-id", "--reason", "x", "--until", "2099-01-01"], "is not a finding id"),
    ([FID, "--reason", "  ", "--until", "2099-01-01"], "needs a --reason"),
    ([FID, "--reason", "x", "--until", "2000-01-01"], "is in the past"),
    ([FID, "--reason", "x", "--until", "next tuesday"], "is not a date"),
])
def test_ack_bad_input(db, args, message):
    from agentobs.cli import main

    path, cfg = db
    with pytest.raises(SystemExit) as e:
        main(["findings", "ack", *args, "--db", str(path), "--config", str(cfg)])
    assert e.value.code == 1
    with pytest.raises(InputError, match=message):
        main(["findings", "ack", *args, "--db", str(path), "--config", str(cfg), "--debug"])


def test_parse_until_forms():
    now = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC).timestamp()
    assert parse_until("2026-12-01", lambda: now) == dt.datetime(2026, 12, 2)       # end of that day
    assert parse_until("14d", lambda: now) == dt.datetime(2026, 12, 14, 12, 0)
    assert parse_until("2026-12-01T09:30+01:00") == dt.datetime(2026, 12, 1, 8, 30)


def test_store_without_acks_table_reads_fine(db):
    # a store created before migration 0002 has no findings_acks table: readers must not fail
    con = duckdb.connect(str(db[0]))
    con.execute("DROP TABLE findings_acks")
    con.close()
    ro = duckdb.connect(str(db[0]), read_only=True)
    assert FID in [f.id for f in run(as_source(ro), *WINDOW, settings=settings())]
    ro.close()
