"""Cost attribution grouped by task at scale (issue 22): the histogram gets bins computed from the one task_cost
result, not one point per task; the table shows the costliest ``ui.TABLE_TASKS`` and says how many there are; the
totals are sums of that same result and equal the metrics API's."""

from __future__ import annotations

import math

import polars as pl
import pytest
from console_checks import charts_of, df_of, goto
from streamlit.testing.v1 import AppTest
from test_console_store import build_store

from agentobs.console import APP, charts, ui
from agentobs.metrics import compute
from agentobs.source import as_source


def test_histogram_bins_hand_computed():
    # values 0..10 and a null, 5 bins over [0, 10]: width 2; [0,2) 0 1 · [2,4) 2 3 · [4,6) 4 5 · [6,8) 6 7 ·
    # [8,10] 8 9 10 (the maximum in the last bin); the null left out
    out = charts.histogram_data(pl.Series([*range(11), None], dtype=pl.Float64), bins=5)
    assert out["bin_start"].to_list() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert out["bin_end"].to_list() == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert out["count"].to_list() == [2, 2, 2, 2, 3]
    # empty bins stay (a gap in the distribution), NaN left out: 1, 1.5 and 9 over [1, 9] in 4 bins of width 2
    out = charts.histogram_data(pl.Series([1.0, 1.5, float("nan"), 9.0]), bins=4)
    assert out["count"].to_list() == [2, 0, 0, 1]
    # every value equal: one bin of them all; none: no rows
    assert charts.histogram_data(pl.Series([0.5, 0.5, 0.5]), bins=40).rows() == [(0.5, 0.5, 3)]
    assert charts.histogram_data(pl.Series([None], dtype=pl.Float64)).height == 0
    with pytest.raises(ValueError, match="bins must be ≥ 1, got 0"):
        charts.histogram_data(pl.Series([1.0]), bins=0)


def test_cost_by_task_table_is_the_costliest_k_histogram_counts_every_task(tmp_path, monkeypatch):
    db = build_store(tmp_path / "console.duckdb", tmp_path)
    monkeypatch.setenv("AGENTOBS_DB", str(db))
    monkeypatch.setenv("AGENTOBS_CONSOLE_QUERIES", str(tmp_path / "queries.json"))
    monkeypatch.delenv("AGENTOBS_CONFIG", raising=False)
    monkeypatch.setattr(ui, "TABLE_TASKS", 2)
    api = compute("task_cost", db=as_source(str(db)), by="task")
    n = api.height
    assert n > 3  # more tasks than the table shows
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    goto(at, "cost.py", by="task")
    # the table: the 2 costliest tasks (task_cost's order), their rows as the API computed them
    shown = df_of(at, 0)
    assert shown["task_id"].to_list() == api["task_id"].head(2).to_list()
    for c in ("calls", "cost_usd"):
        for a, b in zip(shown[c].to_list(), api[c].head(2).to_list(), strict=True):
            assert math.isclose(a, b, rel_tol=1e-9), c
    assert any(f"2 of {n:,} tasks (the costliest)" in c.value for c in at.caption)
    # the histogram: bins, not one point per task; the counts sum to the number of tasks (all have a cost here)
    (spec, bins), = [(s, d) for s, d in charts_of(at) if "bin_start" in d.columns]
    assert bins.height == charts.HIST_BINS and bins["count"].sum() == n
    assert bins["bin_start"][0] == pytest.approx(api["cost_usd"].min())
    assert bins["bin_end"][-1] == pytest.approx(api["cost_usd"].max())
    # the totals: sums of the same result, equal to the API's
    labels = {m.label: m.value for m in at.metric}
    assert labels["tasks"] == f"{n:,}"
    assert labels["calls"] == f"{api['calls'].sum():,}"
    assert labels["cost"] == ui.usd(api["cost_usd"].sum())
    assert labels["re-prefill cost"] == ui.usd(api["reprefill_cost_usd"].sum())
    # and the same figures as the Overview's, which reads the `reprefill` metric per model: every call has a task
    # (task_id falls back to the trace id), so the sums over tasks and over models are of the same calls
    rp = compute("reprefill", db=as_source(str(db)), by="model")
    assert math.isclose(api["reprefill_cost_usd"].sum(), rp["reprefill_cost_usd"].sum(), rel_tol=1e-9)
    assert math.isclose(api["cost_usd"].sum(), rp["cost_usd"].sum(), rel_tol=1e-9)
    assert api["reprefill_cost_usd"].sum() > 0  # the store has re-prefill: the equality is not 0 == 0
    # by task type the totals are the same numbers (every call is in one task and one task type)
    by_type = compute("task_cost", db=as_source(str(db)), by="task_type")
    at.selectbox(key="by_task_cost").set_value("task_type").run()
    again = {m.label: m.value for m in at.metric}
    assert again["task types"] == f"{by_type.height:,}"
    assert again["calls"] == labels["calls"] and again["cost"] == labels["cost"]
    assert df_of(at, 0).height == by_type.height
