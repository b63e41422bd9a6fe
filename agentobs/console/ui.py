"""Small helpers shared by the pages: headers that state the basis, number formats, links, cached reads."""

from __future__ import annotations

import math
from urllib.parse import urlencode

import polars as pl
import streamlit as st

from . import data
from .filters import to_query_params
from .shell import Context, context

_cache = st.cache_data(show_spinner=False, max_entries=256, ttl=3600)

# cached reads (keyed by db stamp + arguments)
sessions = _cache(data.sessions)
session_calls = _cache(data.session_calls)
session_tools = _cache(data.session_tools)
session_ids_like = _cache(data.session_ids_like)
task_calls = _cache(data.task_calls)
engine_samples = _cache(data.engine_samples)
engine_overview = _cache(data.engine_overview)
metric_names = _cache(data.metric_names)
schema = _cache(data.schema)


def page(title: str, basis: str) -> Context:
    """Title, the view window, and what the numbers are based on; returns the shared context."""
    ctx = context()
    st.title(title)
    f = ctx.filters
    scope = [f"{k}: {', '.join(v)}" for k, v in f.lists().items()]
    st.caption(f"View: {ctx.window_label()}" + (" · " + " · ".join(scope) if scope else "") + f"  \n{basis}")
    return ctx


def link(page_url: str, ctx: Context, **extra: str) -> str:
    """Relative link to a console page carrying the current filters (and e.g. session=...)."""
    qp = to_query_params(ctx.filters)
    qp.update(extra)
    return f"./{page_url}?{urlencode(qp, doseq=True)}"


def nav_params(ctx: Context, **extra: str) -> dict:
    qp = to_query_params(ctx.filters)
    qp.update(extra)
    return qp


def is_missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def n(v, digits: int = 0) -> str:
    if is_missing(v):
        return "–"
    return f"{v:,.{digits}f}"


def pct(v, digits: int = 1) -> str:
    return "–" if is_missing(v) else f"{100 * v:.{digits}f} %"


def usd(v) -> str:
    if is_missing(v):
        return "–"
    return f"${v:,.2f}" if abs(v) >= 0.01 or v == 0 else f"${v:,.4f}"


def secs(v) -> str:
    if is_missing(v):
        return "–"
    return f"{v * 1000:,.0f} ms" if abs(v) < 1 else f"{v:,.2f} s"


def empty(df: pl.DataFrame | None, what: str) -> bool:
    """True (and says so) when there is nothing to show."""
    if df is None or df.height == 0:
        st.info(f"No {what} in this view. Widen the time window or clear filters.")
        return True
    return False


def stamp() -> data.Stamp:
    return context().stamp


def metric_section(ctx: Context, name: str, by: str | None = None, choose_by: bool = False, key: str = "",
                   period: str = "current"):
    """A metric from the metrics API with its definition/unit caption; optional grouping selector.
    Returns (DataFrame or None, grouping used)."""
    from agentobs.metrics import catalogue

    from . import metrics

    m = catalogue().get(name)
    if m is None:
        st.info(f"The metric `{name}` is not in the installed metrics API yet; it shows here once it lands.")
        return None, by
    st.caption(metrics.describe(name))
    if choose_by and len(m.by) > 1:
        by = st.selectbox("Group by", list(m.by), index=list(m.by).index(by) if by in m.by else 0,
                          key=f"by_{key or name}")
    by = by or m.default_by
    try:
        df = metrics.compute(ctx, name, by, period)
    except Exception as e:  # noqa: BLE001 - a failing metric is shown with its message, the page goes on
        st.error(f"metric {name!r}: {e}")
        return None, by
    return df, by
