"""Small helpers shared by the pages: headers that state the basis, number formats, links, cached reads."""

from __future__ import annotations

import math
from urllib.parse import urlencode

import polars as pl
import streamlit as st

from ..output import bound_text, rel_err_column
from . import cache, data
from .filters import to_query_params
from .shell import Context, context

_cache = st.cache_data(show_spinner=False, max_entries=256, ttl=3600)

# cached reads (keyed by db stamp + arguments)
# the sessions listing is held (agentobs/console/cache.py), not unpickled per hit: a finding's "sessions affected"
# link lists every session it owns (up to 1,000,000 rows at 10M calls); the other listings are small (one session's
# or task's calls, engine scrapes, the schema)
sessions = cache.held(max_entries=64)(data.sessions)
session_calls = _cache(data.session_calls)
session_tools = _cache(data.session_tools)
session_ids_like = _cache(data.session_ids_like)
task_calls = _cache(data.task_calls)
engine_samples = _cache(data.engine_samples)
engine_overview = _cache(data.engine_overview)
metric_names = _cache(data.metric_names)
schema = _cache(data.schema)
instance_evidence = _cache(data.instance_evidence)  # the Findings page's table: a query over the calls, per render before


def md(text: str) -> str:
    """Text for an element Streamlit renders as Markdown (captions, labels, help tooltips, write): ``$`` escaped,
    else two of them on a line are typeset as LaTeX maths ("× $/s (METRICS.md §8) … $" came out garbled)."""
    return str(text).replace("\\$", "$").replace("$", "\\$")


def page(title: str, basis: str = "", note: str = "") -> Context:
    """Title (what the numbers are based on in its help tooltip, said once) and the view window under it, then
    ``note`` (what a user must know to use the page, e.g. the SQL page's dialect and limits) when given;
    returns the shared context."""
    ctx = context()
    st.title(title, help=md(basis) if basis else None)
    f = ctx.filters
    scope = [f"{k}: {', '.join(v)}" for k, v in f.lists().items()]
    st.caption(md(f"View: {ctx.window_label()}" + (" · " + " · ".join(scope) if scope else "")
                  + (f"  \n{note}" if note else "")))
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


def sig(v, digits: int = 3) -> str:
    """A number to ``digits`` significant digits with thousands separators: 0.0321, 3.39, 566, 40,200,000;
    integers (counts, tokens) exactly: 40,224,576."""
    if is_missing(v):
        return "–"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) >= 10 ** digits):
        return f"{int(v):,}"
    if v == 0:
        return "0"
    r = float(f"{v:.{digits}g}")  # rounded to the significant digits
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(r))))
    return f"{r:,.{decimals}f}"


def pct(v, digits: int = 1) -> str:
    return "–" if is_missing(v) else f"{100 * v:.{digits}f} %"


def usd(v) -> str:
    """Dollars to 3 significant digits: $1.75, $0.263, $99.4, $1,230."""
    if is_missing(v):
        return "–"
    return ("-$" if v < 0 else "$") + sig(abs(v))


def secs(v) -> str:
    """Seconds to 3 significant digits, below 1 s in milliseconds: 32.1 ms, 566 ms, 3.39 s."""
    if is_missing(v):
        return "–"
    return f"{sig(v * 1000)} ms" if abs(v) < 1 else f"{sig(v)} s"


def ms(v) -> str:
    """Milliseconds to 3 significant digits: 12.9 ms, 514 ms."""
    return "–" if is_missing(v) else f"{sig(v)} ms"


def delta(fmt):
    """The change-vs-previous format for a KPI of format ``fmt``: percentage points for shares (``pct``)."""
    if fmt is pct:
        return lambda d: f"{100 * d:+.1f} pp"
    return lambda d: ("+" if d > 0 else "") + fmt(d)


# -- tables --------------------------------------------------------------------------------------------
# Numbers in console tables: integers with thousands separators; floats to 3 significant digits (with thousands
# separators) and the unit their column name states (``*_usd`` $, ``*_s`` s, ``*_ms`` ms, ``*_token_s`` token-s,
# ``*_share`` / ``*hit_rate*`` %); token counts held as floats in whole tokens. Formats are Streamlit's
# (sprintf-js: ``%,.3g``), so a column still sorts by value and the underlying numbers are those of the metric
# (a test reads them back).
def number_format(name: str, dtype: pl.DataType) -> str | None:
    n = name.lower()
    if dtype.is_integer():
        return "%,d"
    if not dtype.is_float():
        return None
    if "share" in n or "hit_rate" in n or n.endswith("_perc") or n.endswith("_ratio_0_1"):
        return "percent"
    if "usd" in n:
        return "$%,.3g"
    if n.endswith("_token_s"):
        return "%,.3g token-s"
    if n.endswith("_ms"):
        return "%,.3g ms"
    if n.endswith("_per_s") or n.endswith("_tps"):
        return "%,.3g /s"
    if n.endswith("_s"):
        return "%,.3g s"
    if n.endswith("_bytes"):
        return "%,.3g B"
    if "tokens" in n:  # token counts summed as floats (counter deltas, averages): whole tokens, exact
        return "%,.0f"
    if "penalty" in n or "amplification" in n:
        return "%,.3g×"
    return "%,.3g"


def column_config(df: pl.DataFrame, given: dict | None = None) -> dict:
    """Number formats for ``df``'s columns (``number_format``); ``given`` entries win."""
    given = dict(given or {})
    out: dict = {}
    for name, dtype in df.schema.items():
        if name in given:
            continue
        fmt = number_format(name, dtype)
        if fmt is not None:
            out[name] = st.column_config.NumberColumn(name, format=fmt)
    # a column whose values are estimates with one stated bound (sketch percentiles: agentobs.output.rel_err_column)
    # shows the bound in its header ("ttft_p99_s ±1%"), its bound column hidden
    for name in df.columns:
        err = rel_err_column(name)
        if err != name and err in df.columns and name not in given:
            bounds = df[err].drop_nulls().unique().to_list()
            if len(bounds) == 1:
                fmt = number_format(name, df.schema[name])
                out[name] = st.column_config.NumberColumn(name + bound_text(bounds[0]), format=fmt)
                out[err] = None  # hidden (``given`` may still show it)
    out.update(given)
    return out


def table(df, column_config: dict | None = None, **kw) -> None:
    """``st.dataframe`` with the console's number formats, no index, full width."""
    kw.setdefault("hide_index", True)
    kw.setdefault("width", "stretch")
    cfg = globals()["column_config"](df, column_config) if isinstance(df, pl.DataFrame) else column_config
    st.dataframe(df, column_config=cfg, **kw)


# -- page state in the URL ---------------------------------------------------------------------------------
# Every view's state is in its URL (docs/console.md): the global filters (shell), and each page's own choices
# (grouping, percentile, search, sort, the selected session or task, the SQL text). A page calls ``from_url``
# before it makes a widget (the widget then takes its value from session state, no default argument) and
# ``to_url`` after; Streamlit drops a page's own parameters when another page opens.
# Cost attribution's "Drill to a task" box lists this many of the costliest tasks (a link's ?task= opens any other)
DRILL_TASKS = 1000


def from_url(key: str, param: str | None = None, options=None, default=None, cast=str):
    """Give the widget ``key`` its value from the URL parameter ``param`` (default: ``key``) the first time the
    page makes it (a reload, a shared link), else ``default``; a value that is not among ``options`` (or does not
    ``cast``) is ignored with a warning. Returns the value the widget will have."""
    param = param or key
    ss = st.session_state
    if key not in ss:
        raw = st.query_params.get(param)
        value = default
        if raw is not None and raw != "":
            try:
                v = cast(raw)
            except (TypeError, ValueError):
                v = None
            if v is None or (options is not None and v not in options):
                listed = list(map(str, list(options)[:20])) + (["…"] if len(options) > 20 else []) if options is not None else []
                st.warning(f"ignored {param}={raw!r}" + (f": choose one of {', '.join(listed)}" if listed else ""))
            else:
                value = v
        if value is not None:
            ss[key] = value
    return ss.get(key)


def to_url(param: str, value, default=None) -> None:
    """Write the page's state ``param`` into the URL (left out when it is the default or empty)."""
    qp = st.query_params
    if value is None or value == "" or value == default:
        if param in qp:
            del qp[param]
    elif qp.get(param) != str(value):
        qp[param] = str(value)


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
    # the metric's name and one line here, its definition (from its SQL header) once, in the tooltip
    st.caption(md(f"metric `{name}` ({m.section or 'METRICS.md'}): {m.one_line}"), help=md(metrics.describe(name)))
    if choose_by and len(m.by) > 1:
        wkey = f"by_{key or name}"
        param = "by" + (f"_{key}" if key else "")
        default_by = by if by in m.by else m.by[0]
        from_url(wkey, param, options=list(m.by), default=default_by)
        by = st.selectbox("Group by", list(m.by), key=wkey)
        to_url(param, by, default=default_by)
    by = by or m.default_by
    try:
        df = metrics.compute(ctx, name, by, period)
    except Exception as e:  # noqa: BLE001 - a failing metric is shown with its message, the page goes on
        st.error(f"metric {name!r}: {e}")
        return None, by
    return df, by
