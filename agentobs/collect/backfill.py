"""Backfill ``metric_samples`` from a Prometheus server's HTTP API (teams that already scrape).

1. ``GET /api/v1/label/__name__/values`` lists metric names; the engine families are those starting
   ``vllm:``/``sglang:`` or their Prometheus-3 escaped forms ``vllm_``/``sglang_``.
2. For each name, ``GET /api/v1/query_range?query={__name__="<name>"}&start&end&step`` in windows of
   at most 10,000 steps (Prometheus refuses more than 11,000 points per series).
3. Each series' Prometheus ``instance`` label becomes our ``instance``; ``instance`` and ``job`` are
   dropped from the labels (they are Prometheus' target labels, not the engine's) so rows match live
   scrapes of the same engine. Names are stored in colon form, ``*_created`` skipped but for
   ``prom.KEPT_CREATED`` (as the scraper stores them).

``fetch(url, timeout) -> Response`` is injected (default: the scraper's HTTP GET).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlencode

import pyarrow as pa

from .. import times
from ..errors import InputError
from ..redact import mask_url
from ..store.writer import Writer
from .prom import SAMPLE_SCHEMA, canonical_name, dropped, engine_of_metric
from .scraper import FetchError, Response, http_fetch

ENGINE_NAME = re.compile(r"^(vllm|sglang)[:_][a-z]")
MAX_STEPS = 10_000


def parse_duration(s: str, what: str) -> float:
    v = times.span_s(s, ms=True)
    if v is None:
        raise InputError(f"{s!r} is not a duration like 15s, 5m, 7d", what)
    if v <= 0:
        raise InputError(f"{s!r} must be positive", what)
    return v


@dataclass
class BackfillResult:
    names: int = 0
    series: int = 0
    samples: int = 0
    inserted: int = 0
    errors: list[str] = field(default_factory=list)


def _get(fetch, url: str, timeout: float) -> dict:
    try:
        r = fetch(url, timeout)
    except FetchError as e:
        raise InputError(f"{e.reason}: {e}", mask_url(url)) from None  # the fetch error names the URL unmasked
    try:
        doc = json.loads(r.body)
    except ValueError:
        raise InputError(f"HTTP {r.status}, not a Prometheus API JSON answer: {r.body[:120]!r}",
                         mask_url(url)) from None
    if r.status != 200 or doc.get("status") != "success":
        raise InputError(f"HTTP {r.status}: {doc.get('errorType', '')} {doc.get('error', '')}".strip(), mask_url(url))
    return doc


def engine_metric_names(base: str, fetch=http_fetch, timeout: float = 30.0) -> list[str]:
    doc = _get(fetch, f"{base}/api/v1/label/__name__/values", timeout)
    names = doc.get("data") or []
    return sorted(n for n in names if isinstance(n, str) and ENGINE_NAME.match(n) and not dropped(canonical_name(n)))


def backfill(base: str, since_s: float, step_s: float, writer: Writer, end: float,
             fetch: Callable[[str, float], Response] = http_fetch, timeout: float = 60.0,
             names: list[str] | None = None, progress=None) -> BackfillResult:
    base = base.rstrip("/")
    res = BackfillResult()
    names = names if names is not None else engine_metric_names(base, fetch, timeout)
    res.names = len(names)
    start = end - since_s
    window = step_s * MAX_STEPS
    tickets = []
    for name in names:
        metric = canonical_name(name)
        t = start
        while t <= end:
            t_end = min(end, t + window)
            q = urlencode({"query": f'{{__name__="{name}"}}', "start": f"{t:.3f}", "end": f"{t_end:.3f}",
                           "step": f"{step_s:g}"})
            try:
                doc = _get(fetch, f"{base}/api/v1/query_range?{q}", timeout)
                table, n_series = _rows(doc, metric, f"{name} {t:.0f}..{t_end:.0f}")
            except InputError as e:
                res.errors.append(str(e))
                t = t_end + step_s
                continue
            res.series += n_series
            res.samples += table.num_rows
            if table.num_rows:
                tickets.append(writer.submit("metric_samples", table))
            t = t_end + step_s
        if progress:
            progress(1)
    for tk in tickets:
        res.inserted += tk.wait()
    return res


def _rows(doc: dict, metric: str, where: str) -> tuple[pa.Table, int]:
    data = doc.get("data") or {}
    if data.get("resultType") != "matrix":
        raise InputError(f"expected a matrix result, got {data.get('resultType')!r}", where)
    cols: dict[str, list] = {n: [] for n in SAMPLE_SCHEMA.names}
    engine = engine_of_metric(metric)
    result = data.get("result") or []
    for si, series in enumerate(result):
        m = dict(series.get("metric") or {})
        inst = m.pop("instance", None)
        if not inst:
            raise InputError(f"result[{si}] has no 'instance' label", where)
        m.pop("__name__", None)
        m.pop("job", None)
        labels = list(m.items())
        key = ",".join(f"{k}={m[k]}" for k in sorted(m))
        for pt in series.get("values") or []:
            try:
                ts = dt.datetime.fromtimestamp(float(pt[0]), dt.UTC).replace(tzinfo=None)
                v = float(pt[1])
            except (TypeError, ValueError, IndexError):
                raise InputError(f"result[{si}] has a malformed point {pt!r}", where) from None
            cols["ts"].append(ts)
            cols["instance"].append(inst)
            cols["metric"].append(metric)
            cols["labels"].append(labels)
            cols["labels_key"].append(key)
            cols["value"].append(v)
            cols["engine"].append(engine)
    return pa.table(cols, schema=SAMPLE_SCHEMA), len(result)
