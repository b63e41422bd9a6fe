"""Golden metric cases as data (tests/golden/*.yaml): each file holds its inputs (span rows as
tests/builders.call builds them, engine config, KV events, metric samples), the expected rows of the metric run's
per-call relation or of metrics, and a ``why:`` line. One runner checks every case on DuckDB and on ClickHouse
(chDB, the same store copied by ``load.from_duckdb``): the same numbers from both engines.

A case file::

    why: the rule the case pins down
    calls: [[call id, session, start s, end s, P, C, {keyword: value}], ...]   # builders.call; other keys
                                                                             # override the row (error_type)
    config: [[instance, engine, key, value], ...]
    kv: [[instance, t, type, [hashes], session, parent hash?], ...]
    samples: [[instance, t, metric, {labels}, value], ...]
    settings: {name: value}                              # optional: settings other than the defaults
    window: [since s, until s]                           # optional: the run's window (relative to T0)
    expect:
      - table: m_calls | metric: NAME (by: GROUPING)     # a table of the run, or a metric
        key: column naming the rows                      # rows: {key value: {column: expected}}
        exact: true                                      # optional: these rows and no others
        rows: {...}
      - metric: NAME
        list: [{column: expected}, ...]                  # or: every row, in the order the metric gives them

Floats compare to 1e-9 relative; null is SQL NULL."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest
import yaml
from builders import SPAN_TYPES, T0, call, make_db

from agentobs.config import Settings
from agentobs.metrics import prepare
from agentobs.source import as_source

CASES = sorted((Path(__file__).parent / "golden").glob("*.yaml"))
CALL_ARGS = set(inspect.signature(call).parameters)


def load_case(path: Path) -> dict:
    case = yaml.safe_load(path.read_text())
    if not isinstance(case, dict) or not str(case.get("why") or "").strip() or not case.get("expect"):
        raise ValueError(f"{path.name}: a case needs a non-empty 'why' and 'expect'")
    unknown = set(case) - {"why", "calls", "config", "kv", "samples", "settings", "window", "expect"}
    if unknown:
        raise ValueError(f"{path.name}: unknown keys {sorted(unknown)}")
    return case


def span_rows(case: dict) -> list[dict]:
    out = []
    for c in case.get("calls", []):
        pos, kw = (c[:-1], c[-1]) if isinstance(c[-1], dict) else (c, {})
        row = call(*pos, **{k: v for k, v in kw.items() if k in CALL_ARGS})
        row.update({k: v for k, v in kw.items() if k not in CALL_ARGS})
        out.append(row)
    return out


def same(got, want) -> bool:
    if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    return got == want


def check(run, path: Path, engine: str, expect: list[dict]) -> None:
    for i, e in enumerate(expect):
        what = f"{path.name} on {engine}, expect[{i}]"
        if "table" in e:
            df = run.table(e["table"])
        else:
            df = run.compute(e["metric"], e.get("by"))
        if "list" in e:
            got_list = df.to_dicts()
            assert len(got_list) == len(e["list"]), f"{what}: {len(got_list)} rows: {got_list}"
            for n, (row, cols) in enumerate(zip(got_list, e["list"], strict=True)):
                bad = {c: (row.get(c, "<no column>"), v) for c, v in cols.items() if not same(row.get(c), v)}
                assert not bad, f"{what}: row {n}: (got, want) {bad}"
            continue
        got = {r[e["key"]]: r for r in df.to_dicts()}
        if e.get("exact"):
            assert set(got) == set(e["rows"]), f"{what}: rows {sorted(map(str, got))}"
        for k, cols in e["rows"].items():
            assert k in got, f"{what}: no row {e['key']} = {k!r} (rows: {sorted(map(str, got))})"
            bad = {c: (got[k].get(c, "<no column>"), v) for c, v in cols.items() if not same(got[k].get(c), v)}
            assert not bad, f"{what}: row {k!r}: (got, want) {bad}"


@pytest.fixture(scope="module")
def chdb_session():
    """One in-memory chDB for the module, emptied before each case (chDB opens one database per process)."""
    pytest.importorskip("chdb", reason="chdb is not installed: pip install 'agentobs[clickhouse]'")
    from agentobs.backends.clickhouse import model
    from agentobs.backends.clickhouse.conn import ClickHouse

    ch = ClickHouse("chdb:")
    settings = Settings()
    model.create_tables(ch, settings)
    model.create_views(ch, settings)
    yield ch
    ch.close()


def _empty(ch) -> None:
    tables = ch.arrow("SELECT name FROM system.tables WHERE database = currentDatabase() "
                      "AND engine LIKE '%MergeTree%'").column(0).to_pylist()
    for t in tables:
        ch.command(f"TRUNCATE TABLE `{t}`")


def _load_clickhouse(db: str, ch) -> None:
    """The case's store into the emptied chDB: samples, engine config and KV events as ``load.from_duckdb`` copies
    them; the span rows straight into the resolved ``spans`` table, as make_db writes them into DuckDB's (the
    rows carry no OTLP attributes for the exporter's table to resolve). ClickHouse arrays are not nullable: an
    absent ITL or hash list is [] there, as its ingest writes it."""
    from agentobs.backends.clickhouse import load
    from agentobs.model import connect

    _empty(ch)
    con = connect(db, read_only=True)
    try:
        load.from_duckdb(con, ch)
        ch.command("TRUNCATE TABLE otel_traces")
        ch.command("TRUNCATE TABLE spans")
        cols = ", ".join(f"coalesce({c}, [])" + f" AS {c}" if c in ("itl_ms", "block_hashes") else c
                         for c in SPAN_TYPES)
        rows = con.sql(f"SELECT {cols} FROM spans").to_arrow_table()
    finally:
        con.close()
    if rows.num_rows:
        ch.insert_arrow("spans", rows)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_case(path, tmp_path, chdb_session):
    case = load_case(path)
    db = make_db(tmp_path, span_rows(case), config=[tuple(x) for x in case.get("config", [])],
                 kv=[tuple(x) for x in case.get("kv", [])], samples=[tuple(x) for x in case.get("samples", [])])
    settings = Settings(values=case.get("settings") or {})
    since, until = (T0 + case["window"][0], T0 + case["window"][1]) if "window" in case else (None, None)
    run, close = prepare(as_source(db), since=since, until=until, settings=settings)
    try:
        check(run, path, "duckdb", case["expect"])
    finally:
        close()
    ch = chdb_session
    _load_clickhouse(db, ch)
    run, close = prepare(as_source(ch), since=since, until=until, settings=settings)
    try:
        check(run, path, "clickhouse", case["expect"])
    finally:
        close()


def test_case_files_are_checked():
    # a case file that does not parse or lacks its reason fails here by name, not as a silent skip
    assert CASES, "no tests/golden/*.yaml"
    for p in CASES:
        load_case(p)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_case_from_rollups(path, tmp_path):
    """Over the maintained session model, the metrics that read rollups and sketches (reuse, reprefill, idle_kv_rent,
    turn_resume_ttft) give the per-call state's numbers on each case (test_model_state.check_rollup_forms): the whole
    store, the whole hours around its calls with a filter on the first call's instance."""
    from test_model_state import check_rollup_forms

    from agentobs.model import connect, state

    case = load_case(path)
    db = make_db(tmp_path, span_rows(case), config=[tuple(x) for x in case.get("config", [])],
                 kv=[tuple(x) for x in case.get("kv", [])], samples=[tuple(x) for x in case.get("samples", [])])
    settings = Settings()
    con = connect(db)
    try:
        state.rebuild(con, settings)
        lo, hi, inst = con.execute("SELECT min(start_s), max(start_s), min(instance) FROM llm_calls").fetchall()[0]
        h0, h1 = int(lo) // 3600 * 3600, (int(hi) // 3600 + 1) * 3600  # whole hours around every call
        check_rollup_forms(con, settings, ({}, {"since": h0, "until": h1, "filters": {"instance": [inst]}}),
                           require_rows=False)
    finally:
        con.close()
