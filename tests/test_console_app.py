"""The console under Streamlit's AppTest: every page renders, key numbers equal the metrics API on the same
store, filters round-trip through the URL, the SQL page refuses writes and file access."""

from __future__ import annotations

import math

import polars as pl
import pytest
from console_checks import (
    charts_of,
    check_instance_change,
    check_sql_refused,
    check_worked_timeline,
    df_of,
    fresh_view,
    goto,
    reload,
)
from streamlit.testing.v1 import AppTest
from test_console_store import LLAMA, QWEN, WORKED_SESSION, build_store

from agentobs.console import APP, charts, saved, ui
from agentobs.console.filters import Filters, from_query_params, to_query_params
from agentobs.console.shell import PAGES
from agentobs.errors import InputError
from agentobs.metrics import compute
from agentobs.source import as_source

TIMEOUT = 60


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    return build_store(tmp / "console.duckdb", tmp)


def _env(mp, db, queries):
    mp.setenv("AGENTOBS_DB", str(db))
    mp.setenv("AGENTOBS_CONSOLE_QUERIES", str(queries))
    mp.delenv("AGENTOBS_CONFIG", raising=False)


def _started():
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture
def app(db, monkeypatch, tmp_path):
    """A new AppTest (a new browser session) for a test that changes widgets or session state."""
    _env(monkeypatch, db, tmp_path / "queries.json")
    return _started()


@pytest.fixture(scope="module")
def shared_app(db, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        _env(mp, db, tmp_path_factory.mktemp("queries") / "queries.json")
        yield _started()


@pytest.fixture
def view(shared_app):
    """The module's one AppTest, for a test that only reads (goes to a page, reads it): started once."""
    return fresh_view(shared_app)


@pytest.mark.parametrize("file,title", [(p[0], p[1]) for p in PAGES])
def test_every_page_renders(view, file, title):
    goto(view, file)
    assert view.title[0].value == title
    # every page states its view window and basis under the title
    assert view.caption[0].value.startswith("View: all data")


def test_sessions_table_numbers_equal_metrics_api(view, db):
    goto(view, "sessions.py")
    df = df_of(view)
    # 1 worked-example session + 4 generated ones, each once
    assert sorted(df["session_id"]) == sorted([WORKED_SESSION, "sess-gen-01", "sess-gen-02", "sess-gen-03",
                                               "sess-gen-04"])
    api = compute("reuse", db=as_source(str(db)), by="session")
    for sid in df["session_id"]:
        shown = df.filter(pl.col("session_id") == sid).row(0, named=True)
        want = api.filter(pl.col("session_id") == sid).row(0, named=True)
        assert shown["hit_rate"] == pytest.approx(want["hit_rate"])
        assert shown["reuse_hit_rate"] == pytest.approx(want["reuse_hit_rate"], nan_ok=True)
    w = df.filter(pl.col("session_id") == WORKED_SESSION).row(0, named=True)
    # METRICS.md worked example: H = 9552/15661, U = (3408+3072)/(3408+4880), X = 1808
    assert w["hit_rate"] == pytest.approx(9552 / 15661)
    assert w["reuse_hit_rate"] == pytest.approx(6480 / 8288)
    assert w["reprefill_tokens"] == 1808
    assert (w["calls"], w["prompt_tokens"], w["cached_tokens"]) == (3, 15661, 9552)
    # each row links to its timeline with the session in the URL
    assert w["open"].startswith("./session?session=sess-0199e1a2")


def test_sessions_sort_and_search(app):
    goto(app, "sessions.py")
    app.selectbox(key="sess_sort").set_value("most prompt tokens").run()
    df = df_of(app)
    # ΣP: worked 15661, gen-03 16200, gen-01 9500, gen-02 8000, gen-04 3100
    assert df["session_id"].to_list() == ["sess-gen-03", WORKED_SESSION, "sess-gen-01", "sess-gen-02", "sess-gen-04"]
    app.text_input(key="sess_search").input("GEN-0").run()
    assert sorted(df_of(app)["session_id"]) == ["sess-gen-01", "sess-gen-02", "sess-gen-03", "sess-gen-04"]


def test_open_timeline_button_carries_session_and_filters(app):
    goto(app, "sessions.py", model=QWEN)
    app.selectbox(key="sess_pick").set_value("sess-gen-03")
    app.button(key="sess_open").click().run()
    assert not app.exception
    assert app.title[0].value == "Session timeline"
    assert app.query_params["session"] == "sess-gen-03"
    assert app.query_params["model"] == QWEN


def test_session_timeline_worked_example(view, db):
    check_worked_timeline(view)


def test_session_timeline_marks_instance_change(view):
    check_instance_change(view)


def test_unknown_session_suggests_the_nearest(view):
    goto(view, "session.py", session="sess-gen-2")
    assert "no calls for session 'sess-gen-2'" in view.error[0].value
    assert "did you mean" in view.error[0].value


def test_overview_kpis_equal_metrics_api(view, db):
    goto(view, "overview.py")
    reuse = compute("reuse", db=as_source(str(db)), by="model")
    rep = compute("reprefill", db=as_source(str(db)), by="model")
    assert [s.value for s in view.subheader][:2] == sorted(reuse["model"].to_list(), key=reuse["model"].to_list().index)
    metrics = [(m.label, m.value) for m in view.metric]
    u = [v for label, v in metrics if label == "Session reuse hit rate U"]
    share = [v for label, v in metrics if label == "Re-prefill share (tokens)"]
    for i, model in enumerate(reuse["model"]):
        r = reuse.row(i, named=True)
        x = rep.filter(pl.col("model") == model).row(0, named=True)
        assert u[i] == f"{100 * r['reuse_hit_rate']:.1f} %"
        assert share[i] == f"{100 * x['share_of_cache_tokens']:.1f} %"
    # ITL p99 from the metric `itl`, equal to itl_tail's p99 of the same gaps (the ITL tails page)
    itl, tail = compute("itl", db=as_source(str(db)), by="model"), compute("itl_tail", db=as_source(str(db)), by="model")
    shown = [v for label, v in metrics if label == "ITL p99"]
    for i, model in enumerate(reuse["model"]):
        p99 = itl.filter(pl.col("model") == model)["p99_ms"]
        assert p99.to_list() == tail.filter(pl.col("model") == model)["p99_ms"].to_list()
        assert shown[i] == (ui.ms(p99[0]) if p99.len() else "–")
    assert any(v != "–" for v in shown)  # the fixture store streams: at least one model has gaps
    # `all` has no previous period: no deltas
    assert all(m.delta in (None, "") for m in view.metric)


def test_overview_ttft_p99_is_the_metrics_overall_p99(view, db):
    # "Turn-resume TTFT p99" per model = `agentobs metrics turn_resume_ttft --by model`'s overall row (gap bucket
    # and hit class `all`: the p99 over all the model's calls 2…n), not a gap bucket's row
    import json

    from click.testing import CliRunner

    from agentobs.cli import cli

    res = CliRunner().invoke(cli, ["metrics", "turn_resume_ttft", "--by", "model", "--format", "json", "--db", str(db)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    overall = {r["model"]: r for r in rows if r["gap_bucket"] == "all" and r["hit_class"] == "all"}
    goto(view, "overview.py")
    models = [s.value for s in view.subheader if s.value in overall]
    shown = [m.value for m in view.metric if m.label == "Turn-resume TTFT p99"]
    assert models and len(shown) == len(models)
    for model, value in zip(models, shown, strict=True):
        p99 = overall[model]["ttft_p99_s"]
        assert value == ui.secs(p99)
        # the overall row covers every bucket row's calls (it is the model's, not one bucket's)
        buckets = [r for r in rows if r["model"] == model and r["gap_bucket"] != "all"]
        assert len(buckets) > 1 and overall[model]["calls"] == sum(r["calls"] for r in buckets)


def test_overview_with_window_shows_change_vs_previous(view):
    goto(view, "overview.py", window="30d")
    # the previous 30 days hold no calls: the metrics there are empty, so still no delta, and no exception
    assert view.metric and not view.exception


def test_overview_change_vs_previous_equals_metrics_api_of_both_periods(app, db, monkeypatch):
    # [09:30, 09:50) holds sess-gen-01…04; the period before, [09:10, 09:30), the worked example (Qwen only).
    # The page computes both, and the findings, from one preparation (the previous period is the same run moved
    # back a period); the delta must equal the metrics API on each period prepared on its own
    from agentobs.metrics.run import MetricRun

    prepared = []
    real = MetricRun._prepare
    monkeypatch.setattr(MetricRun, "_prepare", lambda self: (prepared.append((self.since, self.until)), real(self)))
    goto(app, "overview.py", since="2026-10-14T09:30:00", until="2026-10-14T09:50:00")
    assert len(prepared) == 1   # nothing of this window was cached yet: one preparation served the whole page
    monkeypatch.undo()
    now = compute("reuse", db=as_source(str(db)), by="model", since="2026-10-14T09:30:00", until="2026-10-14T09:50:00")
    before = compute("reuse", db=as_source(str(db)), by="model", since="2026-10-14T09:10:00", until="2026-10-14T09:30:00")
    assert before["model"].to_list() == [QWEN]
    u = [m for m in app.metric if m.label == "Session reuse hit rate U"]
    models = now["model"].to_list()
    q = u[models.index(QWEN)]
    u_now = now.filter(pl.col("model") == QWEN)["reuse_hit_rate"][0]
    assert before["reuse_hit_rate"][0] == pytest.approx(6480 / 8288)   # the worked example: U = 6480/8288
    assert q.value == f"{100 * u_now:.1f} %"
    assert q.delta == f"{100 * (u_now - 6480 / 8288):+.1f} pp"   # a change of a share: percentage points
    # Llama had no calls the period before: no delta
    assert u[models.index(LLAMA)].delta in (None, "")


def test_a_page_prepares_once_for_all_its_sections(app, monkeypatch):
    # KV rent & capacity shows three metrics (idle_kv_rent, capacity, concurrency): the first section computes
    # the page's default pairs from one preparation, the next two read the cache; and the page does not
    # compute other pages' pairs (the Overview's per-model KPIs, the per-task costs)
    from agentobs.metrics.run import MetricRun

    computed = []
    prepared = []
    real_prepare, real_compute = MetricRun._prepare, MetricRun.compute
    monkeypatch.setattr(MetricRun, "_prepare", lambda self: (prepared.append(1), real_prepare(self)))
    monkeypatch.setattr(MetricRun, "compute",
                        lambda self, name, by=None: (computed.append((name, by)), real_compute(self, name, by))[1])
    goto(app, "kv_rent.py", since="2026-10-14T09:00:00", until="2026-10-14T10:00:00")   # a window not cached yet
    assert len(prepared) == 1
    assert sorted(n for n, _ in computed) == ["capacity", "concurrency", "idle_kv_rent"]
    monkeypatch.undo()


def test_filters_in_url_restrict_every_listing(app, db):
    goto(app, "sessions.py", model=LLAMA)
    assert app.sidebar.multiselect(key="f_model").value == [LLAMA]
    assert sorted(df_of(app)["session_id"]) == ["sess-gen-02", "sess-gen-04"]
    # the filter stays in the URL when moving to another page
    goto(app, "engines.py")
    assert app.query_params.get("model") == LLAMA


def test_widget_change_updates_url(app):
    goto(app, "sessions.py")
    app.sidebar.multiselect(key="f_task_type").set_value(["researcher"]).run()
    assert app.query_params["task_type"] == "researcher"
    assert sorted(df_of(app)["session_id"]) == ["sess-gen-02", "sess-gen-04"]
    app.sidebar.selectbox(key="f_window").set_value("15m").run()
    assert app.query_params["window"] == "15m"


def test_bad_url_values_warn_and_page_still_renders(view):
    goto(view, "sessions.py", window="3 weeks", since="yesterday", instance="10.9.9.9:1")
    warnings = " | ".join(w.value for w in view.sidebar.warning)
    assert "ignored window='3 weeks'" in warnings
    assert "ignored since='yesterday'" in warnings
    assert "no data for instance=10.9.9.9:1" in warnings


def test_engines_page(view, db):
    goto(view, "engines.py")
    inst = df_of(view, 0)
    assert sorted(inst["instance"]) == ["10.42.7.31:8000", "10.42.7.32:8000", "10.42.7.40:30000"]
    # 3 scrapes for each vLLM instance, 1 for SGLang
    assert dict(zip(inst["instance"], inst["scrapes"], strict=True)) == {
        "10.42.7.31:8000": 3, "10.42.7.32:8000": 3, "10.42.7.40:30000": 1}
    fleet = df_of(view, 1)
    api = compute("fleet_hit_rate", db=as_source(str(db)), by="instance")
    assert fleet.columns == api.columns
    shown = dict(zip(fleet["instance"], fleet[fleet.columns[-1]], strict=True))
    want = dict(zip(api["instance"], api[api.columns[-1]], strict=True))
    assert shown.keys() == want.keys()
    # every vLLM counter step adds 9,000 hits of 12,000 queries (tests/test_console_store.py), and the counters were
    # created inside the view (their `_created` sample), so the first scrape's totals count too (fleet_hit_rate,
    # docs/metrics.md): (5,637,408 + 2 × 9,000) / (6,475,530 + 2 × 12,000) = 0.870126
    hr = next(c for c in api.columns if "hit_rate" in c)
    a_row = api.filter(pl.col("instance") == "10.42.7.31:8000").row(0, named=True)
    assert a_row[hr] == pytest.approx(5_655_408 / 6_499_530)
    assert len(view.get("vega_lite_chart")) >= 2


def test_sql_page_runs_a_query(app):
    goto(app, "sql.py")
    app.text_area(key="sql_text").input("SELECT session_id, calls FROM sessions ORDER BY calls DESC, session_id")
    app.button(key="FormSubmitter:sql_form-Run query").click().run()
    df = df_of(app)
    assert df.height == 5 and df["calls"].to_list() == [3, 3, 3, 3, 2]
    assert "5 rows" in app.success[0].value
    assert len(app.get("download_button")) == 2


def test_sql_page_row_cap_says_truncated(app):
    goto(app, "sql.py")
    app.text_area(key="sql_text").input("SELECT * FROM range(100)")
    app.number_input[0].set_value(7)
    app.button(key="FormSubmitter:sql_form-Run query").click().run()
    assert df_of(app).height == 7
    assert "truncated: showing the first 7 rows" in app.warning[0].value


@pytest.mark.parametrize("sql,message", [
    ("DROP TABLE spans", "refused: DROP statements are not allowed"),
    ("INSERT INTO ingest_log VALUES (now(), 'x', 'y', 1, 0, '')", "refused: INSERT statements are not allowed"),
    ("COPY spans TO '/tmp/x.csv'", "refused: COPY statements are not allowed"),
    ("ATTACH '/tmp/other.duckdb'", "refused: ATTACH statements are not allowed"),
    ("INSTALL httpfs", "refused: LOAD statements are not allowed"),  # DuckDB classifies INSTALL as LOAD
    ("LOAD httpfs", "refused: LOAD statements are not allowed"),
    ("SELECT * FROM read_csv('/etc/passwd')", "refused: file and network access is disabled"),
    ("SELECT * FROM 'https://example.com/x.parquet'", "refused: file and network access is disabled"),
    ("SELECT 1; SELECT 2", "one statement at a time, got 2"),
])
def test_sql_page_refuses(view, sql, message):
    check_sql_refused(view, sql, message)


def test_saved_queries_roundtrip(app, tmp_path):
    goto(app, "sql.py")
    app.text_area(key="sql_text").input("SELECT 42 AS answer")
    app.text_input(key="sql_save_name").input("my answer")
    app.button(key="FormSubmitter:sql_form-Save query").click().run()
    assert "saved 'my answer' to" in app.success[0].value
    assert saved.user_queries(tmp_path / "queries.json") == {"my answer": "SELECT 42 AS answer"}
    app.text_area(key="sql_text").input("SELECT 1")
    app.button(key="FormSubmitter:sql_form-Run query").click().run()
    app.selectbox(key="sql_pick").set_value("my answer").run()
    assert app.text_area(key="sql_text").value == "SELECT 42 AS answer"


def test_cost_page_drill_box_lists_the_costliest_and_a_link_opens_any(app, db, monkeypatch):
    # the box lists ui.DRILL_TASKS of the costliest tasks (task_cost's order); a store with more tasks says so, and a
    # link's ?task= still opens a task beyond the list. With the limit at 2 on the console store:
    from agentobs.console import ui

    monkeypatch.setattr(ui, "DRILL_TASKS", 2)
    api = compute("task_cost", db=as_source(str(db)), by="task")
    ids = api["task_id"].to_list()
    assert len(ids) > 3
    goto(app, "cost.py", task=ids[-1])  # the cheapest task: not among the first two
    box = app.selectbox(key="cost_task")
    assert box.options == ids[:2] + [ids[-1]] and box.value == ids[-1]
    assert any(f"the 2 costliest of {len(ids)} tasks" in c.value for c in app.caption)
    assert df_of(app, len(app.dataframe) - 2)["task_id"].to_list() == [ids[-1]]


def test_cost_page_drills_to_a_task(app, db):
    goto(app, "cost.py")
    api = compute("task_cost", db=as_source(str(db)), by="task")
    app.selectbox(key="cost_task").set_value("task-sess-gen-03").run()
    calls = df_of(app, len(app.dataframe) - 1)
    assert calls["attempt"].to_list() == [1, 2, 1]  # the failed call, its retry, the next turn
    assert calls["status"].to_list() == ["error", "ok", "ok"]
    shown = df_of(app, len(app.dataframe) - 2)
    assert shown["task_id"].to_list() == ["task-sess-gen-03"]
    want = api.filter(pl.col("task_id") == "task-sess-gen-03")
    assert shown.columns == want.columns
    for c in want.columns:
        a, b = shown[c][0], want[c][0]
        assert a == b or (isinstance(a, float) and math.isclose(a, b, rel_tol=1e-9)), c


def test_missing_db_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTOBS_DB", str(tmp_path / "nope.duckdb"))
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    assert not at.exception
    assert "no agentobs database at" in at.error[0].value and "agentobs demo" in at.error[0].value


# -- pure parts -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("qp,warning", [
    ({"window": "2h"}, "ignored window='2h': choose one of 15m, 1h, 6h, 24h, 7d, 30d, all"),
    ({"since": "last tuesday"}, "ignored since='last tuesday': not an ISO-8601 time or epoch seconds"),
    ({"until": "2026-13-01"}, "ignored until='2026-13-01': not an ISO-8601 time or epoch seconds"),
    ({"since": "2026-10-14T10:00:00", "until": "2026-10-14T09:00:00"},
     "ignored since/until: since 2026-10-14 10:00:00 is not before until 2026-10-14 09:00:00"),
])
def test_filter_params_malformed(qp, warning):
    f = from_query_params(qp)
    assert f.warnings == (warning,)
    assert (f.window, f.since, f.until) == ("all", None, None)


def test_filter_params_roundtrip():
    f = from_query_params({"window": "6h", "instance": ["a:1", "b:2"], "model": "m1,m2", "task_type": "x",
                           "since": "2026-10-14T09:00:00Z"})
    assert f == Filters(window="6h", instance=("a:1", "b:2"), model=("m1", "m2"), task_type=("x",),
                        since=from_query_params({"since": "1791968400"}).since)
    assert from_query_params(to_query_params(f)) == f
    assert to_query_params(Filters()) == {}  # defaults stay out of the URL


def test_saved_queries_file_errors(tmp_path):
    p = tmp_path / "q.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match=r"q.json: invalid JSON .* at line 1 column 2"):
        saved.user_queries(p)
    assert saved.load(p) == list(saved.EXAMPLES)  # examples still load
    p.write_text('["SELECT 1"]')
    with pytest.raises(InputError, match=r'expected a JSON object \{"name": "SELECT ..."\}'):
        saved.user_queries(p)
    with pytest.raises(InputError, match="reserved for the built-in examples"):
        saved.save("example: mine", "SELECT 1", tmp_path / "ok.json")


def test_findings_page_matches_findings_run(view, db):
    from agentobs.console.findings import head
    from agentobs.findings import run

    goto(view, "findings.py")
    found = run(as_source(str(db)))
    n = len(found)
    if n == 0:
        assert view.success[0].value == "No findings in this view."
    else:
        assert view.caption[1].value.startswith(f"{n} finding(s)")
    # one expander per finding (the sidebar has its own), in the ledger's order, each label naming its scope (one
    # rule firing on several instances gives several findings that must tell apart), then the evidence per instance
    assert len(view.main.expander) == n + 1
    assert [e.label for e in view.main.expander[:-1]] == [head(f) for f in found]
    assert all(f.scope.instance is None or f.scope.instance in head(f) for f in found)
    ev = view.main.expander[-1]
    assert ev.label == "Evidence available per instance"
    # the console store (tests/test_console_store.py): two vLLM instances and one SGLang, each scraped (vllm_metrics.prom
    # and sglang_metrics.prom carry the preemption / retraction and token counters), no KV events; the pools are
    # vLLM's num_gpu_blocks × block_size (18,826 × 16 = 301,216) and SGLang's max_total_num_tokens (427,051)
    rows = ev.dataframe[0].value.to_dict("records")
    assert [(r["instance"], r["engine"], r["kv_events_with_sessions"], r["preemption_counter"], r["pool_tokens"])
            for r in rows] == [("10.42.7.31:8000", "vllm", False, True, 301216),
                               ("10.42.7.32:8000", "vllm", False, True, 301216),
                               ("10.42.7.40:30000", "sglang", False, True, 427051)]
    assert {r["evidence"] for r in rows} == {"scrapes (preemptions, token counters) and the pool size"}


def _render_one():
    from agentobs.console import findings
    from agentobs.findings.finding import Evidence, Finding, Scope, Tax

    tax = Tax(tokens_week=1.2e9, usd_week=345.6, basis="GPU-time, usd_per_hour=2.5; window scaled ×84 to a week")
    findings.render(Finding(
        rule="prefix_caching_off", title="Prefix caching is off", severity="high",
        scope=Scope(instance="10.42.7.31:8000"), evidence=Evidence((("reprefill_tokens", 1808),), "SELECT 1"),
        tax=tax, recoverable=tax, confidence="high", remediation="vllm serve ... --enable-prefix-caching"),
        expanded=True)


def test_finding_renders_evidence_money_and_copyable_fix():
    at = AppTest.from_function(_render_one, default_timeout=TIMEOUT).run()
    assert not at.exception
    # the ledger's order in the label: $/week at stake first, then the title and the severity
    # cents, as the CLI prints; the scope (here an instance) tells apart one rule's findings on several instances
    assert at.expander[0].label == "**$345.60/week** · Prefix caching is off · instance: 10.42.7.31:8000 · high"
    assert "vllm serve ... --enable-prefix-caching" in [c.value for c in at.code]  # st.code has a copy button
    assert at.table[0].value.to_dict("list") == {"number": ["reprefill_tokens"], "value": ["1,808"]}
    assert [m.value for m in at.metric][:2] == ["$345.60", "$345.60"]  # tax and recoverable, per week


# -- charts: their data is the metric's output ----------------------------------------------------------------
def test_turn_resume_chart_data_is_the_metric_output(view, db):
    goto(view, "turn_resume.py")
    api = compute("turn_resume_ttft", db=as_source(str(db)), by="instance")
    shown = charts_of(view)
    assert len(shown) == api["instance"].n_unique() > 1   # one small chart per instance, none summing them
    for spec, data in shown:
        inst = spec["title"].removeprefix("instance: ")
        want = api.filter((pl.col("instance") == inst) & (pl.col("gap_bucket") != "all")).drop("instance")
        assert data.columns == want.columns
        assert data.sort("gap_bucket", "hit_class").to_dicts() == want.sort("gap_bucket", "hit_class").to_dicts()
        # one bar per gap bucket × hit class: nothing to stack or add up
        assert data.select("gap_bucket", "hit_class").is_unique().all()
        assert spec["encoding"]["y"]["field"] == "ttft_p50_s" and "stack" not in spec["encoding"]["y"]
        # miss red, partial amber, hit green: the colours of every chart (charts.CLASS_COLORS)
        scale = spec["encoding"]["color"]["scale"]
        assert dict(zip(scale["domain"], scale["range"], strict=True)) == {
            c: charts.CLASS_COLORS[c] for c in ("hit", "partial", "miss")}
        assert charts.CLASS_COLORS["miss"] == "#c62828"


def test_itl_chart_data_is_the_metric_output(view, db):
    goto(view, "itl.py")
    api = compute("itl_tail", db=as_source(str(db)), by="instance").filter(pl.col("method") == "per_chunk")
    shown = charts_of(view)
    assert shown and len(shown) == api.height
    for spec, data in shown:
        inst = spec["title"].removeprefix("instance: ")
        row = api.filter(pl.col("instance") == inst).row(0, named=True)
        got = {(r["series"], r["percentile"]): r["ms"] for r in data.to_dicts()}
        want = {(series, pctl): row[col] for series, cols in charts.ITL_SERIES.items()
                for pctl, col in zip(("p50", "p99"), cols, strict=True) if row[col] is not None}
        assert got == pytest.approx(want)
        assert ("a long prefill overlapping", "p99") in got or row["p99_with_long_prefill_ms"] is None


def test_overview_chart_per_model_is_the_metric_output(view, db):
    goto(view, "overview.py")
    api = compute("turn_resume_ttft", db=as_source(str(db)), by="model")
    # the TTFT charts (the first screen's tax-over-time chart, coloured by miss cause, is the ledger's: see
    # test_findings_ledger and the browser test)
    shown = [(spec, data) for spec, data in charts_of(view)
             if spec.get("encoding", {}).get("color", {}).get("field") != "cause"]
    models = [s.value for s in view.subheader if s.value in set(api["model"])]
    assert len(shown) == len(models) > 0
    for model, (_spec, data) in zip(models, shown, strict=True):
        want = api.filter((pl.col("model") == model) & (pl.col("gap_bucket") != "all")).drop("model")
        assert data.sort("gap_bucket", "hit_class").to_dicts() == want.sort("gap_bucket", "hit_class").to_dicts()


# -- every view's state in the URL: a reload (a new session on the same URL) restores it ------------------------
def test_turn_resume_state_in_url(app):
    goto(app, "turn_resume.py")
    app.selectbox(key="by_turn_resume_ttft").set_value("model").run()
    app.radio(key="trt_stat").set_value("p99").run()
    assert (app.query_params["by"], app.query_params["stat"]) == ("model", "p99")
    again = reload(app, "turn_resume.py")
    assert again.selectbox(key="by_turn_resume_ttft").value == "model"
    assert again.radio(key="trt_stat").value == "p99"
    assert all(spec["encoding"]["y"]["field"] == "ttft_p99_s" for spec, _ in charts_of(again))
    assert {spec["title"] for spec, _ in charts_of(again)} == {f"model: {QWEN}", f"model: {LLAMA}"}


def test_sessions_state_in_url(app):
    goto(app, "sessions.py", model=LLAMA)
    app.text_input(key="sess_search").input("gen-0").run()
    app.selectbox(key="sess_sort").set_value("most calls").run()
    app.number_input(key="sess_limit").set_value(20).run()
    assert {k: app.query_params[k] for k in ("q", "sort", "limit", "model")} == {
        "q": "gen-0", "sort": "most calls", "limit": "20", "model": LLAMA}
    again = reload(app, "sessions.py")
    assert again.text_input(key="sess_search").value == "gen-0"
    assert again.selectbox(key="sess_sort").value == "most calls"
    assert again.number_input(key="sess_limit").value == 20
    assert again.sidebar.multiselect(key="f_model").value == [LLAMA]
    assert df_of(again)["session_id"].to_list() == df_of(app)["session_id"].to_list()


def test_cost_engines_and_kv_rent_state_in_url(app):
    goto(app, "cost.py", by="task_type")
    app.selectbox(key="cost_task").set_value("task-sess-gen-03").run()
    assert app.query_params["task"] == "task-sess-gen-03"
    again = reload(app, "cost.py")
    assert again.selectbox(key="cost_task").value == "task-sess-gen-03"
    assert df_of(again, len(again.dataframe) - 1)["attempt"].to_list() == [1, 2, 1]
    goto(app, "engines.py")
    app.selectbox(key="eng_metric").set_value("vllm:num_requests_running").run()
    assert app.query_params["metric"] == "vllm:num_requests_running"
    assert reload(app, "engines.py").selectbox(key="eng_metric").value == "vllm:num_requests_running"
    goto(app, "kv_rent.py")
    app.selectbox(key="by_rent").set_value("model").run()
    assert app.query_params["by_rent"] == "model"
    assert reload(app, "kv_rent.py").selectbox(key="by_rent").value == "model"


def test_sql_text_in_url_and_run_again_on_reload(app):
    goto(app, "sql.py")
    sql = "SELECT session_id, calls FROM sessions ORDER BY calls DESC, session_id"
    app.text_area(key="sql_text").input(sql)
    app.number_input(key="sql_cap").set_value(3)
    app.button(key="FormSubmitter:sql_form-Run query").click().run()
    assert (app.query_params["q"], app.query_params["rows"]) == (sql, "3")
    again = reload(app, "sql.py")
    assert again.text_area(key="sql_text").value == sql
    assert again.number_input(key="sql_cap").value == 3
    assert df_of(again)["session_id"].to_list() == df_of(app)["session_id"].to_list()  # the result is back
    assert len(df_of(again)) == 3


def test_bad_page_state_in_url_warns(view):
    goto(view, "turn_resume.py", by="tenant", stat="p42")
    warned = " | ".join(w.value for w in view.warning)
    assert "ignored by='tenant'" in warned and "ignored stat='p42'" in warned
    assert view.selectbox(key="by_turn_resume_ttft").value == "instance"


# -- the server warms the default Overview at start (agentobs.console.serve) ------------------------------------
def test_warm_default_view_makes_the_first_overview_a_cache_hit(db, monkeypatch, tmp_path):
    import streamlit as st

    import agentobs.findings
    from agentobs.console import serve
    from agentobs.metrics.run import MetricRun

    st.cache_data.clear()
    st.cache_resource.clear()   # the metric results (agentobs/console/metrics.py) are held there
    assert serve.warm_default_view(str(db)) == []
    prepared, evaluated = [], []
    real_prepare, real_run = MetricRun._prepare, agentobs.findings.run
    monkeypatch.setattr(MetricRun, "_prepare", lambda self: (prepared.append(1), real_prepare(self)))
    monkeypatch.setattr(agentobs.findings, "run", lambda *a, **k: (evaluated.append(1), real_run(*a, **k))[1])
    monkeypatch.setenv("AGENTOBS_DB", str(db))
    monkeypatch.setenv("AGENTOBS_CONSOLE_QUERIES", str(tmp_path / "queries.json"))
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.run()   # the default page (Overview) of the default view
    assert not at.exception, [e.value for e in at.exception]
    assert app_title(at) == "Overview" and at.metric
    assert prepared == [] and evaluated == []   # every metric and the findings came from the warmed cache


def app_title(at) -> str:
    return at.title[0].value


def test_number_formats_and_markdown_dollars():
    # 3 significant digits with thousands separators and units; counts exact
    assert [ui.sig(v) for v in (0.0321095, 3.3946, 566.3, 1234.5, 0.0)] == ["0.0321", "3.39", "566", "1,230", "0"]
    assert ui.sig(40224576) == "40,224,576"
    assert [ui.usd(v) for v in (1.7528, 0.26312, 99.37, -0.5)] == ["$1.75", "$0.263", "$99.4", "-$0.500"]
    assert [ui.secs(v) for v in (0.0321095, 0.566, 3.3946)] == ["32.1 ms", "566 ms", "3.39 s"]
    assert ui.delta(ui.pct)(0.0123) == "+1.2 pp"
    # table column formats from the column's name and type
    assert ui.number_format("reprefill_cost_usd", pl.Float64) == "$%,.3g"
    assert ui.number_format("ttft_p99_s", pl.Float64) == "%,.3g s"
    assert ui.number_format("rent_paid_token_s", pl.Float64) == "%,.3g token-s"
    assert ui.number_format("share_of_cache_tokens", pl.Float64) == "percent"
    assert ui.number_format("hit_tokens", pl.Float64) == "%,.0f"
    assert ui.number_format("calls", pl.Int64) == "%,d" and ui.number_format("instance", pl.String) is None
    # two $ on a line would be typeset as LaTeX by Streamlit's Markdown: escaped once, never twice
    assert ui.md("× $/s (METRICS.md §8) … $0.26") == "× \\$/s (METRICS.md §8) … \\$0.26"
    assert ui.md(ui.md("a $ b")) == "a \\$ b"


def test_table_header_states_a_sketch_percentiles_bound():
    """A percentile column with one stated bound beside it (from the hourly sketches) shows it in its header, the
    bound column hidden; a column without one is formatted as before."""
    df = pl.DataFrame({"instance": ["a", "b"], "ttft_p99_s": [2.3, None], "ttft_p99_rel_err": [0.01, None],
                       "gap_p50_s": [1.0, 2.0]})
    cfg = ui.column_config(df)
    assert cfg["ttft_p99_s"]["label"] == "ttft_p99_s ±1%" and cfg["ttft_p99_rel_err"] is None
    assert cfg["gap_p50_s"]["label"] == "gap_p50_s"


def test_sketch_percentiles_shown_with_their_bound(db, monkeypatch, tmp_path):
    """Over the maintained session model (the whole store: whole hours, so the TTFT sketches), the Overview's TTFT
    p99 tile is the metric's overall p99 with the bound the metric states, and the Turn-resume page says where its
    percentiles come from."""
    import shutil

    from agentobs.config import Settings
    from agentobs.model import connect, state

    copy = tmp_path / "state.duckdb"
    shutil.copy(db, copy)
    con = connect(copy)
    state.rebuild(con, Settings())
    con.close()
    rows = compute("turn_resume_ttft", db=as_source(str(copy)), by="model", settings=Settings())
    overall = [r for r in rows.to_dicts() if r["gap_bucket"] == "all"]
    assert overall and all(r["ttft_p99_rel_err"] == 0.01 for r in overall)
    _env(monkeypatch, copy, tmp_path / "queries.json")
    at = _started()
    goto(at, "overview.py")
    shown = [m.value for m in at.metric if m.label == "Turn-resume TTFT p99"]
    assert shown and set(shown) <= {ui.secs(r["ttft_p99_s"]) + " ±1%" for r in overall} | {"–"}, shown
    assert any(v != "–" for v in shown)
    goto(at, "turn_resume.py")
    assert any("within ±1% of the exact one" in c.value for c in at.caption)
