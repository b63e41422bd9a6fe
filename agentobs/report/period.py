"""The report's period: an ISO week (``2026-W48``) or an explicit ``[since, until)``, and the period before.

All times are UTC epoch seconds; an ISO week runs Monday 00:00 UTC to the next Monday 00:00 UTC.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import QueryError
from ..metrics import parse_time

_WEEK = re.compile(r"^(\d{4})-?W(\d{1,2})$", re.IGNORECASE)


@dataclass(frozen=True)
class Period:
    label: str  # "2026-W48", or "2026-11-23T00:00Z..2026-11-30T00:00Z"
    since: float
    until: float

    @property
    def length_s(self) -> float:
        return self.until - self.since

    def previous(self) -> Period:
        """The period of the same length just before this one (the week before, for a week)."""
        prev = Period("", self.since - self.length_s, self.since)
        m = _WEEK.match(self.label)
        if m:
            d = dt.datetime.fromtimestamp(prev.since, dt.UTC).isocalendar()
            return Period(f"{d.year}-W{d.week:02d}", prev.since, prev.until)
        return Period(f"{_iso(prev.since)}..{_iso(prev.until)}", prev.since, prev.until)

    def describe(self) -> str:
        return f"{_iso(self.since)} – {_iso(self.until)} (UTC, end exclusive)"


def _iso(t: float) -> str:
    d = dt.datetime.fromtimestamp(t, dt.UTC)
    return d.strftime("%Y-%m-%d %H:%M") if (d.hour, d.minute, d.second) != (0, 0, 0) else d.strftime("%Y-%m-%d")


def iso_week(text: str) -> Period:
    """``2026-W48`` (or ``2026W48``) → Monday 00:00 UTC .. next Monday 00:00 UTC."""
    m = _WEEK.match(text.strip())
    if not m:
        raise QueryError(f"week {text!r} is not an ISO week: use YYYY-Www, e.g. 2026-W48")
    year, week = int(m.group(1)), int(m.group(2))
    try:
        monday = dt.datetime.fromisocalendar(year, week, 1).replace(tzinfo=dt.UTC)
    except ValueError:
        raise QueryError(f"week {text!r} does not exist: {year} has weeks 1–"
                         f"{dt.date(year, 12, 28).isocalendar().week}") from None
    since = monday.timestamp()
    return Period(f"{year}-W{week:02d}", since, since + 7 * 86400)


def last_full_week(clock: Callable[[], float] = time.time) -> Period:
    """The most recent ISO week that has ended (what a Monday-morning cron job reports)."""
    today = dt.datetime.fromtimestamp(clock(), dt.UTC).date()
    this_monday = today - dt.timedelta(days=today.weekday())
    d = (this_monday - dt.timedelta(days=7)).isocalendar()
    return iso_week(f"{d.year}-W{d.week:02d}")


def resolve(week: str | None = None, since=None, until=None, clock: Callable[[], float] = time.time) -> Period:
    """``week`` XOR ``since``/``until`` (``until`` defaults to now); neither → the last full week."""
    if week and (since or until):
        raise QueryError("give either --week or --since/--until, not both")
    if week:
        return iso_week(week)
    if since is None and until is None:
        return last_full_week(clock)
    if since is None:
        raise QueryError("--until needs --since (the report covers [since, until))")
    s = parse_time(since, clock, "since")
    u = parse_time(until, clock, "until") if until is not None else clock()
    if s is None or u is None:
        raise QueryError("--since/--until must not be empty")
    if u <= s:
        raise QueryError(f"empty period: until ({_iso(u)}) must be after since ({_iso(s)})")
    return Period(f"{_iso(s)}..{_iso(u)}", s, u)
