"""The run cache: one metric preparation shared by the callers that ask for the same one on the same Source.

A second ``prepare()`` on the same Source object with the same store state (the Source's ``run_stamp()``: a
DuckDB file's size/mtime and its WAL's; a ClickHouse connection), window, filters and settings, in the same thread,
while the first is still open, gets the same MetricRun: findings called inside the report (both prepare the same
week, on the Source the report was handed) cost nothing extra. The cache lives on the Source (``Source.run_cache``,
agentobs.source.RunCache, with its own lock): callers share a run by sharing a Source, and there is no process-wide
cache. The run is reference-counted: each caller's close() releases its use, and the last one closes the cursor
(and the connection prepare opened). A shared run is only read (metric queries, its temp tables); its cursor
stays on the first caller's connection, so that connection must stay open until every user has closed (ours
does: it closes with the last use). Threads never share a run (DuckDB cursors are not for concurrent use);
in-memory stores are not shared.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..config import Settings, load_settings
from ..source import RunCache, Source, require
from .cost import parse_cost
from .prepare import MetricRun, _normalize_filters, parse_time


@dataclass
class _Shared:
    run: MetricRun
    finish: Callable[[], None]
    users: int = 1


def _share_key(src: Source, since, until, filters: dict, settings: Settings) -> tuple | None:
    stamp = src.run_stamp()
    if stamp is None:
        return None
    fp = json.dumps(settings.values, sort_keys=True, default=str)
    return (stamp, since, until, tuple(sorted((k, tuple(v)) for k, v in filters.items())), fp, threading.get_ident())


def _release(cache: RunCache, key: tuple | None, shared: _Shared) -> Callable[[], None]:
    done = False

    def close():
        nonlocal done
        if done:
            return
        done = True
        with cache.lock:
            shared.users -= 1
            last = shared.users == 0
            if last and key is not None and cache.entries.get(key) is shared:
                del cache.entries[key]
        if last:
            shared.finish()

    return close


def prepare(db: Source, since=None, until=None, filters: dict | None = None, settings: Settings | None = None,
            clock: Callable[[], float] = time.time) -> tuple[MetricRun, Callable[[], None]]:
    """A MetricRun and the function that closes what this call opened (or releases a shared run, above). ``db``:
    a Source (agentobs.source; a store path or a connection becomes one at the edge, agentobs.source.as_source)."""
    settings = settings if settings is not None else load_settings()
    cost = parse_cost(settings.cost)
    t_since, t_until = parse_time(since, clock, "since"), parse_time(until, clock, "until")
    flt = _normalize_filters(filters)
    src = require(db, "agentobs.metrics.prepare")
    cache = src.run_cache
    key = _share_key(src, t_since, t_until, flt, settings)
    with cache.lock:
        hit = cache.entries.get(key) if key is not None else None
        if hit is not None:
            hit.users += 1
    if hit is not None:
        return hit.run, _release(cache, key, hit)
    con = src.cursor()  # on ClickHouse: a cursor whose close() drops the run's tables, not the connection
    try:
        run = MetricRun(con, t_since, t_until, flt, settings, cost)
    except BaseException:
        con.close()
        raise

    def finish():
        run.close()
        con.close()

    shared = _Shared(run, finish)
    if key is not None:
        with cache.lock:
            cache.entries.setdefault(key, shared)
    return run, _release(cache, key, shared)
