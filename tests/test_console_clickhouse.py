"""The console on ClickHouse (chDB) under Streamlit's AppTest: the same store as tests/test_console_app.py (the
METRICS.md worked example + generated sessions + engine scrapes, built by test_console_store.build_store),
copied into an on-disk chDB database with ``load.from_duckdb``. Every page renders, and the numbers it shows
equal the DuckDB side's: the metrics API on the DuckDB store, and the hand-computed values of the DuckDB tests.
Also: filters in the URL, the SQL page on ClickHouse (refusals table), the schema browser, the data stamp,
and ``agentobs console --backend clickhouse`` end to end (a real Streamlit server on a free loopback port)."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import polars as pl
import pytest

pytest.importorskip("chdb", reason="chdb (in-process ClickHouse) is not installed: pip install 'agentobs[clickhouse]'")

from console_checks import (  # noqa: E402
    SQL_RUN,
    check_instance_change,
    check_sql_refused,
    check_worked_timeline,
    df_of,
    fresh_view,
    goto,
)
from streamlit.testing.v1 import AppTest  # noqa: E402
from test_console_store import QWEN, WORKED_SESSION, build_store  # noqa: E402

from agentobs.backends.clickhouse import load, model  # noqa: E402
from agentobs.backends.clickhouse.conn import ClickHouse  # noqa: E402
from agentobs.backends.clickhouse.sql import run_query as ch_run_query  # noqa: E402
from agentobs.config import load_settings  # noqa: E402
from agentobs.console import APP, data, ui  # noqa: E402
from agentobs.console.shell import PAGES  # noqa: E402
from agentobs.errors import QueryError, StoreError  # noqa: E402
from agentobs.metrics import compute  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.source import as_source

TIMEOUT = 120
RUN = SQL_RUN


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(DuckDB store path, chDB URL) holding the same data. The copy is written through its own connection,
    closed before the console opens the path (as `agentobs clickhouse load` then `agentobs console` would)."""
    tmp = tmp_path_factory.mktemp("console_ch")
    db = build_store(tmp / "console.duckdb", tmp)
    url = f"chdb://{tmp / 'ch'}"
    settings = load_settings(env={})
    ch = ClickHouse(url)
    con = connect(db, read_only=True)
    try:
        model.create_tables(ch, settings)
        model.create_views(ch, settings)
        load.from_duckdb(con, ch)
    finally:
        con.close()
        ch.close()
    yield db, url
    data.close_clickhouse(url)  # chDB: one path per process; later modules open their own


def _env(mp, url, queries):
    mp.setenv("AGENTOBS_BACKEND", "clickhouse")
    mp.setenv("AGENTOBS_CLICKHOUSE_URL", url)
    mp.delenv("AGENTOBS_DB", raising=False)
    mp.setenv("AGENTOBS_CONSOLE_QUERIES", str(queries))
    mp.delenv("AGENTOBS_CONFIG", raising=False)


def _started():
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture
def app(stores, monkeypatch, tmp_path):
    """A new AppTest (a new browser session) for a test that changes widgets or session state."""
    _env(monkeypatch, stores[1], tmp_path / "queries.json")
    return _started()


@pytest.fixture(scope="module")
def shared_app(stores, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        _env(mp, stores[1], tmp_path_factory.mktemp("queries") / "queries.json")
        yield _started()


@pytest.fixture
def view(shared_app):
    """The module's one AppTest, for a test that only reads (goes to a page, reads it): started once."""
    return fresh_view(shared_app)


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


# -- every page ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("file,title", [(p[0], p[1]) for p in PAGES])
def test_every_page_renders_on_clickhouse(view, file, title):
    goto(view, file)
    assert view.title[0].value == title
    assert view.caption[0].value.startswith("View: all data")
    assert not view.error, [e.value for e in view.error]  # no metric or read failed on the page
    # the sidebar names the source: ClickHouse and its URL
    assert any(c.value.startswith("ClickHouse: `chdb://") for c in view.sidebar.caption)


def test_stamp_is_the_data_parts_state(stores):
    _, url = stores
    st = data.ch_stamp(url)
    assert st[0] == "clickhouse" and st[1] == url
    parts = dict((t, n) for t, n, _ in st[2])
    # 17 spans of the worked example + generated sessions (3 + 14 calls + agent/tool spans, see build_store):
    # the count equals DuckDB's spans; metric_samples less the vllm:cache_config_info series (not copied)
    con = connect(stores[0], read_only=True)
    try:
        spans = con.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        samples = con.sql("SELECT count(*) FROM metric_samples WHERE metric <> 'vllm:cache_config_info'"
                          ).fetchall()[0][0]
    finally:
        con.close()
    assert parts["spans"] == spans and parts["metric_samples"] == samples
    assert data.ch_stamp(url) == st  # no new data, same stamp (cache hits)


# -- numbers equal the DuckDB side ----------------------------------------------------------------------
def test_sessions_numbers_equal_duckdb(view, stores):
    db, _ = stores
    goto(view, "sessions.py")
    df = df_of(view)
    assert sorted(df["session_id"]) == sorted([WORKED_SESSION, "sess-gen-01", "sess-gen-02", "sess-gen-03",
                                               "sess-gen-04"])
    api = compute("reuse", db=as_source(str(db)), by="session")  # the DuckDB store
    for sid in df["session_id"]:
        shown = df.filter(pl.col("session_id") == sid).row(0, named=True)
        want = api.filter(pl.col("session_id") == sid).row(0, named=True)
        assert shown["hit_rate"] == pytest.approx(want["hit_rate"])
        assert shown["reuse_hit_rate"] == pytest.approx(want["reuse_hit_rate"], nan_ok=True)
    # the listing itself (console SQL, transpiled) equals the DuckDB console's query on the store
    duck = data.sessions(data.db_stamp(db), _no_filters(), None, None)
    cols = ["session_id", "task_id", "task_type", "tenant", "calls", "retries", "instances", "models",
            "first_start", "span_s", "prompt_tokens", "cached_tokens", "output_tokens", "errors"]
    for row in duck.select(cols).iter_rows(named=True):
        shown = df.filter(pl.col("session_id") == row["session_id"]).select(cols).row(0, named=True)
        assert all(same(shown[c], row[c]) for c in cols), (shown, row)
    w = df.filter(pl.col("session_id") == WORKED_SESSION).row(0, named=True)
    # METRICS.md worked example: H = 9552/15661, U = (3408+3072)/(3408+4880), X = 1808
    assert w["hit_rate"] == pytest.approx(9552 / 15661)
    assert w["reuse_hit_rate"] == pytest.approx(6480 / 8288)
    assert w["reprefill_tokens"] == 1808
    assert w["open"].startswith("./session?session=sess-0199e1a2")


def _no_filters():
    from agentobs.console.filters import Filters

    return Filters()


def test_sessions_sort_and_search(app):
    goto(app, "sessions.py")
    app.selectbox(key="sess_sort").set_value("most prompt tokens").run()
    # ΣP: worked 15661, gen-03 16200, gen-01 9500, gen-02 8000, gen-04 3100
    assert df_of(app)["session_id"].to_list() == ["sess-gen-03", WORKED_SESSION, "sess-gen-01", "sess-gen-02",
                                                  "sess-gen-04"]
    app.text_input(key="sess_search").input("GEN-0").run()  # case-insensitive substring
    assert sorted(df_of(app)["session_id"]) == ["sess-gen-01", "sess-gen-02", "sess-gen-03", "sess-gen-04"]


def test_session_timeline_worked_example(view):
    check_worked_timeline(view)


def test_session_timeline_instance_change_and_tools(view):
    check_instance_change(view)
    tools = df_of(view, 1)  # web_search from 32.2 s to 39.8 s of the session (tests/test_console_store.py)
    assert tools["tool_name"].to_list() == ["web_search"]
    assert tools["duration_s"][0] == pytest.approx(7.6)


def test_trace_page_on_clickhouse(view):
    # the worked example's trace found by a call id, its 6 spans in tree order, as on DuckDB (tests/test_trace.py)
    goto(view, "trace.py", call="3e7a1c5d9f4b6083")
    assert not view.error, [e.value for e in view.error]
    assert {m.label: m.value for m in view.metric}["spans"] == "6"
    assert df_of(view)["kind"].to_list() == ["agent", "gateway", "tool", "gateway", "tool", "gateway"]


def test_unknown_session_suggests_the_nearest(view):
    goto(view, "session.py", session="sess-gen-2")  # jaroWinklerSimilarity on ClickHouse
    err = view.error[0].value
    assert "no calls for session 'sess-gen-2'" in err and "did you mean 'sess-gen-0" in err


def test_overview_kpis_equal_duckdb(view, stores):
    db, _ = stores
    goto(view, "overview.py")
    reuse = compute("reuse", db=as_source(str(db)), by="model")
    rep = compute("reprefill", db=as_source(str(db)), by="model")
    assert [s.value for s in view.subheader][:2] == reuse["model"].to_list()
    metrics = [(m.label, m.value) for m in view.metric]
    u = [v for label, v in metrics if label == "Session reuse hit rate U"]
    share = [v for label, v in metrics if label == "Re-prefill share (tokens)"]
    cost = [v for label, v in metrics if label == "Re-prefill cost ($)"]
    assert len(u) == reuse.height == 2
    for i, model_name in enumerate(reuse["model"]):
        r = reuse.row(i, named=True)
        x = rep.filter(pl.col("model") == model_name).row(0, named=True)
        assert u[i] == f"{100 * r['reuse_hit_rate']:.1f} %"
        assert share[i] == f"{100 * x['share_of_cache_tokens']:.1f} %"
        assert cost[i] == ui.usd(x["reprefill_cost_usd"])   # 3 significant digits: $0.000334


def test_engines_page_equals_duckdb(view, stores):
    db, _ = stores
    goto(view, "engines.py")
    inst = df_of(view, 0)
    # 3 scrapes for each vLLM instance, 1 for SGLang
    assert dict(zip(inst["instance"], inst["scrapes"], strict=True)) == {
        "10.42.7.31:8000": 3, "10.42.7.32:8000": 3, "10.42.7.40:30000": 1}
    fleet = df_of(view, 1)
    api = compute("fleet_hit_rate", db=as_source(str(db)), by="instance")
    assert fleet.columns == api.columns
    hr = next(c for c in api.columns if "hit_rate" in c)
    shown = dict(zip(fleet["instance"], fleet[hr], strict=True))
    want = dict(zip(api["instance"], api[hr], strict=True))
    assert shown.keys() == want.keys() and all(same(shown[k], want[k]) for k in want)
    # every vLLM counter step adds 9,000 hits of 12,000 queries (tests/test_console_store.py), and the counters'
    # creation time is inside the view, so the first scrape's totals count too: (5,637,408 + 2 × 9,000) /
    # (6,475,530 + 2 × 12,000) (test_console_app.test_engines_page)
    assert shown["10.42.7.31:8000"] == pytest.approx(5_655_408 / 6_499_530)
    assert len(view.get("vega_lite_chart")) >= 2  # KV usage / queue charts from the raw samples


def test_cost_page_drills_to_a_task(app, stores):
    db, _ = stores
    goto(app, "cost.py")
    app.selectbox(key="cost_task").set_value("task-sess-gen-03").run()
    calls = df_of(app, len(app.dataframe) - 1)
    assert calls["attempt"].to_list() == [1, 2, 1]  # the failed call, its retry, the next turn
    assert calls["status"].to_list() == ["error", "ok", "ok"]
    shown = df_of(app, len(app.dataframe) - 2)
    want = compute("task_cost", db=as_source(str(db)), by="task").filter(pl.col("task_id") == "task-sess-gen-03")
    assert shown.columns == want.columns
    for c in want.columns:
        assert same(shown[c][0], want[c][0]), c


def test_findings_page_equals_duckdb(view, stores):
    from agentobs.findings import run

    db, _ = stores
    goto(view, "findings.py")
    duck = run(as_source(str(db)))
    if not duck:
        assert view.success[0].value == "No findings in this view."
    else:
        assert view.caption[1].value.startswith(f"{len(duck)} finding(s)")
        from agentobs.console.findings import head

        heads = sorted(e.label for e in view.main.expander[:-1])
        assert heads == sorted(head(f) for f in duck)
    # one expander per finding, then the evidence available per instance: DuckDB's table (evidence_sql on each)
    assert len(view.main.expander) == len(duck) + 1
    ev = view.main.expander[-1]
    assert ev.label == "Evidence available per instance"
    from agentobs.model.reuse import evidence_sql
    from agentobs.source import query

    want = query(as_source(str(db)), evidence_sql()).select("instance", "evidence").rows()
    shown = [(r["instance"], r["evidence"]) for r in ev.dataframe[0].value.to_dict("records")]
    assert shown == want and want


def test_whatif_page_equals_duckdb(view, stores):
    # the same replay from ClickHouse as from the DuckDB store (agentobs.findings.whatif.run on each)
    from agentobs.findings.whatif import run

    db, _ = stores
    goto(view, "whatif.py", change=["prefix_cache=off"])
    assert not view.error, [e.value for e in view.error]
    duck = run(as_source(str(db)), ["prefix_cache=off"])
    shown = df_of(view)
    want = duck.table().to_pylist()
    assert shown["figure"].to_list() == [r["figure"] for r in want]
    assert shown["before"].to_list() == pytest.approx([r["before"] for r in want], nan_ok=True)
    assert shown["after"].to_list() == pytest.approx([r["after"] for r in want], nan_ok=True)


# -- filters in the URL ---------------------------------------------------------------------------------
def test_filters_in_url_restrict_every_listing(app):
    goto(app, "sessions.py", model=QWEN, window="15m")
    assert app.sidebar.multiselect(key="f_model").value == [QWEN]
    assert app.sidebar.selectbox(key="f_window").value == "15m"
    # the window ends at the latest call's end (sess-gen-04's 2nd call: base T0 + 600 + 3 × 300, + 202 s, 1 s
    # long = T0 + 1703); 15 minutes before it is T0 + 803. Qwen sessions: the worked example (from T0) and
    # gen-01 (calls ≤ T0 + 680) fall before it; gen-03 (calls from T0 + 1300) is in
    assert df_of(app)["session_id"].to_list() == ["sess-gen-03"]
    goto(app, "engines.py")  # the filters stay in the URL when moving to another page
    assert app.query_params.get("model") == QWEN and app.query_params.get("window") == "15m"


def test_widget_change_updates_url(app):
    goto(app, "sessions.py")
    app.sidebar.multiselect(key="f_task_type").set_value(["researcher"]).run()
    assert app.query_params["task_type"] == "researcher"
    assert sorted(df_of(app)["session_id"]) == ["sess-gen-02", "sess-gen-04"]  # both Llama sessions


def test_bad_url_values_warn_and_page_still_renders(view):
    goto(view, "sessions.py", window="3 weeks", instance="10.9.9.9:1")
    warnings = " | ".join(w.value for w in view.sidebar.warning)
    assert "ignored window='3 weeks'" in warnings and "no data for instance=10.9.9.9:1" in warnings


# -- SQL page -------------------------------------------------------------------------------------------
def test_sql_page_runs_clickhouse_sql(app):
    goto(app, "sql.py")
    assert "ClickHouse SQL" in app.caption[0].value
    app.text_area(key="sql_text").input("SELECT session_id, calls FROM sessions ORDER BY calls DESC, session_id")
    app.button(key=RUN).click().run()
    df = df_of(app)
    assert df["calls"].to_list() == [3, 3, 3, 3, 2]
    assert "5 rows" in app.success[0].value
    assert len(app.get("download_button")) == 2


def test_sql_page_row_cap_says_truncated(app):
    goto(app, "sql.py")
    app.text_area(key="sql_text").input("SELECT number FROM numbers(100)")  # ClickHouse's range()
    app.number_input[0].set_value(7)
    app.button(key=RUN).click().run()
    assert df_of(app).height == 7
    assert "truncated: showing the first 7 rows" in app.warning[0].value


def test_sql_page_examples_run_on_clickhouse(app):
    from agentobs.console import saved

    goto(app, "sql.py")
    for name, _ in saved.EXAMPLES:  # the built-in examples are DuckDB SQL that ClickHouse also reads
        app.selectbox(key="sql_pick").set_value(name).run()
        app.button(key=RUN).click().run()
        assert not app.error, (name, [e.value for e in app.error])
        assert df_of(app).height > 0, name


@pytest.mark.parametrize("sql,message", [
    ("DROP TABLE spans", "only SELECT queries are allowed"),
    ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "refused: file() reaches outside the database"),
    ("SELECT file('/etc/passwd')", "refused: file() reaches outside the database"),
    ("SELECT 1; SELECT 2", "one statement only, got 2"),
])
def test_sql_page_refuses(view, sql, message):
    check_sql_refused(view, sql, message)
    assert "root:" not in " ".join(e.value for e in view.error)


# Every statement below is refused before it reaches ClickHouse (parse + function check), with this message.
REFUSED = [
    ("", "empty query"),
    ("DROP TABLE spans", "only SELECT queries are allowed"),
    ("INSERT INTO spans SELECT * FROM spans", "only SELECT queries are allowed"),
    ("CREATE TABLE t (x Int8) ENGINE = Memory", "only SELECT queries are allowed"),
    ("ALTER TABLE spans DELETE WHERE 1", "only SELECT queries are allowed"),
    ("TRUNCATE TABLE spans", "only SELECT queries are allowed"),
    ("SET readonly = 0", "only SELECT queries are allowed"),
    ("SELECT 1; SELECT 2", "one statement only, got 2"),
    # files: the scalar file() is NOT stopped by readonly = 1 (it returns the file's text)
    ("SELECT file('/etc/passwd')", "refused: file() reaches outside the database"),
    ("SELECT FILE('/etc/passwd')", "refused: FILE() reaches outside the database"),
    ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "refused: file() reaches outside the database"),
    ("SELECT * FROM fileCluster('c', '/etc/*')", "refused: fileCluster() reaches outside the database"),
    ("WITH a AS (SELECT file('/etc/passwd') AS f) SELECT * FROM a", "refused: file() reaches outside"),
    ("SELECT * FROM view(SELECT file('/etc/passwd'))", "refused: file() reaches outside the database"),
    # network and other databases
    ("SELECT * FROM url('http://127.0.0.1:1/x', 'CSV', 'a String')", "refused: url() reaches outside"),
    ("SELECT * FROM s3('http://127.0.0.1:1/bucket/x.csv', 'CSV', 'a String')", "refused: s3() reaches outside"),
    ("SELECT * FROM s3Cluster('c', 'http://127.0.0.1:1/b/x')", "refused: s3Cluster() reaches outside"),
    ("SELECT * FROM remote('127.0.0.1:1', system.one)", "refused: remote() reaches outside"),
    ("SELECT * FROM remoteSecure('127.0.0.1:1', system.one)", "refused: remoteSecure() reaches outside"),
    ("SELECT * FROM cluster('default', system.one)", "refused: cluster() reaches outside"),
    ("SELECT * FROM mysql('127.0.0.1:1', 'd', 't', 'u', 'p')", "refused: mysql() reaches outside"),
    ("SELECT * FROM postgresql('127.0.0.1:1', 'd', 't', 'u', 'p')", "refused: postgresql() reaches outside"),
    ("SELECT * FROM hdfs('hdfs://127.0.0.1:1/x', 'CSV', 'a String')", "refused: hdfs() reaches outside"),
    ("SELECT * FROM azureBlobStorage('x')", "refused: azureBlobStorage() reaches outside"),
    ("SELECT * FROM icebergS3('http://127.0.0.1:1/x')", "refused: icebergS3() reaches outside"),
    ("SELECT * FROM numbers(2) UNION ALL SELECT * FROM url('http://x', 'CSV', 'number UInt64')",
     "refused: url() reaches outside"),
    # processes and the host Python process (chDB)
    ("SELECT * FROM executable('ls', 'TSV', 'a String')", "refused: executable() reaches outside"),
    ("SELECT * FROM Python(data)", "refused: Python() reaches outside"),
    # session settings and output formats
    ("SELECT 1 SETTINGS readonly = 0", "a SETTINGS clause is not allowed"),
    ("SELECT * FROM (SELECT 1 AS x SETTINGS readonly = 0) WHERE x = 1 AND 1 = 1 AND 2 = 2",
     "a SETTINGS clause is not allowed"),
    ("SELECT 1 FORMAT JSON", "a FORMAT clause is not allowed"),
]


@pytest.mark.parametrize("sql,message", REFUSED)
def test_clickhouse_sql_refuses(stores, sql, message):
    ch = data.clickhouse(stores[1])
    with pytest.raises(QueryError) as e:
        ch_run_query(ch, sql)
    assert message in str(e.value)


def test_clickhouse_sql_allows_harmless_table_functions(stores):
    ch = data.clickhouse(stores[1])
    assert ch_run_query(ch, "SELECT count() AS n FROM numbers(5)").table.column("n").to_pylist() == [5]
    # URL string functions are not the url() table function
    assert ch_run_query(ch, "SELECT domain('http://a.example/x') AS d").table.column("d").to_pylist() == ["a.example"]


def test_schema_browser_lists_the_model_views(view):
    goto(view, "sql.py")
    labels = [e.label for e in view.main.expander]
    for name in ("llm_calls", "tool_calls", "turn_gaps", "sessions", "tasks", "instance_config", "call_reuse"):
        assert f"{name} (view)" in labels, name
    assert "spans (table)" in labels and "metric_samples (table)" in labels
    # neither the materialized views that feed the tables nor a metric run's tables
    assert not [x for x in labels if x.startswith(("spans_mv", "agentobs_run_")) or "_agentobs_mv" in x]


# -- the CLI --------------------------------------------------------------------------------------------
def test_cli_console_refuses_a_clickhouse_without_the_model(tmp_path):
    env = dict(os.environ, COLUMNS="400")  # one line of error, not wrapped at 80
    env.pop("AGENTOBS_CONFIG", None)
    r = subprocess.run([sys.executable, "-m", "agentobs.cli", "console", "--backend", "clickhouse",
                        "--clickhouse-url", f"chdb://{tmp_path / 'empty'}", "--port", "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == StoreError.exit_code, r.stderr
    assert "no agentobs model at chdb://" in r.stderr and "agentobs clickhouse init" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # end to end: a real `agentobs console` server on chDB
def test_cli_console_serves_clickhouse_on_loopback(stores, tmp_path):
    """`agentobs console --backend clickhouse --clickhouse-url chdb:///DIR`: the CLI checks the model (a real
    count over spans), starts Streamlit on 127.0.0.1 with the backend in its environment, serves health."""
    _, url = stores
    data.close_clickhouse(url)  # chDB: let go of the path in this process for the child (reopened lazily after)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, COLUMNS="400")
    for k in ("AGENTOBS_CONFIG", "AGENTOBS_BACKEND", "AGENTOBS_CLICKHOUSE_URL", "AGENTOBS_DB"):
        env.pop(k, None)
    log = open(tmp_path / "console.log", "wb")  # noqa: SIM115 - a file, not a pipe nobody drains
    proc = subprocess.Popen([sys.executable, "-m", "agentobs.cli", "console", "--backend", "clickhouse",
                             "--clickhouse-url", url, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:  # readiness: poll the health endpoint (no fixed sleep)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail((tmp_path / "console.log").read_text(errors="replace")[-2000:])
                time.sleep(0.2)
        out = (tmp_path / "console.log").read_text(errors="replace")
        assert f"agentobs console on http://127.0.0.1:{port}/ — ClickHouse {url}" in out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
