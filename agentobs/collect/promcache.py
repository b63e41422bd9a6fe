"""Repeated scrapes of one target, parsed cheaply: prometheus_client parses each series once.

An engine's ``/metrics`` page has the same series (name + labels) on every scrape; only the values
change. ``SeriesParser`` keeps, per target, the text of each series (``name{labels}`` — everything
before the value) mapped to its parsed name and labels. A scrape whose lines are all known costs a
dictionary lookup and a ``float()`` per line; any line not seen before — or one that does not split
as ``<known series> <value>`` (a timestamp, odd spacing, a bad value) — goes through
prometheus_client's own parser (``text_string_to_metric_families``), which also raises for a line
that is malformed. The Arrow columns of a known layout are cached too, so a steady-state scrape
builds only the value column. The rows equal ``prom.parse_text`` of the same text (a test checks it).

``parse`` is bounded: a page with more than ``max_series`` samples raises ``ScrapeLimit("too_many_series")``
as soon as the count is passed, and one still parsing at ``deadline`` (``time.monotonic()``) raises
``ScrapeLimit("timeout")``: the scraper's timeout covers fetch, parse and store.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from ..errors import InputError
from .prom import SAMPLE_SCHEMA, canonical_name, dropped, engine_of_metric, served_model_config, to_utc

_SKIP = -1  # a known series that is not stored (``*_created`` but ``prom.KEPT_CREATED``)
_CHECK_EVERY = 256  # lines between two looks at the clock


class ScrapeLimit(Exception):
    """A scrape stopped by a bound: ``reason`` is too_many_series or timeout."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(detail)


@dataclass
class Parsed:
    samples: pa.Table
    engine: str | None
    config: list[tuple[str, str]] | None  # vllm:cache_config_info labels (+ served_model_name), when present


class SeriesParser:
    def __init__(self, instance: str, extra_labels: dict[str, str] | None = None, max_series: int = 50_000):
        self.instance = instance
        self.extra = dict(extra_labels or {})
        self.max_series = max_series
        self._reset()

    def _reset(self) -> None:
        self._index: dict[str, int] = {}
        self._metric: list[str] = []
        self._labels: list[list[tuple[str, str]]] = []
        self._key: list[str] = []
        self._engine: list[str | None] = []
        self._arrays: tuple | None = None  # (metric, labels, labels_key, engine) over all series
        self._layout: list[int] | None = None
        self._layout_cols: tuple | None = None

    def _learn(self, line: str, lineno: int, where: str) -> tuple[int, float]:
        try:
            fams = list(text_string_to_metric_families(line + "\n"))
        except (ValueError, TypeError, IndexError) as e:
            raise InputError(f"invalid Prometheus text at line {lineno}: {e}: {line[:120]!r}", where) from e
        s = fams[0].samples[0]
        series = line.rsplit(" ", 1)[0] if " " in line else line
        name = canonical_name(s.name)
        if dropped(name):
            self._index[series] = _SKIP
            return _SKIP, 0.0
        labels = dict(s.labels)
        for k, v in self.extra.items():
            labels.setdefault(k, v)
        idx = len(self._metric)
        self._metric.append(name)
        self._labels.append(list(labels.items()))
        self._key.append(",".join(f"{k}={labels[k]}" for k in sorted(labels)))
        self._engine.append(engine_of_metric(name))
        self._arrays = None
        # only lines of the plain "<series> <value>" shape are cached (not ones with a timestamp)
        if series != line and s.timestamp is None:
            self._index[series] = idx
        return idx, float(s.value)

    def parse(self, text: str, at: float | dt.datetime, where: str = "scrape", deadline: float | None = None) -> Parsed:
        if len(self._metric) > self.max_series:
            self._reset()  # series churn: start over rather than grow without bound
        index = self._index
        rows: list[int] = []
        vals: list[float] = []
        cap = self.max_series
        for lineno, line in enumerate(text.split("\n"), 1):
            if not lineno % _CHECK_EVERY:
                if len(rows) > cap:
                    raise ScrapeLimit("too_many_series", f"more than {cap} series (scrape_max_series); none stored")
                if deadline is not None and time.monotonic() > deadline:
                    raise ScrapeLimit("timeout", f"still parsing at line {lineno} when the timeout passed; "
                                      "nothing stored")
            if not line or line[0] == "#":
                continue
            i = line.rfind(" ")
            idx = index.get(line[:i]) if i > 0 else None
            if idx is not None:
                if idx == _SKIP:
                    continue
                try:
                    v = float(line[i + 1:])
                except ValueError:
                    idx, v = self._learn(line, lineno, where)
            else:
                idx, v = self._learn(line.rstrip("\r"), lineno, where)
                if idx == _SKIP:
                    continue
            rows.append(idx)
            vals.append(v)
        if len(rows) > cap:
            raise ScrapeLimit("too_many_series", f"{len(rows)} series, more than {cap} (scrape_max_series); "
                              "none stored")
        ts = to_utc(at)
        n = len(rows)
        if self._layout != rows:
            if self._arrays is None:
                self._arrays = (
                    pa.array(self._metric, pa.string()),
                    pa.array(self._labels, SAMPLE_SCHEMA.field("labels").type),
                    pa.array(self._key, pa.string()),
                    pa.array(self._engine, pa.string()),
                )
            take = pa.array(rows, pa.int32())
            self._layout = rows
            self._layout_cols = tuple(a.take(take) for a in self._arrays)
            self._layout_meta = self._meta(rows)
        assert self._layout_cols is not None  # laid out above
        metric, labels, key, engine = self._layout_cols
        table = pa.Table.from_arrays(
            [pa.array([ts] * n, pa.timestamp("us")), pa.array([self.instance] * n, pa.string()),
             metric, labels, key, pa.array(vals, pa.float64()), engine],
            schema=SAMPLE_SCHEMA,
        )
        engine_name, config = self._layout_meta
        return Parsed(samples=table, engine=engine_name, config=config)

    def _meta(self, rows: list[int]) -> tuple[str | None, list[tuple[str, str]] | None]:
        """(majority engine of the metric names, vllm:cache_config_info labels and the served model name from
        the vLLM series' model_name label — prom.served_model_config) of a layout."""
        counts: dict[str, int] = {}
        config = None
        served = None
        for idx in rows:
            e = self._engine[idx]
            if e:
                counts[e] = counts.get(e, 0) + 1
            if self._metric[idx] == "vllm:cache_config_info":
                config = [kv for kv in self._labels[idx] if kv[0] not in self.extra]
            elif served is None and e == "vllm":
                served = dict(self._labels[idx]).get("model_name") or None
        return (max(counts, key=counts.__getitem__) if counts else None), (
            served_model_config(config, served) if config is not None else None)

