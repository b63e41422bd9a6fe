"""Held results: big read-only results cached as one object (``st.cache_resource``) instead of a pickle that every
cache hit copies back (``st.cache_data``).

Why and what it saves: docs/console.md, "Caching and performance". A held
function is keyed exactly as its ``st.cache_data`` entry was (its first argument the db stamp, then the rest), keeps
at most ``max_entries`` results for at most ``ttl`` seconds, and hands every caller its own copy of the result's
containers: polars frames cloned (the clone shares the column buffers: no row is copied), dicts, lists and tuples
rebuilt, so a page that changes what it got (renames a column, inserts one, clears a dict) cannot change what the
next page reads. Other values (numbers, strings) are immutable and handed out as they are.

A stamp never seen before for its store (the stamp's backend and path or URL) is the store's new state: the results
held under its earlier stamps are dropped at once rather than left to ``max_entries`` (they cannot be hit again, and
each may hold hundreds of MB at 10M calls). A page still running on an earlier stamp (another browser session, mid-run)
recomputes what it asks for and holds it under its stamp until the next new stamp.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import polars as pl
import streamlit as st

R = TypeVar("R")

# the earlier stamps remembered per store (so a late run on one of them is not taken for a new state)
STAMPS_KEPT = 8


def own(value: Any) -> Any:
    """``value`` with its containers the caller's own: frames cloned (no data copied), dicts/lists/tuples rebuilt."""
    if isinstance(value, pl.DataFrame):
        return value.clone()
    if isinstance(value, dict):
        return {k: own(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(own(v) for v in value)
    if isinstance(value, list):
        return [own(v) for v in value]
    return value


class Held(Generic[R]):
    """``fn(stamp, *args)`` held in ``st.cache_resource`` (``shared``); calling it returns the caller's own copy
    (``own``) and drops what earlier stamps of the store hold (module docstring)."""

    def __init__(self, fn: Callable[..., R], show_spinner: bool | str, max_entries: int, ttl: float):
        self.shared = st.cache_resource(show_spinner=show_spinner, max_entries=max_entries, ttl=ttl)(fn)
        self.__doc__ = fn.__doc__
        self._lock = threading.Lock()
        # store → {stamp: [the argument tuples held under it]}, oldest stamp first
        self._stamps: dict[tuple, dict[tuple, list[tuple]]] = {}

    def __call__(self, stamp: tuple, *args: Any) -> R:
        self._note(stamp, args)
        return own(self.shared(stamp, *args))

    def _note(self, stamp: tuple, args: tuple) -> None:
        drop: list[tuple] = []
        with self._lock:
            seen = self._stamps.setdefault(tuple(stamp[:2]), {})
            if stamp not in seen:
                for old, held in seen.items():
                    drop.extend((old, *a) for a in held)
                    held.clear()
                seen[stamp] = []
                while len(seen) > STAMPS_KEPT:
                    del seen[next(iter(seen))]
            if args not in seen[stamp]:
                seen[stamp].append(args)
        for key in drop:
            self.shared.clear(*key)


def held(show_spinner: bool | str = False, max_entries: int = 32, ttl: float = 3600
         ) -> Callable[[Callable[..., R]], Held[R]]:
    """Decorator: ``fn(stamp, *args)`` as a ``Held`` (module docstring). Call it with positional arguments."""
    def wrap(fn: Callable[..., R]) -> Held[R]:
        return Held(fn, show_spinner, max_entries, ttl)
    return wrap
