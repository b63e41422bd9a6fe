"""AppTest helpers and page checks shared by the console tests on DuckDB (test_console_app.py) and on
ClickHouse (test_console_clickhouse.py): the same store (test_console_store.py), the same expected values."""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa
from streamlit.testing.v1 import AppTest
from test_console_store import WORKED_SESSION


def fresh_view(at: AppTest) -> AppTest:
    """The module's shared AppTest, ready for the next test that only reads (goes to a page and reads it): no URL
    parameters, and the sidebar filters back to their defaults (the next run takes them from the empty URL, as a
    new browser session would). Tests that change widgets build their own AppTest."""
    at.query_params.clear()
    if "_f_last" in at.session_state:
        del at.session_state["_f_last"]
    return at


def goto(at: AppTest, file: str, **qp) -> AppTest:
    at.switch_page(f"views/{file}")
    for k, v in qp.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


SQL_RUN = "FormSubmitter:sql_form-Run query"  # the SQL page's run button


def check_sql_refused(at: AppTest, sql: str, message: str) -> None:
    """The SQL page refuses ``sql`` with ``message`` and shows no result."""
    goto(at, "sql.py")
    at.text_area(key="sql_text").input(sql)
    at.button(key=SQL_RUN).click().run()
    assert not at.dataframe
    assert message in at.error[0].value


def df_of(at: AppTest, i: int = 0) -> pl.DataFrame:
    return pl.from_pandas(at.dataframe[i].value)


def check_worked_timeline(app: AppTest) -> None:
    goto(app, "session.py", session=WORKED_SESSION)
    calls = df_of(app)
    # METRICS.md worked example, per call: cold, then X = 0 (hit), then X = 1808 evicted_partial
    assert calls["prompt_tokens"].to_list() == [3412, 4892, 7357]
    assert calls["r_eff"].to_list() == [None, 3408, 4880]
    assert calls["reprefill_tokens"].to_list() == [None, 0, 1808]
    assert calls["hit_class"].to_list() == [None, "hit", "partial"]
    # issue 20: the first call hit 3072 tokens the session never stored (prior_hit, not cold); no KV events prove the
    # third call's shortfall an eviction: unexplained (X keeps the 1808; its band is [0, 1808])
    assert calls["miss_cause"].to_list() == ["prior_hit", None, "unexplained"]
    assert calls["reprefill_low_tokens"].to_list() == [None, 0, 0]
    assert calls["reprefill_high_tokens"].to_list() == [None, 0, 1808]
    assert [round(g, 3) if g is not None else None for g in calls["gap_before_s"]] == [None, 0.109, 41.748]
    assert len(app.get("vega_lite_chart")) == 1
    labels = {m.label: m.value for m in app.metric}
    assert labels["calls"] == "3" and labels["ΣP prompt (tokens)"] == "15,661"


def check_instance_change(app: AppTest) -> pl.DataFrame:
    """sess-gen-02's timeline; returns its call table for backend-specific checks."""
    goto(app, "session.py", session="sess-gen-02")
    calls = df_of(app)
    assert calls["instance"].to_list() == ["10.42.7.31:8000", "10.42.7.32:8000", "10.42.7.32:8000"]
    # call 2 moved to B: routed_away; R_eff = floor(min(1500, 2599)/16)*16 = 1488, C = 0 → X = 1488
    # (the first call hit 512 tokens it never stored: prior_hit since issue 20)
    assert calls["miss_cause"].to_list() == ["prior_hit", "routed_away", None]
    assert calls["reprefill_tokens"].to_list() == [None, 1488, 0]
    assert "moved to instance" in app.get("vega_lite_chart")[0].proto.spec  # the instance-change rule layer
    return calls


def charts_of(at: AppTest) -> list[tuple[dict, pl.DataFrame]]:
    """Every Altair chart on the page: (its Vega-Lite spec, the data Streamlit sent with it)."""
    out = []
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        frames = [pl.from_arrow(pa.ipc.open_stream(d.data.data).read_all()) for d in el.proto.datasets]
        out.append((spec, frames[0] if frames else pl.DataFrame()))
    return out


def reload(at: AppTest, file: str, timeout: float = 60) -> AppTest:
    """A new browser session opening the page with the URL ``at`` shows now (a reload, a shared link)."""
    fresh = AppTest.from_file(at._script_path, default_timeout=timeout)
    url = dict(at.query_params)
    fresh.query_params.update(url)
    fresh.run()  # AppTest needs a first run before it can switch pages (st.navigation registers them)
    fresh.query_params.clear()
    fresh.query_params.update(url)  # the URL as it was, whatever that first run wrote
    fresh.switch_page(f"views/{file}")
    fresh.run()
    assert not fresh.exception, [e.value for e in fresh.exception]
    return fresh
