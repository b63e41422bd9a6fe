"""Cost attribution: by task type, agent, tenant, model; per-task distribution with retries and
amplification; drill to one task (METRICS.md §7–8)."""

from __future__ import annotations

import altair as alt
import streamlit as st

from agentobs.console import charts, ui

ctx = ui.page("Cost attribution", "GPU-time cost of a call = (P − C) ÷ prefill_tps + O ÷ decode_tps instance-seconds × "
              "$/s (METRICS.md §8); the basis is stated in `cost_basis`. Amplification = computed tokens of all "
              "calls ÷ those of the final successful path.")
df, by = ui.metric_section(ctx, "task_cost", by="task_type", choose_by=True)
if df is not None and not ui.empty(df, "tasks"):
    cols = set(df.columns)
    usd = next((c for c in ("cost_usd", "gpu_cost_usd") if c in cols), None)
    key = {"task": "task_id", "session": "session_id"}.get(by, by)
    # the totals of the view, summed from the one result the chart and the table show (each call is in one group)
    groups = {"task": "tasks", "task_type": "task types", "session": "sessions"}.get(by, f"{by}s")
    totals = [(groups, f"{df.height:,}")]
    if "calls" in cols:
        totals.append(("calls", f"{df['calls'].sum():,}"))
    if usd:
        totals.append(("cost", ui.usd(df[usd].sum())))
    if "reprefill_cost_usd" in cols:
        totals.append(("re-prefill cost", ui.usd(df["reprefill_cost_usd"].sum())))
    for col, (label, value) in zip(st.columns(len(totals)), totals, strict=True):
        col.metric(label, value)
    if usd and key in cols and by != "task":
        st.altair_chart(alt.Chart(df).mark_bar(color="#1565c0").encode(
            y=alt.Y(f"{key}:N", sort="-x", title=by),
            x=alt.X(f"{usd}:Q", title="cost ($)", axis=alt.Axis(format="$,.3~g")),
            tooltip=[key, alt.Tooltip(f"{usd}:Q", format="$,.3~g")]), width="stretch")
    if by == "task" and usd:
        # one row per task (~670k at 10M calls): the chart gets charts.HIST_BINS bins computed here, not the values
        bins = charts.histogram_data(df[usd])
        st.altair_chart(charts.histogram(bins, "cost per task ($)", "tasks"), width="stretch")
        unknown = df.height - int(bins["count"].sum())
        if unknown:
            st.caption(f"{unknown:,} tasks without a known cost are not in the histogram")
    if by == "task" and df.height > ui.TABLE_TASKS:
        # the costliest first (task_cost's order); the others are not sent to the browser (~670k rows at 10M calls)
        ui.table(df.head(ui.TABLE_TASKS))
        st.caption(ui.md(f"{ui.TABLE_TASKS:,} of {df.height:,} tasks (the costliest); use the SQL page, the CLI "
                         "(`agentobs metrics task_cost --by task`) or the filters for the rest"))
    else:
        ui.table(df)

st.subheader("Drill to a task")
tasks_df, _ = ui.metric_section(ctx, "task_cost", by="task", key="drill") if df is not None else (None, None)
if tasks_df is not None and "task_id" in tasks_df.columns and tasks_df.height:
    # the costliest tasks first (task_cost's order); a list of every task costs more than the rest of the page at
    # 10M calls (668k tasks: docs/console.md), so the box holds the first ui.DRILL_TASKS, and a link's ?task= any other
    ids = tasks_df["task_id"].head(ui.DRILL_TASKS).to_list()
    want = st.query_params.get("task")
    if want and want not in ids and tasks_df.height > ui.DRILL_TASKS and tasks_df["task_id"].is_in([want]).any():
        ids.append(want)
    if tasks_df.height > ui.DRILL_TASKS:
        st.caption(f"the {ui.DRILL_TASKS:,} costliest of {tasks_df.height:,} tasks; open any other with `?task=ID` in the "
                   "URL, or list them on the SQL page")
    ui.from_url("cost_task", "task", options=ids)
    pick = st.selectbox("Task", ids, index=None, key="cost_task", placeholder="choose a task")
    ui.to_url("task", pick)
    if pick:
        ui.table(tasks_df.filter(tasks_df["task_id"] == pick))
        ui.table(ui.task_calls(ctx.stamp, pick))
