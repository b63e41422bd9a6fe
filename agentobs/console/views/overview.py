"""Overview: headline KPIs per model with the change vs the previous period, and the top findings."""

from __future__ import annotations

import polars as pl
import streamlit as st

from agentobs.console import findings, metrics, shell, ui

ctx = ui.page("Overview", "Which sessions pay the recompute tax, why, and what to change. Every number comes from "
              "the metrics API (METRICS.md); $ use the cost model named under each figure. Shown per model — "
              "never only as a fleet average. Change is vs the period of the same length just before the view "
              "(a relative or explicit window; none for `all`).")

# ITL p99 from `itl` (the gaps' percentiles), not `itl_tail`: the same p99 of the same gaps, without the tail
# attribution the KPI does not show (sample_data: ~0.1 s instead of ~0.5 s; the ITL tails page has it)
WANT = {"reuse": "model", "reprefill": "model", "idle_kv_rent": "model", "turn_resume_ttft": "model",
        "itl": "model"}


def row(res, name, model) -> dict:
    if not res or name not in res:
        return {}
    df = res[name]
    if "model" not in df.columns:
        return {}
    hit = df.filter(pl.col("model") == model) if model is not None else df.filter(pl.col("model").is_null())
    return hit.row(0, named=True) if hit.height else {}


def first(r: dict, *cols):
    for c in cols:
        if c in r and not ui.is_missing(r[c]):
            return r[c]
    return None


def kpi(col, label, now, before, fmt, help_text, inverse=False):
    delta = None
    if now is not None and before is not None:
        delta = fmt(now - before)
    col.metric(label, fmt(now) if now is not None else "–", delta=delta, help=help_text,
               delta_color="inverse" if inverse else "normal")


def render() -> None:
    # the first screen: the weekly recompute tax, the top fixes, the tax over time — drawn first without the
    # simulator replay, then again with it (the "recovers" figures) once the rest of the page is drawn. The slot
    # comes first on the page; the ledger is computed after the current period's suite so that it reads the run
    # that suite prepared (one preparation for the page: agentobs.metrics.prepare shares an open run)
    slot = st.empty()
    st.divider()
    cur = metrics.suite(ctx, WANT)
    findings.answer(ctx, simulate=False, slot=slot)
    prev = metrics.suite(ctx, WANT, period="previous")
    models = cur["reuse"]["model"].to_list() if cur and "reuse" in cur and "model" in cur["reuse"].columns else []
    if not models:
        st.info("No model calls in this view. Widen the time window or clear filters.")
    for model in models:
        st.subheader(f"{model or '(unknown model)'}")
        r_now, r_prev = row(cur, "reuse", model), row(prev, "reuse", model)
        x_now, x_prev = row(cur, "reprefill", model), row(prev, "reprefill", model)
        k_now, k_prev = row(cur, "idle_kv_rent", model), row(prev, "idle_kv_rent", model)
        t_now, t_prev = row(cur, "turn_resume_ttft", model), row(prev, "turn_resume_ttft", model)
        i_now, i_prev = row(cur, "itl", model), row(prev, "itl", model)
        c = st.columns(4)
        kpi(c[0], "Session reuse hit rate U", first(r_now, "reuse_hit_rate"), first(r_prev, "reuse_hit_rate"), ui.pct,
            "U = ΣC / ΣR_eff over calls 2…n (METRICS.md §2): share of what could have been reused that was.")
        kpi(c[1], "Re-prefill share (tokens)", first(x_now, "share_of_cache_tokens"),
            first(x_prev, "share_of_cache_tokens"), ui.pct,
            "ΣX / (ΣX + ΣC): share of cache-related tokens computed again (METRICS.md §3).", inverse=True)
        kpi(c[2], "Re-prefill cost ($)", first(x_now, "reprefill_cost_usd"), first(x_prev, "reprefill_cost_usd"),
            ui.usd, "cost(X) with the §8 cost model; basis: " + str(first(x_now, "cost_basis") or "–"), inverse=True)
        kpi(c[3], "Re-prefill cost share", first(x_now, "cost_share"), first(x_prev, "cost_share"), ui.pct,
            "cost(X) / total cost (METRICS.md §3).", inverse=True)
        c = st.columns(4)
        kpi(c[0], "Idle KV rent ($)", first(k_now, "rent_paid_usd", "rent_usd"), first(k_prev, "rent_paid_usd", "rent_usd"),
            ui.usd, "K × g token-seconds × $/token-s, $/token-s = instance $/s ÷ KV capacity (METRICS.md §4).", inverse=True)
        kpi(c[1], "Recompute tax ($)", first(x_now, "recompute_tax_usd", "reprefill_cost_usd"),
            first(x_prev, "recompute_tax_usd", "reprefill_cost_usd"), ui.usd,
            "$ spent computing again what the session had computed (re-prefill GPU time, §3/§8).", inverse=True)
        kpi(c[2], "Turn-resume TTFT p99", first(t_now, "ttft_p99_s", "p99_s"), first(t_prev, "ttft_p99_s", "p99_s"),
            ui.secs, "TTFT of calls 2…n, p99 (METRICS.md §5).", inverse=True)
        kpi(c[3], "ITL p99", first(i_now, "itl_p99_ms", "p99_ms"), first(i_prev, "itl_p99_ms", "p99_ms"),
            lambda v: "–" if ui.is_missing(v) else f"{v:,.0f} ms",
            "inter-token gap p99 of streamed calls (METRICS.md §6; metric `itl`).", inverse=True)
        st.caption(f"tokens: ΣP {ui.n(first(r_now, 'prompt_tokens'))} · ΣC {ui.n(first(r_now, 'cached_tokens'))} · "
                   f"ΣR_eff {ui.n(first(r_now, 'reusable_tokens_eff'))} · ΣX {ui.n(first(x_now, 'reprefill_tokens'))} · "
                   f"sessions {ui.n(first(r_now, 'sessions'))} · H = ΣC/ΣP {ui.pct(first(r_now, 'hit_rate'))}")
        with st.expander("Cost basis of the $ figures"):
            st.write(first(x_now, "cost_basis") or "–")

    findings.answer(ctx, simulate=True, slot=slot)
    st.divider()
    st.page_link(shell.page_path("findings.py"), label="All findings", icon=":material/lightbulb:", query_params=ui.nav_params(ctx))


# one preparation for the whole page: the previous period and the findings use the run the current period
# prepared (console/metrics.py, one_preparation)
with metrics.one_preparation():
    render()
