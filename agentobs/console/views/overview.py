"""Overview: headline KPIs per model with the change vs the previous period, and the top findings."""

from __future__ import annotations

import polars as pl
import streamlit as st

from agentobs.console import charts, findings, metrics, shell, ui
from agentobs.output import bound_text

ctx = ui.page("Overview", "Which sessions pay the recompute tax, why, and what to change. Every number comes from "
              "the metrics API (METRICS.md); $ use the cost model named under each figure. Shown per model — "
              "never only as a fleet average. Change is vs the period of the same length just before the view "
              "(a relative or explicit window; none for `all`).")

# ITL p99 from `itl` (the gaps' percentiles), not `itl_tail`: the same p99 of the same gaps, without the tail
# attribution the KPI does not show (and does not wait for; the ITL tails page has it)
WANT = {"reuse": "model", "reprefill": "model", "idle_kv_rent": "model", "turn_resume_ttft": "model",
        "itl": "model"}


def row(res, name, model, **where) -> dict:
    """The metric's row for ``model`` (and the columns ``where`` names, e.g. turn_resume_ttft's overall row);
    {} when there is none. Never a first row of several: the row must be the only one."""
    if not res or name not in res:
        return {}
    df = res[name]
    if "model" not in df.columns or any(c not in df.columns for c in where):
        return {}
    hit = df.filter(pl.col("model") == model) if model is not None else df.filter(pl.col("model").is_null())
    for c, v in where.items():
        hit = hit.filter(pl.col(c) == v)
    return hit.row(0, named=True) if hit.height == 1 else {}


def first(r: dict, *cols):
    for c in cols:
        if c in r and not ui.is_missing(r[c]):
            return r[c]
    return None


def kpi(col, label, now, before, fmt, help_text, inverse=False, rel_err=None):
    """A tile; ``rel_err``: the bound of an estimated value (a sketch percentile), shown beside it ("2.31 s ±1%")."""
    delta = None
    if now is not None and before is not None:
        delta = ui.delta(fmt)(now - before)
    col.metric(label, fmt(now) + bound_text(rel_err) if now is not None else "–", delta=delta, help=ui.md(help_text),
               delta_color="inverse" if inverse else "normal")


# turn_resume_ttft's overall row of a model: p50/p90/p99 over all its calls 2…n (not a gap bucket's row)
OVERALL = {"gap_bucket": "all", "hit_class": "all"}


def model_tiles(cur, prev, model) -> None:
    """One model's KPI tiles (with the change vs the previous period), a small TTFT chart, token sums."""
    st.subheader(f"{model or '(unknown model)'}")
    r_now, r_prev = row(cur, "reuse", model), row(prev, "reuse", model)
    x_now, x_prev = row(cur, "reprefill", model), row(prev, "reprefill", model)
    k_now, k_prev = row(cur, "idle_kv_rent", model), row(prev, "idle_kv_rent", model)
    t_now, t_prev = row(cur, "turn_resume_ttft", model, **OVERALL), row(prev, "turn_resume_ttft", model, **OVERALL)
    i_now, i_prev = row(cur, "itl", model), row(prev, "itl", model)
    basis = str(first(x_now, "cost_basis") or "–")
    c = st.columns(4)
    kpi(c[0], "Session reuse hit rate U", first(r_now, "reuse_hit_rate"), first(r_prev, "reuse_hit_rate"), ui.pct,
        "U = ΣC / ΣR_eff over calls 2…n (METRICS.md §2): the share of what could have been reused that was. "
        "Metric `reuse` by model.")
    kpi(c[1], "Re-prefill share (tokens)", first(x_now, "share_of_cache_tokens"),
        first(x_prev, "share_of_cache_tokens"), ui.pct,
        "ΣX / (ΣX + ΣC): the share of cache-related tokens computed again (METRICS.md §3). Metric `reprefill`.",
        inverse=True)
    kpi(c[2], "Re-prefill cost ($)", first(x_now, "reprefill_cost_usd"), first(x_prev, "reprefill_cost_usd"),
        ui.usd, f"cost(X) in the view's window, §8 cost model. Metric `reprefill`. Basis: {basis}", inverse=True)
    kpi(c[3], "Re-prefill cost share", first(x_now, "cost_share"), first(x_prev, "cost_share"), ui.pct,
        "cost(X) / total cost of the model's calls (METRICS.md §3). Metric `reprefill`.", inverse=True)
    c = st.columns(4)
    rent_basis = str(first(k_now, "rent_basis") or "–")
    kpi(c[0], "Idle KV rent paid ($)", first(k_now, "rent_paid_usd"), first(k_prev, "rent_paid_usd"), ui.usd,
        "Retained idle windows: K × g token-seconds × $/token-s, $/token-s = instance $/s ÷ KV capacity "
        f"(METRICS.md §4). Metric `idle_kv_rent`. Basis: {rent_basis}", inverse=True)
    kpi(c[1], "Idle KV rent wasted ($)", first(k_now, "rent_wasted_usd"), first(k_prev, "rent_wasted_usd"), ui.usd,
        "KV held by idle sessions and then evicted before they came back: K × (t_evict − t2(prev)), only where KV "
        f"events give t_evict (METRICS.md §4). Metric `idle_kv_rent`. Basis: {rent_basis}", inverse=True)
    kpi(c[2], "Turn-resume TTFT p99", first(t_now, "ttft_p99_s"), first(t_prev, "ttft_p99_s"), ui.secs,
        "p99 of TTFT over all calls 2…n of the model, every idle gap and hit class (METRICS.md §5): metric "
        "`turn_resume_ttft`, its overall row (gap bucket `all`). By gap and hit class on the Turn-resume TTFT page. "
        "Over whole hours it is read from the hourly TTFT sketches: the ± beside it is their relative error bound.",
        inverse=True, rel_err=first(t_now, "ttft_p99_rel_err"))
    kpi(c[3], "ITL p99", first(i_now, "p99_ms"), first(i_prev, "p99_ms"), ui.ms,
        "p99 of the inter-token gaps of streamed calls (METRICS.md §6; metric `itl`).", inverse=True)
    left, right = st.columns([3, 2])
    ttft = cur.get("turn_resume_ttft") if cur else None
    if ttft is not None and "model" in ttft.columns:
        rows = charts.ttft_by_gap_data(ttft.filter(pl.col("model") == model if model is not None
                                                   else pl.col("model").is_null()))
        if rows.height:
            left.caption("Turn-resume TTFT p50 by idle gap and hit class (metric `turn_resume_ttft`)")
            left.altair_chart(charts.ttft_by_gap(rows, "p50", height=180), width="stretch")
    right.caption(ui.md(
        f"tokens: ΣP {ui.n(first(r_now, 'prompt_tokens'))} · ΣC {ui.n(first(r_now, 'cached_tokens'))} · "
        f"ΣR_eff {ui.n(first(r_now, 'reusable_tokens_eff'))} · ΣX {ui.n(first(x_now, 'reprefill_tokens'))} · "
        f"sessions {ui.n(first(r_now, 'sessions'))} · H = ΣC/ΣP {ui.pct(first(r_now, 'hit_rate'))}"))
    with right.expander("Cost basis of the $ figures"):
        st.caption(ui.md(basis))


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
        model_tiles(cur, prev, model)

    findings.answer(ctx, simulate=True, slot=slot)
    st.divider()
    st.page_link(shell.page_path("findings.py"), label="All findings", icon=":material/lightbulb:", query_params=ui.nav_params(ctx))


# one preparation for the whole page: the previous period and the findings use the run the current period
# prepared (console/metrics.py, one_preparation)
with metrics.one_preparation():
    render()
