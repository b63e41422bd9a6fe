"""Load-generator compare: two runs of ``agentobs loadgen`` (two stores) side by side, B − A with its bootstrap
interval over sessions — the table ``agentobs loadgen --compare A B`` prints, from the same function."""

from __future__ import annotations

import os
from pathlib import Path

import altair as alt
import polars as pl
import streamlit as st

from agentobs.console import ui
from agentobs.loadgen.compare import compare, display_table

ctx = ui.page("Load-generator compare", "Each figure is a metric of the catalogue (turn_resume_ttft, reuse, reprefill, "
              "task_cost) on each store; the interval resamples whole sessions (paired when both runs replayed the "
              "same workload sessions). Same table as `agentobs loadgen --compare A B` (docs/loadgen.md).")


@st.cache_data(show_spinner="comparing…", max_entries=16, ttl=3600)
def _compare(a: str, a_stamp: tuple, b: str, b_stamp: tuple, reps: int, level: float):
    c = compare(a, b, reps=reps, seed=0, level=level)
    return c, display_table(c)


def _stamp(p: str) -> tuple:
    st_ = os.stat(p)
    wal = Path(p + ".wal")
    return st_.st_size, st_.st_mtime_ns, wal.stat().st_mtime_ns if wal.exists() else 0


def _store(label: str, param: str, default: str) -> str | None:
    ui.from_url(f"lgc_{param}", param, default=default)
    path = st.text_input(label, key=f"lgc_{param}", help="A DuckDB store written by `agentobs loadgen` (opened "
                         "read-only).").strip()
    ui.to_url(param, path, default=default)
    if not path:
        return None
    if not path.endswith(".duckdb") or not Path(path).is_file():
        st.warning(f"{label}: {path!r} is not a .duckdb file")
        return None
    return path


if ctx.backend != "duckdb":
    st.info("The comparison reads two DuckDB stores written by `agentobs loadgen`; this console reads ClickHouse.")
else:
    left, right = st.columns(2)
    with left:
        a = _store("Store A (before)", "a", ctx.db)
    with right:
        b = _store("Store B (after)", "b", "")
    choices = [0, 50, 100, 200, 500, 1000]
    ui.from_url("lgc_reps", "reps", options=choices, default=200, cast=int)
    reps = st.select_slider("Bootstrap resamples", choices, key="lgc_reps")
    ui.to_url("reps", reps, default=200)
    if a and b:
        c, shown = _compare(a, _stamp(a), b, _stamp(b), int(reps), 0.95)
        st.caption(ui.md(f"A = `{c.a}` ({c.sessions_a} sessions) · B = `{c.b}` ({c.sessions_b} sessions) · "
                         f"{'paired' if c.paired else 'independent'} bootstrap, {c.reps} resamples, "
                         f"{c.level:.0%} interval"))
        ttft = pl.DataFrame([{"quantity": r.quantity, "run": run, "seconds": v}
                             for r in c.rows if r.unit == "s" and "every gap" not in r.quantity
                             for run, v in (("A", r.a), ("B", r.b)) if v is not None])
        if ttft.height:
            st.altair_chart(alt.Chart(ttft).mark_bar().encode(
                y=alt.Y("quantity:N", sort=None, title=None), x=alt.X("seconds:Q", title="turn-resume TTFT (s)"),
                yOffset="run:N", color=alt.Color("run:N", scale=alt.Scale(range=["#9e9e9e", "#1565c0"])),
                tooltip=["quantity", "run", alt.Tooltip("seconds:Q", format=".4f")]), width="stretch")
        st.dataframe(shown.to_pandas(), hide_index=True, width="stretch")
    elif not b:
        st.info("Give store B (e.g. the run with prefix caching on) to compare with store A.")
