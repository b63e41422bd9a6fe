"""Findings, the weekly report and the exporter on ClickHouse (chDB) equal DuckDB's on the same data.

The data: 10 minutes of the simulator's ``sample`` fleet (the scenario behind sample_data/fleet: prefix
caching off on 10.42.7.32, HiCache off on 10.42.7.41, round-robin routing; KV events on .31) written as a
real telemetry bundle, imported into DuckDB through the bundle importer, then copied into ClickHouse by
``load.from_duckdb`` (spans as the exporter's ``otel_traces`` rows, resolved again by the materialized
view; samples, engine config and KV events as they are). Every number below goes through the same
agentobs.metrics preparation, once per engine: ``prepare(db=ClickHouse(...))`` runs it over ClickHouseCursor.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("chdb", reason="chdb (in-process ClickHouse) is not installed: pip install 'agentobs[clickhouse]'")

from agentobs.backends.clickhouse import load, model  # noqa: E402
from agentobs.backends.clickhouse.conn import ClickHouse  # noqa: E402
from agentobs.backends.clickhouse.dialect import to_clickhouse  # noqa: E402
from agentobs.collect.bundle import import_bundle  # noqa: E402
from agentobs.config import Settings, load_settings  # noqa: E402
from agentobs.exporter import compute_snapshot  # noqa: E402
from agentobs.findings import run as findings_run  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.report import build, resolve  # noqa: E402
from agentobs.sim.run import simulate  # noqa: E402
from agentobs.sim.scenarios import scenario  # noqa: E402
from agentobs.source import as_source
from agentobs.store.writer import Writer  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
START = 1790845200.0  # the sample scenario's first arrival (2026-10-01T09:00Z)
V32, S41 = "10.42.7.32:8000", "10.42.7.41:30000"


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parity")
    simulate(dataclasses.replace(scenario("sample"), duration_s=600.0), seed=1, out=tmp / "bundle", prom_every=12)
    settings = load_settings(env={})
    con = connect(tmp / "duck.duckdb")
    with Writer(con, batch_rows=50_000, flush_s=0.05) as w:
        import_bundle(tmp / "bundle", w, settings)
    ch = ClickHouse("chdb:")
    model.create_tables(ch, settings)
    model.create_views(ch, settings)
    copied = load.from_duckdb(con, ch)
    yield con, ch, settings, copied
    ch.close()
    con.close()


def close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def test_copy_is_complete(both):
    con, ch, _, copied = both
    for duck, ours in (("spans", "spans"), ("kv_events", "kv_events"), ("engine_config", "agentobs_engine_config")):
        n = con.sql(f"SELECT count(*) FROM {duck}").fetchall()[0][0]
        assert n > 0 and ch.arrow(f"SELECT count() AS n FROM {ours}").column(0)[0].as_py() == n
    # every sample but the vllm:cache_config_info series (its labels are engine_config rows already)
    n = con.sql("SELECT count(*) FROM metric_samples WHERE metric <> 'vllm:cache_config_info'").fetchall()[0][0]
    assert copied["metric_samples"] == n


# -- findings --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def findings(both):
    con, ch, settings, _ = both
    # a 5-minute default window inside the 10 minutes of data: the run narrows its tables with UPDATE m_calls /
    # DELETE FROM m_samples (agentobs/findings/context.py), mutations of the Memory tables on ClickHouse
    s = Settings({**settings.values, "findings_default_window_s": 300.0})
    return findings_run(as_source(con), settings=s, simulate=False), findings_run(as_source(ch), settings=s, simulate=False)


def test_findings_same_ids_in_the_same_order(findings):
    duck, ours = findings
    assert [f.id for f in duck] == [f.id for f in ours]
    # the planted problems are there (not an empty list compared with an empty list)
    # (5 minutes of the sample: the cache-off replica, and SGLang replicas dropping idle KV before g*; the routed-away
    # turns are too few there for the routing rule's share)
    assert {f"prefix_cache_off/instance={V32}", "retention_vs_recompute/instance=10.42.7.41:30000"} <= \
        {f.id for f in ours}


def test_findings_same_tax_evidence_and_text(findings):
    for a, b in zip(*findings, strict=True):
        assert (a.severity, a.confidence, a.title, a.remediation) == (b.severity, b.confidence, b.title, b.remediation)
        for ta, tb in ((a.tax, b.tax), (a.recoverable, b.recoverable)):
            assert close(ta.tokens_week, tb.tokens_week) and close(ta.usd_week, tb.usd_week), (a.id, ta, tb)
            assert (ta.basis, ta.method, ta.period) == (tb.basis, tb.method, tb.period)
        na, nb = dict(a.evidence.numbers), dict(b.evidence.numbers)
        assert na.keys() == nb.keys()
        for k in na:
            assert close(na[k], nb[k]) or (isinstance(na[k], float) and math.isclose(na[k], nb[k], rel_tol=1e-6)), \
                (a.id, k, na[k], nb[k])  # evidence floats are rounded to 6 decimals: one last-digit flip allowed


# -- report ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reports(both):
    con, ch, settings, _ = both
    period = resolve(None, "2026-10-01T09:00", "2026-10-01T09:30")
    return build(as_source(con), period, settings), build(as_source(ch), period, settings)  # findings included (simulated replay)


# string_agg(DISTINCT …) order is unspecified in DuckDB (ClickHouse's translation sorts): compare as sets. A session
# split evenly across two models would be a tie for its usual model: the least name on both backends
# (agentobs/report/queries/about.sql), so the top lists compare whole (the sample scenario keeps each session on one model now)
AS_SET = {("idle_kv_rent_by_task_type", "rent_basis"), ("idle_kv_rent_by_instance", "rent_basis")}


def test_report_tables_identical(reports):
    a, b = reports
    assert a.calls == b.calls > 0
    ta, tb = a.tables(), b.tables()
    assert [t.name for t in ta] == [t.name for t in tb]
    assert "findings" in [t.name for t in tb] and "reprefill_by_cause" in [t.name for t in tb]
    for x, y in zip(ta, tb, strict=True):
        assert x.data.column_names == y.data.column_names, x.name
        assert x.data.num_rows == y.data.num_rows, x.name
        for c in x.data.column_names:
            for u, v in zip(x.data.column(c).to_pylist(), y.data.column(c).to_pylist(), strict=True):
                if (x.name, c) in AS_SET and u is not None:
                    u, v = set(u.split(" | ")), set(v.split(" | "))
                assert close(u, v), (x.name, c, u, v)
        # the CSV/Parquet files carry the same types (ClickHouse counts are UInt64, cast to BIGINT)
        assert x.data.schema.types == y.data.schema.types, x.name


def test_report_figures_identical(reports):
    a, b = reports
    fa = [(f.key, f.value, f.previous) for s in a.sections for f in s.figures]
    fb = [(f.key, f.value, f.previous) for s in b.sections for f in s.figures]
    assert [f[0] for f in fa] == [f[0] for f in fb] and len(fa) > 20
    for (k, v1, p1), (_, v2, p2) in zip(fa, fb, strict=True):
        assert close(v1, v2) and close(p1, p2), (k, v1, v2)


def test_report_notes_and_findings_section(reports):
    a, b = reports
    assert [s.notes for s in a.sections if s.key != "rent"] == [s.notes for s in b.sections if s.key != "rent"]
    fa = next(t for t in a.tables() if t.name == "findings").data.to_pylist()
    fb = next(t for t in b.tables() if t.name == "findings").data.to_pylist()
    # the simulated recoverable $ (the replay reads m_calls and engine_config_latest) is the same number
    assert [r["id"] for r in fa] == [r["id"] for r in fb] and fa
    assert all(close(x["recoverable_usd_week"], y["recoverable_usd_week"]) and close(x["usd_week"], y["usd_week"])
               and x["sessions"] == y["sessions"] for x, y in zip(fa, fb, strict=True))


# -- exporter --------------------------------------------------------------------------------------------
def test_exporter_snapshot_identical(both):
    con, ch, settings, _ = both
    now = START + 1800  # window [09:00, 09:30): every call

    def series(db):
        snap = compute_snapshot(as_source(db), settings, clock=lambda: now, window_s=1800)
        return {name: sorted((tuple(sorted(lab.items())), v) for lab, v in s) for name, s in snap.series.items()}

    a, b = series(con), series(ch)
    assert a.keys() == b.keys()
    for name in a:
        assert [k for k, _ in a[name]] == [k for k, _ in b[name]], name
        assert all(close(x, y) for (_, x), (_, y) in zip(a[name], b[name], strict=True)), name
    # 4 instances + 2 models + task types: a real snapshot, not two empty ones
    assert len(b["agentobs_calls"]) >= 7


# -- dialect additions the findings and the report need --------------------------------------------------
@pytest.mark.parametrize("duck_sql,expected", [
    # ORDER BY an output alias over GROUP BY ALL (DuckDB resolves the alias; ClickHouse would take the column)
    ("SELECT coalesce(x, '') AS x, count(*) AS n FROM (SELECT unnest(['b', NULL, 'a', 'b']) AS x) GROUP BY ALL "
     "ORDER BY x", [("", 1), ("a", 1), ("b", 2)]),
    # a named predicate is a boolean, not 0/1 (rules test `is False`); NULL stays NULL
    ("SELECT CASE WHEN x IS NULL THEN NULL ELSE x = 'a' END AS b FROM (SELECT unnest(['a', 'c', NULL]) AS x)",
     [(True,), (False,), (None,)]),
])
def test_dialect_constructs(both, duck_sql, expected):
    _, ch, _, _ = both
    t = ch.arrow(to_clickhouse(duck_sql))
    assert list(zip(*[c.to_pylist() for c in t.columns], strict=True)) == expected


# -- the CLI: --backend clickhouse on every command ------------------------------------------------------
DRIVER = r"""
import json, os, sys
from click.testing import CliRunner
from agentobs.cli import cli
url, fixture, out = sys.argv[1:4]
runner = CliRunner()
res = {}
def go(key, *args, env=None):
    r = runner.invoke(cli, list(args), env=env)
    res[key] = [r.exit_code, r.stdout, r.stderr, repr(r.exception) if r.exit_code else ""]
go("load", "clickhouse", "load", fixture, "--clickhouse-url", url)
go("metrics", "metrics", "reuse", "--format", "json", "--backend", "clickhouse", "--clickhouse-url", url)
go("sql", "sql", "--format", "csv", "SELECT count() AS n, sum(prompt_tokens) AS p FROM llm_calls",
   env={"AGENTOBS_BACKEND": "clickhouse", "AGENTOBS_CLICKHOUSE_URL": url})
go("findings", "findings", "--format", "json", "--no-simulate", "--backend", "clickhouse", "--clickhouse-url", url)
go("report", "report", "--since", "2026-10-14T00:00", "--until", "2026-10-21T00:00", "--out", out,
   "--backend", "clickhouse", "--clickhouse-url", url)
go("bad", "metrics", "reuse", "--backend", "clickhouse", "--clickhouse-url", "mysql://h/db")
print(json.dumps(res))
"""


@pytest.mark.slow  # end to end: the commands in a child process
def test_cli_backend_clickhouse(tmp_path):
    """The top-level commands with --backend clickhouse (or $AGENTOBS_BACKEND) on an on-disk chDB, in a child
    process (chDB opens one database path per process; this module holds an in-memory one)."""
    url = f"chdb://{tmp_path}/ch"
    p = subprocess.run([sys.executable, "-c", DRIVER, url, str(FIX / "otlp/agent_task_3turns.json"),
                        str(tmp_path / "report")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("load", "metrics", "sql", "findings", "report"):
        assert res[key][0] == 0, (key, res[key])
    # METRICS.md worked example: ΣC = 9552 of ΣP = 15661 over its 3 calls
    assert '"cached_tokens":9552' in res["metrics"][1].replace(" ", "")
    assert res["sql"][1].strip().splitlines()[-1] == "3,15661"
    assert json.loads(res["findings"][1]) == []  # 3 calls: nothing clears the floors
    assert "3 calls" in res["report"][2]
    manifest = json.loads((tmp_path / "report" / "manifest.json").read_text())
    assert manifest["calls"] == 3 and manifest["db"] == url and (tmp_path / "report" / "report.html").exists()
    assert res["bad"][0] != 0 and "use chdb:, chdb:///path or http" in res["bad"][3]


def test_a_run_moved_to_the_previous_period_agrees_on_both_engines(both):
    # MetricRun.set_window (the console Overview's "change vs previous") re-flags in_win with an UPDATE: a
    # mutation of the run's Memory table on ClickHouse, an UPDATE of m_x on DuckDB. The sample runs 600 s:
    # the view is its last 300 s, the previous period the 300 s before
    from agentobs.metrics import prepare

    con, ch, settings, _ = both
    lo, hi = con.sql("SELECT min(start_s), max(start_s) FROM llm_calls").fetchall()[0]
    until = hi + 1e-3
    since = until - 300.0
    out = {}
    for name, db in (("duckdb", con), ("clickhouse", ch)):
        run, done = prepare(as_source(db), since=since, until=until, settings=settings)
        try:
            now = run.compute("reuse", "model")
            run.set_window(since - 300.0, since)
            before = run.compute("reuse", "model")
            run.set_window(since, until)
            again = run.compute("reuse", "model")
        finally:
            done()
        out[name] = (now.sort("model").to_dicts(), before.sort("model").to_dicts(), again.sort("model").to_dicts())
    fresh, done = prepare(as_source(con), since=since - 300.0, until=since, settings=settings)
    try:
        want_before = fresh.compute("reuse", "model").sort("model").to_dicts()
    finally:
        done()
    assert out["duckdb"][0] == out["duckdb"][2]            # back to its own window: the same numbers
    assert sum(r["calls"] for r in want_before) > 0
    for got in (out["duckdb"][1], out["clickhouse"][1]):   # moved back = prepared for that period
        assert [r["model"] for r in got] == [r["model"] for r in want_before]
        for a, b in zip(got, want_before, strict=True):
            assert all(close(a[k], b[k]) for k in a), (a, b)
    for i in range(3):
        for a, b in zip(out["clickhouse"][i], out["duckdb"][i], strict=True):
            assert all(close(a[k], b[k]) for k in a), (i, a, b)


# -- call_reuse: the table ClickHouse computes by steps, the view DuckDB computes inline -------------------------
def test_call_reuse_rows_identical_and_refreshed_when_the_data_changes(both):
    """`SELECT … FROM call_reuse` (agentobs sql) on ClickHouse: the table is brought up to date with the data first
    (the module loaded the data after create_views made it, on an empty store), then its rows are DuckDB's."""
    from agentobs.backends.clickhouse.sql import run_query

    con, ch, _, _ = both
    cols = ("call_id, prev_call_id, mode, reusable_tokens, reusable_tokens_eff, shortfall_tokens, reprefill_tokens, "
            "reprefill_low_tokens, reprefill_high_tokens, miss_cause, cause_evidence, hit_class, window_outcome, "
            "rent_mode, evict_ts_s, rent_paid_token_s, rent_wasted_token_s, abandon_rent_token_s, turn_no, is_retry")
    q = f"SELECT {cols} FROM call_reuse ORDER BY call_id"
    duck = con.sql(q).fetchall()
    ours = run_query(ch, q, row_cap=100_000).table
    ours_rows = list(zip(*[c.to_pylist() for c in ours.columns], strict=True))
    assert len(duck) == len(ours_rows) > 100
    for a, b in zip(duck, ours_rows, strict=True):
        assert all(close(x, y) or (isinstance(x, float) and math.isclose(x, y, rel_tol=1e-9)) for x, y in
                   zip(a, b, strict=True)), (a, b)
    # not trivially equal: the sample has evictions (KV events on .31) and cache-off misses
    causes = {r[9] for r in duck}
    assert {"evicted_partial", "cache_disabled"} & causes, causes
    # nothing new: not computed again; a version that does not match (new data) is
    assert model.refresh_call_reuse(ch) is False
    ch.command(f"ALTER TABLE {model.CALL_REUSE_TABLE} MODIFY COMMENT 'stale'")
    assert model.refresh_call_reuse(ch) is True and model.refresh_call_reuse(ch) is False


def test_call_reuse_that_cannot_be_refreshed_says_why(both, monkeypatch):
    # a ClickHouse user without CREATE (readonly grants): the refresh fails; the query says so and what to run,
    # rather than answering from rows of older data
    from agentobs.backends.clickhouse.sql import run_query
    from agentobs.errors import QueryError

    _, ch, _, _ = both

    def refused(_ch, force=False):
        raise QueryError("ClickHouse: Code: 164. DB::Exception: default: Cannot execute query in readonly mode")

    monkeypatch.setattr(model, "refresh_call_reuse", refused)
    with pytest.raises(QueryError, match=r"call_reuse could not be brought up to date .*readonly mode.*"
                                         r"`agentobs clickhouse init`"):
        run_query(ch, "SELECT count() FROM call_reuse")
    assert run_query(ch, "SELECT count() AS n FROM llm_calls").table.column("n")[0].as_py() > 0  # others as before
