"""The console's door to ``agentobs.metrics`` and ``agentobs.findings``: every METRICS.md number shown
comes from ``agentobs.metrics.compute`` (or its per-call view ``call_reuse``), never from console SQL, so
the console, the CLI and the report agree. Results are cached per db stamp + window + filters.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping

import polars as pl
import streamlit as st

from . import cache, data
from .shell import Context


def _filters_key(ctx: Context) -> tuple:
    return tuple(sorted((k, tuple(v)) for k, v in ctx.filters.lists().items()))


def _window(ctx: Context, period: str):
    if period == "previous":
        return ctx.prev
    return ctx.since, ctx.until


# The (metric, grouping) pairs each page shows by default, per page: a page's pairs are computed together
# from ONE preparation per db stamp + window + filters (the page's later sections read the cache), and a page
# computes only its own — the Overview, the first page most people open, does not wait for the per-session
# and per-task tables of the other pages (docs/console.md, "One preparation per page"). Other groupings (a
# page's "Group by" selector) are computed on demand.
PAGE_PAIRS = {
    "overview": (("reuse", "model"), ("reprefill", "model"), ("idle_kv_rent", "model"),
                 ("turn_resume_ttft", "model"), ("itl", "model")),
    "sessions": (("reuse", "session"), ("reprefill", "session")),
    "turn_resume": (("turn_resume_ttft", None),),
    "kv_rent": (("idle_kv_rent", None), ("capacity", None), ("concurrency", None)),
    "itl": (("itl_tail", None),),
    "cost": (("task_cost", "task_type"), ("task_cost", "task")),
    "engines": (("fleet_hit_rate", "instance"),),
}


# Within one page run (``one_preparation``) the metric runs prepared here stay open until the page is done, so
# the Overview prepares once: its previous period is the same run moved to the period before (MetricRun.
# set_window; the working set covers it) and findings share the open run (agentobs.metrics.prepare shares an
# open run of the same store state, window and filters within a thread). At the end of the page every run is
# closed: a read-only connection left open would keep collectors from writing the store.
_HELD = threading.local()


@contextlib.contextmanager
def one_preparation():
    """Keep the runs this thread prepares open until the block ends (see above); nested blocks are one."""
    if getattr(_HELD, "runs", None) is not None:
        yield
        return
    _HELD.runs = []
    failed = True
    try:
        yield
        failed = False
    finally:
        runs, _HELD.runs = _HELD.runs, None
        errors = []
        for _key, _run, close in reversed(runs):
            try:
                close()
            except Exception as e:  # noqa: BLE001 - close every run, then report
                errors.append(e)
        if errors and not failed:  # the page's own exception (or Streamlit's stop/rerun) goes first
            raise errors[0]


def _held_run(stamp, filters: tuple, since, until):
    """(run, its own window): a run held open by ``one_preparation`` for this store state and filters whose
    working set covers [since, until), moved to that window; (None, None) when there is none."""
    from agentobs.errors import QueryError
    from agentobs.metrics import parse_time

    for key, run, _close in getattr(_HELD, "runs", None) or []:
        if key != (stamp, filters):
            continue
        own = (run.since, run.until)
        try:
            run.set_window(parse_time(since), parse_time(until))
        except QueryError:
            continue  # outside its working set: not moved
        except Exception:
            run.set_window(*own)  # a failed move must not leave the shared run on another window
            raise
        return run, own
    return None, None


# Metric results are held, not copied per hit (agentobs/console/cache.py): at 10M calls a page's results hold frames
# of hundreds of thousands of rows (task_cost by task: one per task; reuse/reprefill by session: one per session),
# which st.cache_data unpickled on every warm render (docs/console.md, "Caching and performance"). Keyed as before:
# db stamp, pairs, window, filters; a store's earlier stamps are dropped when it changes.
SUITE_ENTRIES = 32


@cache.held(show_spinner="computing metrics…", max_entries=SUITE_ENTRIES)
def _suite(stamp, pairs: tuple[tuple[str, str], ...], since, until, filters: tuple
           ) -> tuple[dict[tuple[str, str], pl.DataFrame], dict[tuple[str, str], str]]:
    """One preparation (``agentobs.metrics.prepare``), or a held one (``one_preparation``), then each (metric,
    grouping); a failing metric is reported, not fatal."""
    from agentobs.metrics import prepare

    run, own = _held_run(stamp, filters, since, until)
    held = run is not None
    if not held:
        run, close = prepare(data.source(stamp), since=since, until=until,
                             filters={k: list(v) for k, v in filters} or None)
    out, errors = {}, {}
    try:
        for pair in pairs:
            try:
                out[pair] = run.compute(*pair)
            except Exception as e:  # noqa: BLE001 - shown on the page next to the metric
                errors[pair] = str(e)
    finally:
        if held:
            run.set_window(*own)  # back to the window it was prepared for (findings share it by that key)
        elif getattr(_HELD, "runs", None) is not None:
            _HELD.runs.append(((stamp, filters), run, close))
        else:
            close()
    return out, errors


def known(names) -> list[str]:
    """The metric names the installed metrics API has (metrics land one by one)."""
    from agentobs.metrics import catalogue

    cat = catalogue()
    return [n for n in names if n in cat]


def _pair(name: str, by: str | None) -> tuple[str, str]:
    from agentobs.metrics import catalogue

    return (name, by or catalogue()[name].default_by)


def suite(ctx: Context, wanted: Mapping[str, str | None], period: str = "current") -> dict[str, pl.DataFrame] | None:
    """{metric: grouping} → {metric: DataFrame} for the view, from the metrics API. Metrics the installed API
    does not have are left out. None for ``period='previous'`` when the view is open-ended (no previous
    period of the same length)."""
    win = _window(ctx, period)
    if win is None:
        return None
    pairs = tuple(_pair(n, wanted[n]) for n in known(wanted))
    if not pairs:
        return {}
    # the current view computes the page's default pairs together (its later sections prepare nothing new);
    # the previous period is only read for the Overview's deltas: just the pairs asked for
    batch = pairs
    if period == "current":
        for page in PAGE_PAIRS.values():
            group = tuple(dict.fromkeys(_pair(n, b) for n, b in page if known([n])))
            if set(pairs) <= set(group):
                batch = group
                break
    out, errors = _suite(ctx.stamp, batch, win[0], win[1], _filters_key(ctx))
    for pair in pairs:
        if pair in errors:
            st.error(f"metric {pair[0]!r} by {pair[1]}: {errors[pair]}")
    return {p[0]: out[p] for p in pairs if p in out}


def warm(stamp, page: str) -> None:
    """Compute ``page``'s default pairs for the default view (all data, no filters) into the cache, as ``suite``
    would for the page's first metric section (agentobs.console.serve warms the Overview at start)."""
    batch = tuple(dict.fromkeys(_pair(n, b) for n, b in PAGE_PAIRS[page] if known([n])))
    if batch:
        _suite(stamp, batch, None, None, ())


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


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def _call_reuse(stamp, session_id: str, default_block_size: int, hit_tolerance_blocks: int = 1) -> pl.DataFrame:
    """The metrics API's ``call_reuse`` body (agentobs.model.reuse.reuse_sql) over ONE session's calls:
    reuse is defined within a session (prev(c), earlier blocks of the session), so restricting the input to
    the session gives the same rows as the fleet-wide run, without materializing every call — but for the
    instance evidence, which reads the other calls on the session's instances (``m_act``).

    The session's calls are first copied into a temp table (``m_src``; on ClickHouse a Memory table the cursor
    drops at close), as the metric run does: planning the body over the ``llm_calls`` view stack inline takes
    tens of seconds on chDB (docs/clickhouse.md)."""
    from agentobs.model.reuse import ACTIVITY_COLUMNS, CALL_COLUMNS, reuse_sql
    from agentobs.source import keeps_model_state, kv_index_usable

    cur = data.source(stamp).cursor()
    try:
        if keeps_model_state(cur):
            from agentobs.config import load_settings
            from agentobs.model import state

            settings = load_settings()
            if int(settings.default_block_size) == default_block_size and state.current(cur, settings):
                # the maintained session model: the session's rows as stored (agentobs/model/state.py)
                df = cur.sql(f"SELECT * EXCLUDE (skey, kh, th, block_hashes) FROM {state.TABLE} WHERE session_id = $sid "
                             "ORDER BY start_s, call_id", params={"sid": session_id}).pl()
                return df.rename({"reusable_tokens_eff": "r_eff"}, strict=False)
        cur.execute(f"""CREATE TEMP TABLE m_src AS
                        SELECT row_number() OVER (ORDER BY start_s, call_id) AS rid, {CALL_COLUMNS}
                        FROM llm_calls WHERE session_id = $sid""", {"sid": session_id})
        cur.execute(f"""CREATE TEMP TABLE m_act AS SELECT {ACTIVITY_COLUMNS} FROM llm_calls
                        WHERE instance IN (SELECT instance FROM m_src)""")
        # the KV section from the stored KV-event index when current: the session's calls are few, the store's KV
        # events are not (agentobs/model/kvindex.py)
        df = cur.sql(reuse_sql("m_src", "$default_block_size", has_rid=True, kv_index=kv_index_usable(cur),
                               hit_tolerance_blocks=hit_tolerance_blocks, activity="m_act"),
                     params={"default_block_size": default_block_size}).pl()
    finally:
        cur.close()
    return df.rename({"reusable_tokens_eff": "r_eff"}, strict=False)


def call_reuse(ctx: Context, session_id: str) -> pl.DataFrame:
    """Per-call R_eff, re-prefill X, hit class and miss cause of one session (the metrics API's call_reuse)."""
    from agentobs.config import load_settings

    s = load_settings()
    return _call_reuse(ctx.stamp, session_id, int(s.default_block_size), int(s.hit_tolerance_blocks))
