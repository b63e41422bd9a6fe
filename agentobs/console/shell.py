"""The console shell: page config, database, global filters (synced with the URL), navigation.

``app.py`` (the script ``streamlit run`` executes) calls ``run()``. Pages are the files in ``views/`` (not ``pages/``: Streamlit would treat that as its legacy multipage folder);
each reads the shared context with ``context()``.

Backend: DuckDB (default) or ClickHouse — ``--backend clickhouse --clickhouse-url URL`` after ``--`` on
the ``streamlit run`` command line, else the settings ``backend`` / ``clickhouse_url`` (environment
``AGENTOBS_BACKEND`` / ``AGENTOBS_CLICKHOUSE_URL``, which ``agentobs console --backend clickhouse
--clickhouse-url URL`` sets for the app: an environment is not shown to other users as a command line is).
Every page is the same on both (agentobs/console/data.py).

Database (DuckDB): ``--db PATH`` after ``--`` on the ``streamlit run`` command line, else the setting ``db``
(``$AGENTOBS_DB``, which ``agentobs console --db`` sets; default ./agentobs.duckdb). The console only ever opens
it read-only. The choice is one agentobs.source Source (``make_source``), made once per run of the script.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from . import data
from .filters import (
    FILTER_KEYS,
    LIST_KEYS,
    WINDOWS,
    Filters,
    from_query_params,
    parse_ts,
    previous_window,
    resolve_window,
    to_query_params,
)

PAGES_DIR = Path(__file__).resolve().parent / "views"

# (file, title, url path, icon, section) — the navigation, declared once.
PAGES = (
    ("overview.py", "Overview", "overview", ":material/dashboard:", "Agent metrics"),
    ("sessions.py", "Sessions", "sessions", ":material/list:", "Agent metrics"),
    ("session.py", "Session timeline", "session", ":material/timeline:", "Agent metrics"),
    ("turn_resume.py", "Turn-resume TTFT", "turn-resume", ":material/timer:", "Agent metrics"),
    ("kv_rent.py", "KV rent & capacity", "kv-rent", ":material/memory:", "Agent metrics"),
    ("itl.py", "ITL tails", "itl", ":material/show_chart:", "Agent metrics"),
    ("cost.py", "Cost attribution", "cost", ":material/payments:", "Agent metrics"),
    ("findings.py", "Findings", "findings", ":material/lightbulb:", "Agent metrics"),
    ("whatif.py", "What-if", "whatif", ":material/science:", "Agent metrics"),
    ("engines.py", "Engines", "engines", ":material/dns:", "Explore"),
    ("trace.py", "Trace", "trace", ":material/account_tree:", "Explore"),
    ("loadgen_compare.py", "Load-generator compare", "loadgen-compare", ":material/compare_arrows:", "Explore"),
    ("sql.py", "SQL", "sql", ":material/terminal:", "Explore"),
)


@dataclass(frozen=True)
class Context:
    db: str  # the DuckDB store's path, or the ClickHouse URL without its password
    stamp: data.Stamp
    filters: Filters
    since: dt.datetime | None  # resolved current window [since, until)
    until: dt.datetime | None
    prev: tuple[dt.datetime, dt.datetime] | None  # the period before, for "change vs previous"
    data_lo: dt.datetime | None
    data_hi: dt.datetime | None
    backend: str = "duckdb"

    def window_label(self) -> str:
        if self.since is None and self.until is None:
            return "all data"
        lo = self.since.isoformat(sep=" ", timespec="seconds") if self.since else "…"
        hi = self.until.isoformat(sep=" ", timespec="seconds") if self.until else "…"
        return f"{lo} → {hi} UTC"


def _arg(name: str) -> str | None:
    """``--name VALUE`` / ``--name=VALUE`` after ``--`` on the ``streamlit run`` command line."""
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def make_source():
    """The console's Source (agentobs.source): the command line after ``--`` when given, else the settings
    (``db``, ``backend``, ``clickhouse_url``, environment included); ClickHouse through the process-wide
    connection."""
    from ..config import load_settings
    from ..source import make_source

    return make_source(load_settings(), _arg("backend"), _arg("clickhouse-url"), _arg("db"), shared=True)


def context() -> Context:
    return st.session_state["_agentobs_ctx"]


# Cached reads: keyed by the db stamp (path + size + mtimes) and the arguments.
_cache = st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
bounds = _cache(data.bounds)
options = _cache(data.options)


def _sidebar_filters(stamp: data.Stamp) -> Filters:
    qp = st.query_params
    url_f = from_query_params(qp)
    url_has = any(k in qp for k in FILTER_KEYS)
    ss = st.session_state
    last: Filters | None = ss.get("_f_last")
    opts = options(stamp)
    src = None
    if last is None or (url_has and url_f.key() != last.key()):
        src = url_f  # first run of this browser session, or the URL was edited: the URL wins
        for w in url_f.warnings:
            st.sidebar.warning(w)
    elif "f_window" not in ss:
        src = last  # st.switch_page resets widget state: restore the filters in force
    if src is not None:
        ss["f_window"] = src.window
        for k in LIST_KEYS:
            ss[f"f_{k}"] = list(getattr(src, k))
        ss["f_since"] = src.since.isoformat(timespec="seconds") if src.since else ""
        ss["f_until"] = src.until.isoformat(timespec="seconds") if src.until else ""

    sb = st.sidebar
    sb.markdown("**Filters** · kept in the URL: share the link to share the view")
    sb.selectbox("Time window (relative to the latest call)", list(WINDOWS), key="f_window",
                 help="`all` shows everything; a window ends at the latest call in the store.")
    labels = {"instance": "Instance", "model": "Model", "task_type": "Task type"}
    for k in LIST_KEYS:
        choices = list(dict.fromkeys([*opts[k], *ss.get(f"f_{k}", [])]))
        sb.multiselect(labels[k], choices, key=f"f_{k}", placeholder="all")
    with sb.expander("Explicit range (UTC)", expanded=bool(ss.get("f_since") or ss.get("f_until"))):
        st.text_input("since", key="f_since", placeholder="2026-10-14T09:00:00")
        st.text_input("until", key="f_until", placeholder="2026-10-14T11:00:00")

    bounds_: dict[str, dt.datetime | None] = {}
    for k in ("since", "until"):
        text = ss.get(f"f_{k}", "").strip()
        bounds_[k] = None
        if text:
            try:
                bounds_[k] = parse_ts(text)
            except ValueError:
                sb.warning(f"ignored {k}={text!r}: not an ISO-8601 time or epoch seconds")
    if bounds_["since"] and bounds_["until"] and bounds_["since"] >= bounds_["until"]:
        sb.warning("ignored the explicit range: since is not before until")
        bounds_ = {"since": None, "until": None}
    f = Filters(window=ss["f_window"], since=bounds_["since"], until=bounds_["until"],
                **{k: tuple(ss.get(f"f_{k}", [])) for k in LIST_KEYS})
    unknown = [f"{k}={v}" for k in LIST_KEYS for v in getattr(f, k) if v not in opts[k]]
    if unknown:
        sb.warning("no data for " + ", ".join(unknown))

    # write the filters to the URL (page navigation clears it; keep page-specific keys such as session=)
    want = to_query_params(f)
    for k in FILTER_KEYS:
        have = qp.get_all(k)
        wanted = want.get(k)
        w_list = [] if wanted is None else ([wanted] if isinstance(wanted, str) else list(wanted))
        if have != w_list:
            if w_list:
                qp[k] = w_list if len(w_list) > 1 else w_list[0]
            else:
                del qp[k]
    ss["_f_last"] = f
    return f


def run() -> None:
    st.set_page_config(page_title="agentobs console", page_icon=":material/monitoring:", layout="wide")
    try:
        src = make_source()
        src.check()
        # a stamp at most 30 s old: under a steady insert stream ClickHouse's changes every few seconds, and
        # recomputing the metrics on every click would follow it (a DuckDB file's is always fresh: a stat)
        stamp = src.stamp(max_age_s=30)
        db = src.label()
    except Exception as e:  # noqa: BLE001 - a bad setting or a missing store is shown, not raised
        st.error(f"{e}; start the console with `agentobs console --db PATH` (`agentobs demo --db PATH` makes one), "
                 "or on ClickHouse after `agentobs clickhouse init --clickhouse-url …`")
        st.stop()
    sections: dict[str, list] = {}
    for file, title, url, icon, section in PAGES:
        sections.setdefault(section, []).append(
            st.Page(PAGES_DIR / file, title=title, url_path=url, icon=icon, default=(url == "overview")))
    pg = st.navigation(sections)
    try:
        lo, hi = bounds(stamp)
        f = _sidebar_filters(stamp)
    except Exception as e:  # noqa: BLE001 - an unreadable store is shown, not raised
        st.error(f"cannot read {db!r}: {e}")
        st.stop()
    since, until = resolve_window(f, lo, hi)
    st.sidebar.caption(f"{src.kind}: `{db}`  \nview: {_label(since, until)}  \ndata: {_label(lo, hi, True)}")
    st.session_state["_agentobs_ctx"] = Context(db, stamp, f, since, until, previous_window(since, until), lo, hi,
                                                src.dialect)
    pg.run()


def _label(lo, hi, inclusive=False) -> str:
    if lo is None and hi is None:
        return "all data" if not inclusive else "no calls yet"
    def fmt(t):
        return (t.isoformat(sep=" ", timespec="seconds") if t else "…")
    return f"{fmt(lo)} → {fmt(hi)} UTC"


def page_path(file: str) -> Path:
    """Absolute path of a page script, for st.switch_page / st.page_link (works whatever the entry file)."""
    return PAGES_DIR / file
