"""Sessions: filterable, sortable table; open one to see its timeline."""

from __future__ import annotations

import polars as pl
import streamlit as st

from agentobs.console import data, findings, metrics, shell, ui

ctx = ui.page("Sessions", "Sessions with at least one model call in the view; tokens are summed over those calls. "
              "Hit rate H = ΣC/ΣP, reuse rate U = ΣC/ΣR_eff and re-prefill X (tokens) come from the metrics API "
              "(METRICS.md §1–2).")

c1, c2, c3 = st.columns([2, 1, 1])
# the search, sort and row limit live in the URL (q, sort, limit), as the filters do
ui.from_url("sess_search", "q", default="")
ui.from_url("sess_sort", "sort", options=list(data.SORTS), default="newest")
ui.from_url("sess_limit", "limit", cast=lambda v: int(v) if 10 <= int(v) <= 100_000 else None, default=500)
search = c1.text_input("Session id contains", key="sess_search", placeholder="e.g. sess-0199")
sort = c2.selectbox("Sort by", list(data.SORTS), key="sess_sort")
limit = c3.number_input("Show at most", min_value=10, max_value=100_000, step=100, key="sess_limit")
ui.to_url("q", search.strip())
ui.to_url("sort", sort, default="newest")
ui.to_url("limit", int(limit), default=500)

finding_id = st.query_params.get("finding")
owned = None
if finding_id:  # the sessions a finding owns calls of (the ledger's, as `agentobs findings sessions ID`)
    led = findings.ledger(ctx)
    f = led.get(finding_id)
    if f is None:
        st.warning(f"No finding `{finding_id}` in this view (window and filters); showing every session.")
    else:
        rows = led.sessions_of(finding_id)
        st.info(f"**{len(rows):,} sessions affected** by `{finding_id}` · {ui.usd(f.tax.usd_week)}{f.tax.per} · "
                f"fix: {findings._fix_text(f)}")
        owned = pl.DataFrame({"session_id": [r["session_id"] for r in rows],
                              "owned_calls": [r["calls"] for r in rows],
                              "owned_tokens": [r["reprefill_tokens"] for r in rows],
                              "owned_usd_week": [r["usd_week"] for r in rows]},
                             schema={"session_id": pl.String, "owned_calls": pl.Int64, "owned_tokens": pl.Float64,
                                     "owned_usd_week": pl.Float64})
        if st.button("Show every session", key="sess_clear_finding"):
            del st.query_params["finding"]
            st.rerun()

df = ui.sessions(ctx.stamp, ctx.filters, ctx.since, ctx.until, search, sort,
                 int(limit) if owned is None else 1_000_000)
if owned is not None and df is not None:
    df = owned.join(df, on="session_id", how="left").sort("owned_usd_week", descending=True).head(int(limit))
if not ui.empty(df, "sessions"):
    per = metrics.suite(ctx, {"reuse": "session", "reprefill": "session"})
    if per is None:
        st.caption("Hit rate / reuse rate / re-prefill columns appear once the metrics API (`agentobs.metrics`) is installed.")
    else:
        for name, cols in (("reuse", ("hit_rate", "reuse_hit_rate")), ("reprefill", ("reprefill_tokens", "reprefill_cost_usd"))):
            m = per.get(name)
            if m is not None and "session_id" in m.columns:
                df = df.join(m.select("session_id", *[c for c in cols if c in m.columns]), on="session_id", how="left")
    df = df.with_columns(pl.col("session_id").map_elements(lambda s: ui.link("session", ctx, session=s),
                                                           return_dtype=pl.String).alias("open"))
    ui.table(
        df, key="sessions_table",
        column_order=["open", *[c for c in df.columns if c != "open"]],
        column_config={
            "open": st.column_config.LinkColumn("timeline", display_text="open ↗", width="small"),
            "first_start": st.column_config.DatetimeColumn("first start (UTC)", format="YYYY-MM-DD HH:mm:ss"),
            "span_s": st.column_config.NumberColumn("span (s)", format="%,.3g s"),
            "hit_rate": st.column_config.NumberColumn("H = ΣC/ΣP", format="percent"),
            "reuse_hit_rate": st.column_config.NumberColumn("U = ΣC/ΣR_eff", format="percent"),
            "reprefill_tokens": st.column_config.NumberColumn("re-prefill X (tokens)", format="%,d"),
            "reprefill_cost_usd": st.column_config.NumberColumn("re-prefill ($)", format="$%,.3g"),
            "prompt_tokens": st.column_config.NumberColumn("ΣP (tokens)", format="%,d"),
            "cached_tokens": st.column_config.NumberColumn("ΣC (tokens)", format="%,d"),
            "output_tokens": st.column_config.NumberColumn("ΣO (tokens)", format="%,d"),
            "owned_calls": st.column_config.NumberColumn("calls the finding owns", format="%,d"),
            "owned_tokens": st.column_config.NumberColumn("their re-prefill (tokens)", format="%,.0f"),
            "owned_usd_week": st.column_config.NumberColumn("their tax ($/week)", format="$%,.3g"),
        })
    st.caption(f"{df.height:,} sessions shown (sorted by " + (f"{sort})." if owned is None else
                                                           "the finding's tax in each, most first)."))
    pick_col, btn_col = st.columns([3, 1])
    pick = pick_col.selectbox("Session", df["session_id"].to_list(), key="sess_pick")
    btn_col.write("")
    if btn_col.button("Open timeline", type="primary", key="sess_open") and pick:
        st.switch_page(shell.page_path("session.py"), query_params=ui.nav_params(ctx, session=pick))
