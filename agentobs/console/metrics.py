"""The console's door to ``agentobs.metrics`` and ``agentobs.findings``: every METRICS.md number shown
comes from ``agentobs.metrics.compute`` (or its per-call view ``call_reuse``), never from console SQL, so
the console, the CLI and the report agree. Results are cached per db stamp + window + filters.
"""

from __future__ import annotations

import datetime as dt
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


def _filters_dict(ctx: Context) -> dict[str, list[str]]:
    return {k: list(v) for k, v in ctx.filters.lists().items()}


@st.cache_data(show_spinner=False, max_entries=512, ttl=3600)
def _compute(stamp, name: str, since: dt.datetime | None, until: dt.datetime | None, by: tuple[str, ...] | None,
             filters: tuple[tuple[str, tuple[str, ...]], ...]) -> pl.DataFrame:
    from agentobs.metrics import compute as metrics_compute

    return metrics_compute(name, db=stamp[0], since=since, until=until, by=list(by) if by else None,
                           filters={k: list(v) for k, v in filters} or None)


def compute(ctx: Context, name: str, by: list[str] | tuple[str, ...] | None = None, period: str = "current"
            ) -> pl.DataFrame | None:
    """``agentobs.metrics.compute(name, db, since, until, by, filters)`` for the view (``period='previous'``:
    the period of the same length just before it). None when the metrics API is not installed, or when
    the previous period is asked for an open-ended view."""
    if not metrics_available():
        return None
    if period == "previous":
        if ctx.prev is None:
            return None
        since, until = ctx.prev
    else:
        since, until = ctx.since, ctx.until
    filters = tuple(sorted((k, tuple(v)) for k, v in ctx.filters.lists().items()))
    return _compute(ctx.stamp, name, since, until, tuple(by) if by else None, filters)


def missing_metrics_notice() -> None:
    st.warning("The metrics API (`agentobs.metrics`) is not in this build yet, so this page has no numbers to show. "
               "The console never computes METRICS.md numbers itself; they appear here once `agentobs.metrics` "
               "is installed.")


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def _call_reuse(stamp, session_id: str) -> pl.DataFrame:
    from agentobs.metrics import call_reuse as metrics_call_reuse

    return metrics_call_reuse(db=stamp[0], session_id=session_id)


def call_reuse(ctx: Context, session_id: str) -> pl.DataFrame | None:
    """Per-call R_eff, re-prefill X, hit class and miss cause of one session (the metrics API's call_reuse)."""
    if not metrics_available():
        return None
    return _call_reuse(ctx.stamp, session_id)
