"""Times and spans as people write them (flags, URL parameters): one grammar for every command and page.

- an instant: epoch seconds (``1760432400``) or ISO-8601 (``2026-10-14T09:00``, ``…Z``, ``…+02:00``), UTC unless
  it says otherwise; from Python, also a ``datetime`` (naive = UTC) or a ``date`` (its midnight UTC);
- a span: a number and a unit, ``90m``, ``24h``, ``7d``, ``2w`` (units ``s m h d w``; durations also ``ms``),
  read before or after ``clock()`` where the caller allows it (``--since 24h``: 24 hours before now).

These functions raise ``ValueError``; each caller words the error for its flag (and its exception type).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable
from typing import overload

SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def span_s(text: str, ms: bool = False) -> float | None:
    """Seconds of a span such as ``24h`` (``250ms`` only when ``ms``), or None when ``text`` is not a span."""
    m = SPAN.match(text)
    if m is None or (m.group(2) == "ms" and not ms):
        return None
    return float(m.group(1)) * UNIT_S[m.group(2)]


def _parse(value, clock: Callable[[], float], spans: int, epoch: bool) -> float | dt.datetime | None:
    """Epoch seconds (a number, a span, a date) or an aware UTC datetime (ISO-8601, a datetime): each in the form
    it was exact in. None → None."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and epoch:
        return float(value)
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a time")
    s = value.strip()
    if spans:
        span = span_s(s)
        if span is not None:
            return clock() + spans * span
    if epoch:
        try:
            return float(s)
        except ValueError:
            pass
    d = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))  # ValueError when it is not ISO-8601
    return d.astimezone(dt.UTC) if d.tzinfo else d.replace(tzinfo=dt.UTC)


def parse_time(value, clock: Callable[[], float] = time.time, spans: int = 0, epoch: bool = True) -> float | None:
    """Epoch seconds of an instant (module docstring); None → None. ``spans``: -1 reads ``24h`` as that long before
    ``clock()``, +1 as that long after it, 0 refuses spans; ``epoch=False`` refuses numbers. Raises ValueError
    (TypeError for a value of another type)."""
    t = _parse(value, clock, spans, epoch)
    return t.timestamp() if isinstance(t, dt.datetime) else t


@overload
def parse_utc(value: None, clock: Callable[[], float] = ..., spans: int = ..., epoch: bool = ...) -> None: ...
@overload
def parse_utc(value: str | float | dt.datetime, clock: Callable[[], float] = ..., spans: int = ...,
              epoch: bool = ...) -> dt.datetime: ...
def parse_utc(value, clock: Callable[[], float] = time.time, spans: int = 0, epoch: bool = True) -> dt.datetime | None:
    """The same instant as a naive UTC datetime (what DuckDB's TIMESTAMP columns and the console hold)."""
    t = _parse(value, clock, spans, epoch)
    if t is None:
        return None
    if isinstance(t, dt.datetime):
        return t.replace(tzinfo=None)
    return dt.datetime.fromtimestamp(t, dt.UTC).replace(tzinfo=None)
