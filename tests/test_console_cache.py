"""The console's metric results are held (st.cache_resource), not copied per page render: a warm page prepares,
computes and unpickles nothing; what a page gets is its own (a clone), so it cannot change the shared result; and a
store that changes gets new results, its earlier ones dropped (docs/console.md, "Caching and performance")."""

from __future__ import annotations

import json

import polars as pl
from console_checks import goto
from streamlit.testing.v1 import AppTest
from test_console_store import FIXTURES, build_store, otlp_document

from agentobs.collect import files
from agentobs.config import load_settings
from agentobs.console import APP, data, metrics
from agentobs.metrics.run import MetricRun
from agentobs.model import connect
from agentobs.store.writer import Writer

TIMEOUT = 60
# the Cost attribution page's default pairs (metrics.PAGE_PAIRS["cost"]), computed together for the default view
COST = (("task_cost", "task_type"), ("task_cost", "task"))


def _fresh_caches() -> None:
    """Start from empty console caches (they are per process)."""
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()


def _app(monkeypatch, db, tmp_path) -> AppTest:
    monkeypatch.setenv("AGENTOBS_DB", str(db))
    monkeypatch.setenv("AGENTOBS_CONSOLE_QUERIES", str(tmp_path / "queries.json"))
    monkeypatch.delenv("AGENTOBS_CONFIG", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _count_loads(monkeypatch) -> dict[str, int]:
    """Counters of metric preparations, metric computations and polars frames unpickled (a cache_data hit)."""
    n = {"prepare": 0, "compute": 0, "unpickle": 0}
    real_prepare, real_compute, real_setstate = MetricRun._prepare, MetricRun.compute, pl.DataFrame.__setstate__

    def prepare(self):
        n["prepare"] += 1
        return real_prepare(self)

    def compute(self, *a, **k):
        n["compute"] += 1
        return real_compute(self, *a, **k)

    def setstate(self, state):
        n["unpickle"] += 1
        return real_setstate(self, state)

    monkeypatch.setattr(MetricRun, "_prepare", prepare)
    monkeypatch.setattr(MetricRun, "compute", compute)
    monkeypatch.setattr(pl.DataFrame, "__setstate__", setstate)
    return n


def test_a_warm_page_neither_computes_nor_copies_its_metric_results(monkeypatch, tmp_path):
    _fresh_caches()
    db = build_store(tmp_path / "console.duckdb", tmp_path)
    app = _app(monkeypatch, db, tmp_path)
    n = _count_loads(monkeypatch)
    goto(app, "cost.py")   # cold: one preparation for the page's two pairs
    assert n["prepare"] == 1 and n["compute"] == 2
    tasks = app.selectbox(key="cost_task").options
    goto(app, "sessions.py")   # cold: one preparation for reuse and reprefill by session
    assert n["prepare"] == 2 and n["compute"] == 4
    sessions = app.dataframe[0].value
    n.update(prepare=0, compute=0, unpickle=0)
    # warm: the held results; no polars frame is unpickled (st.cache_data hits unpickled 7 here:
    # the cost pairs twice — 2 frames each — the session pairs 2 and the sessions listing 1)
    goto(app, "cost.py")
    assert app.selectbox(key="cost_task").options == tasks
    goto(app, "sessions.py")
    assert app.dataframe[0].value.equals(sessions)
    assert n == {"prepare": 0, "compute": 0, "unpickle": 0}
    # the held result is one object for every hit
    stamp = data.db_stamp(db)
    shared = metrics._suite.shared(stamp, COST, None, None, ())
    assert metrics._suite.shared(stamp, COST, None, None, ()) is shared
    assert n["compute"] == 0


def test_what_a_page_gets_is_its_own(monkeypatch, tmp_path):
    _fresh_caches()
    db = build_store(tmp_path / "console.duckdb", tmp_path)
    stamp = data.db_stamp(db)
    out, errors = metrics._suite(stamp, COST, None, None, ())
    assert not errors
    by_task = out[("task_cost", "task")]
    want = by_task.clone()
    # a page that changes its frame or its dict in place (the shared result's would be every later page's)
    by_task.insert_column(0, pl.Series("scratch", [0] * by_task.height))
    by_task.columns = [f"x{i}" for i in range(by_task.width)]
    out.clear()
    again, _ = metrics._suite(stamp, COST, None, None, ())
    assert again[("task_cost", "task")].equals(want)
    assert set(again) == set(COST)


def test_a_store_change_gets_new_results_and_drops_the_old(monkeypatch, tmp_path):
    _fresh_caches()
    # a store with the worked example only (one task), then the generated sessions imported into it (four more)
    db = tmp_path / "grows.duckdb"
    settings = load_settings(env={})
    con = connect(db)
    with Writer(con, batch_rows=10_000, flush_s=0.05) as w:
        assert files.import_otlp([FIXTURES / "otlp" / "agent_task_3turns.json"], w, settings).rejected == 0
    con.close()
    app = _app(monkeypatch, db, tmp_path)
    goto(app, "cost.py")
    before = data.db_stamp(db)
    assert len(app.selectbox(key="cost_task").options) == 1

    doc = tmp_path / "generated_sessions.json"
    doc.write_text(json.dumps(otlp_document()))
    con = connect(db)
    with Writer(con, batch_rows=10_000, flush_s=0.05) as w:
        assert files.import_otlp([doc], w, settings).rejected == 0
    con.close()
    after = data.db_stamp(db)
    assert after != before

    n = _count_loads(monkeypatch)
    goto(app, "cost.py")   # the new stamp: computed again, with the new tasks
    assert n["prepare"] == 1
    assert len(app.selectbox(key="cost_task").options) == 5   # the worked example's task + sess-gen-01…04's
    # the result held for the earlier stamp is gone (not left to the entry bound): asking for it computes again
    n.update(prepare=0)
    metrics._suite.shared(before, COST, None, None, ())
    assert n["prepare"] == 1
