"""Global console filters and their URL form (``st.query_params``), so a view can be shared as a link.

URL parameters (all optional, repeat a key for several values)::

    window=1h            one of WINDOWS; relative to the latest call in the store, not the wall clock
                         (stores are often analysed after the fact); default ``all``
    since=2026-10-14T09:00:00&until=2026-10-14T11:00:00   explicit range (UTC); overrides window
    instance=10.42.7.31:8000&instance=10.42.7.40:30000
    model=Qwen/Qwen3-32B
    task_type=swe-fixer

Pure functions, no Streamlit: parsing a bad value yields a warning naming the parameter and the value,
and the value is dropped (the page still renders).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import times

WINDOWS: dict[str, dt.timedelta | None] = {
    "15m": dt.timedelta(minutes=15),
    "1h": dt.timedelta(hours=1),
    "6h": dt.timedelta(hours=6),
    "24h": dt.timedelta(hours=24),
    "7d": dt.timedelta(days=7),
    "30d": dt.timedelta(days=30),
    "all": None,
}
LIST_KEYS = ("instance", "model", "task_type")
FILTER_KEYS = ("window", "since", "until", *LIST_KEYS)


@dataclass(frozen=True)
class Filters:
    window: str = "all"
    since: dt.datetime | None = None  # explicit range (naive UTC); overrides window
    until: dt.datetime | None = None
    instance: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    task_type: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def lists(self) -> dict[str, tuple[str, ...]]:
        return {k: getattr(self, k) for k in LIST_KEYS if getattr(self, k)}

    def key(self) -> tuple:
        """Hashable identity for caches."""
        return (self.window, self.since, self.until, self.instance, self.model, self.task_type)


def _values(qp: Mapping, key: str) -> list[str]:
    if hasattr(qp, "get_all"):
        vals = qp.get_all(key)
    else:
        v = qp.get(key)
        vals = [] if v is None else (list(v) if isinstance(v, (list, tuple)) else [v])
    out: list[str] = []
    for v in vals:  # accept both repeated keys and comma lists
        out.extend(p.strip() for p in str(v).split(",") if p.strip())
    return out


def parse_ts(text: str) -> dt.datetime:
    """ISO-8601 (a trailing Z or offset is converted to UTC) or epoch seconds → naive UTC datetime
    (agentobs.times.parse_utc without spans); ValueError otherwise."""
    return times.parse_utc(text)


def from_query_params(qp: Mapping) -> Filters:
    warnings: list[str] = []
    window = (_values(qp, "window") or ["all"])[-1]
    if window not in WINDOWS:
        warnings.append(f"ignored window={window!r}: choose one of {', '.join(WINDOWS)}")
        window = "all"
    bounds: dict[str, dt.datetime | None] = {"since": None, "until": None}
    for k in bounds:
        vals = _values(qp, k)
        if vals:
            try:
                bounds[k] = parse_ts(vals[-1])
            except ValueError:
                warnings.append(f"ignored {k}={vals[-1]!r}: not an ISO-8601 time or epoch seconds")
    if bounds["since"] and bounds["until"] and bounds["since"] >= bounds["until"]:
        warnings.append(f"ignored since/until: since {bounds['since']} is not before until {bounds['until']}")
        bounds = {"since": None, "until": None}
    lists = {k: tuple(dict.fromkeys(_values(qp, k))) for k in LIST_KEYS}
    return Filters(window=window, since=bounds["since"], until=bounds["until"], warnings=tuple(warnings), **lists)


def to_query_params(f: Filters) -> dict[str, str | list[str]]:
    """The URL form; default values are left out so links stay short."""
    out: dict[str, str | list[str]] = {}
    if f.window != "all":
        out["window"] = f.window
    if f.since:
        out["since"] = f.since.isoformat(timespec="seconds")
    if f.until:
        out["until"] = f.until.isoformat(timespec="seconds")
    for k in LIST_KEYS:
        vals = getattr(f, k)
        if vals:
            out[k] = list(vals)
    return out


def resolve_window(f: Filters, data_min: dt.datetime | None, data_max: dt.datetime | None
                   ) -> tuple[dt.datetime | None, dt.datetime | None]:
    """[since, until) of the current view. A relative window ends just after the latest call in the store."""
    if f.since or f.until:
        return f.since, f.until
    span = WINDOWS[f.window]
    if span is None or data_max is None:
        return None, None
    until = data_max + dt.timedelta(microseconds=1)  # half-open: include the latest call
    return until - span, until


def previous_window(since: dt.datetime | None, until: dt.datetime | None
                    ) -> tuple[dt.datetime, dt.datetime] | None:
    """The period of the same length just before [since, until); None for an open range."""
    if since is None or until is None:
        return None
    return since - (until - since), since
