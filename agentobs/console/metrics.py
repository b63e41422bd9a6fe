"""The console's door to ``agentobs.metrics`` and ``agentobs.findings``: every METRICS.md number shown
comes from ``agentobs.metrics.compute`` (or its per-call view ``call_reuse``), never from console SQL, so
the console, the CLI and the report agree. Results are cached per db stamp + window + filters.
"""

from __future__ import annotations

import importlib
import importlib.util

import polars as pl
import streamlit as st

from .shell import Context


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def metrics_available() -> bool:
    if not module_available("agentobs.metrics"):
        return False
    return hasattr(importlib.import_module("agentobs.metrics"), "compute")


def findings_available() -> bool:
    return module_available("agentobs.findings")


def _filters_key(ctx: Context) -> tuple:
    return tuple(sorted((k, tuple(v)) for k, v in ctx.filters.lists().items()))


def _window(ctx: Context, period: str):
    if period == "previous":
        return ctx.prev
    return ctx.since, ctx.until


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def _suite(stamp, names: tuple[str, ...], by: tuple[tuple[str, str], ...], since, until, filters: tuple
           ) -> tuple[dict[str, pl.DataFrame], dict[str, str]]:
    """One preparation (``agentobs.metrics.prepare``), then each metric; a failing metric is reported, not fatal."""
    from agentobs.metrics import prepare

    run, close = prepare(stamp[0], since=since, until=until, filters={k: list(v) for k, v in filters} or None)
    out, errors = {}, {}
    groupings = dict(by)
    try:
        for n in names:
            try:
                out[n] = run.compute(n, groupings.get(n))
            except Exception as e:  # noqa: BLE001 - shown on the page next to the metric
                errors[n] = str(e)
    finally:
        close()
    return out, errors


def known(names) -> list[str]:
    """The metric names the installed metrics API has (metrics land one by one)."""
    from agentobs.metrics import catalogue

    cat = catalogue()
    return [n for n in names if n in cat]


def suite(ctx: Context, wanted: dict[str, str | None], period: str = "current") -> dict[str, pl.DataFrame] | None:
    """``agentobs.metrics.compute_all`` for the view: {metric: grouping} → {metric: DataFrame}, one preparation.
    Metrics the installed API does not have yet are left out. None when the API is missing, or for
    ``period='previous'`` when the view is open-ended (no previous period of the same length)."""
    if not metrics_available():
        return None
    win = _window(ctx, period)
    if win is None:
        return None
    names = tuple(known(wanted))
    if not names:
        return {}
    by = tuple((n, wanted[n]) for n in names if wanted[n])
    out, errors = _suite(ctx.stamp, names, by, win[0], win[1], _filters_key(ctx))
    for n, e in errors.items():
        st.error(f"metric {n!r}: {e}")
    return out


def compute(ctx: Context, name: str, by: str | None = None, period: str = "current") -> pl.DataFrame | None:
    """One metric for the view (see ``suite``); None when unavailable."""
    res = suite(ctx, {name: by}, period)
    return None if res is None else res.get(name)


def describe(name: str) -> str:
    """The metric's definition and unit from its SQL file header (the single source of truth)."""
    from agentobs.metrics import catalogue

    m = catalogue().get(name)
    if m is None:
        return f"`{name}`: not in the installed metrics API yet."
    return f"**{name}** ({m.section or 'METRICS.md'}) — {m.definition} Unit: {m.unit}. Grain: {m.grain}."


def missing_metrics_notice() -> None:
    st.warning("The metrics API (`agentobs.metrics`) is not in this build yet, so this page has no numbers to show. "
               "The console never computes METRICS.md numbers itself; they appear here once `agentobs.metrics` "
               "is installed.")


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def _call_reuse(stamp, session_id: str) -> pl.DataFrame:
    from agentobs.metrics import prepare

    run, close = prepare(stamp[0], filters={"session_id": [session_id]})
    try:
        calls = run.table("m_calls")
    finally:
        close()
    return calls.filter(pl.col("in_filter")).rename({"reusable_tokens_eff": "r_eff"}, strict=False)


def call_reuse(ctx: Context, session_id: str) -> pl.DataFrame | None:
    """Per-call R_eff, re-prefill X, hit class and miss cause of one session: the metrics API's
    ``call_reuse`` rows (``MetricRun.table('m_calls')``) for that session."""
    if not metrics_available():
        return None
    return _call_reuse(ctx.stamp, session_id)
