"""Load a simulator output directory into a store through the normal importers.

``manifest.json`` (written by the simulator, emit.py) names the OTLP files, and per instance its
Prometheus snapshot directory, SGLang /server_info and KV-event capture. Every file goes through
agentobs/collect/files.py exactly as a user's own files would; the ground truth stays in the bundle.

Re-basing (``rebase_to``, `agentobs import bundle --rebase-to now|EPOCH`, `agentobs demo`): the bundle is
imported into an in-memory staging store first; then every timestamp of every kind (span start/end and event
times, Prometheus sample times, engine config times, KV-event times) moves by one offset of whole seconds, chosen
so that the newest of them lands at ``rebase_to`` (within the second before it), and the shifted rows go through
the caller's writer. Relative timing is exact (an integer number of seconds added to nanosecond and
microsecond values). The files are not changed; derived data (the KV-event index) is built from the shifted
rows afterwards by whoever refreshes it (`agentobs import bundle` does).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pyarrow as pa

from ..config import Settings
from ..errors import InputError
from ..store.writer import Writer
from .files import ImportResult, import_kv_events, import_otlp, import_prom, import_server_info

FORMAT = "agentobs-sim-bundle/1"


def read_manifest(root: str | os.PathLike) -> dict:
    p = Path(root) / "manifest.json"
    try:
        m = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError("no manifest.json: not a simulator bundle (run `agentobs simulate --out DIR`)", str(root)) from None
    except ValueError as e:
        raise InputError(f"manifest.json is not JSON: {e}", str(p)) from e
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise InputError(f"manifest format is {m.get('format') if isinstance(m, dict) else m!r}, expected {FORMAT!r}", str(p))
    for i, inst in enumerate(m.get("instances") or []):
        if not isinstance(inst, dict) or not inst.get("instance"):
            raise InputError(f"instances[{i}] has no 'instance'", str(p))
    return m


class BundleResult(dict):
    """``{kind: ImportResult}`` as before, plus ``offset_s``: the whole seconds every timestamp moved (0 when not
    re-based) and ``newest``: the newest timestamp of the bundle after the shift (epoch seconds)."""

    offset_s: int = 0
    newest: float | None = None


def import_bundle(root: str | os.PathLike, writer: Writer, settings: Settings, progress=None,
                  rebase_to: float | str | None = None) -> BundleResult:
    """Import a bundle through ``writer``. ``rebase_to`` (epoch seconds, or ``"now"``: the wall clock once the
    bundle is read) shifts every timestamp so the newest lands there (module docstring)."""
    if rebase_to is None:
        return _import(root, writer, settings, progress)
    if isinstance(rebase_to, str) and rebase_to != "now":
        raise InputError(f"rebase_to must be epoch seconds or 'now', not {rebase_to!r}")
    from ..store.db import connect

    stage = connect(":memory:")
    try:
        with Writer(stage) as sw:
            out = _import(root, sw, settings, progress)
        newest = _newest(stage)
        if newest is None:
            return out
        target = time.time() if rebase_to == "now" else float(rebase_to)
        out.offset_s = math.floor(target - newest)
        out.newest = newest + out.offset_s
        copied = _copy_shifted(stage, writer, out.offset_s)
    finally:
        stage.close()
    for kind, table in _RESULT_TABLE.items():  # the staging store was empty: what the target already held is
        rows, inserted = copied.get(table, (0, 0))  # the difference
        out[kind].inserted = max(0, out[kind].inserted - (rows - inserted))
    return out


# which staged table each result of ``_import`` counts (its ``inserted`` is the target's, after a re-base)
_RESULT_TABLE = {"spans": "spans", "samples": "metric_samples", "config keys": "engine_config",
                 "kv events": "kv_events"}
# tables whose times are the data's (ingest_log's are the import's own and stay)
_SHIFTED = ("spans", "metric_samples", "scrapes", "engine_config", "kv_events")
_KEEP = ("ingest_log",)
_NS = 1_000_000_000


def _time_columns(con, table: str) -> tuple[list[str], list[str]]:
    """(TIMESTAMP columns, BIGINT epoch-nanosecond columns ``*_ns``) of a staged table."""
    rows = con.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
                       "ORDER BY ordinal_position", [table]).fetchall()
    ts = [c for c, t in rows if t.startswith("TIMESTAMP")]
    ns = [c for c, t in rows if t == "BIGINT" and c.endswith("_ns")]
    return ts, ns


def _newest(con) -> float | None:
    """The newest timestamp of any kind in the staged store, epoch seconds."""
    parts = []
    for table in _SHIFTED:
        ts, ns = _time_columns(con, table)
        parts += [f"(SELECT max(epoch_us({c})) / 1e6 FROM {table})" for c in ts]
        parts += [f"(SELECT max({c}) / 1e9 FROM {table})" for c in ns]
    parts.append("(SELECT max(CAST(e->>'time_ns' AS BIGINT)) / 1e9 FROM "
                 "(SELECT unnest(CAST(events AS JSON[])) AS e FROM spans WHERE events IS NOT NULL))")
    return con.execute(f"SELECT greatest({', '.join(parts)})").fetchone()[0]


def _copy_shifted(stage, writer: Writer, offset_s: int, chunk_rows: int = 250_000) -> dict[str, tuple[int, int]]:
    """Every staged row into ``writer`` with its times moved by ``offset_s``; (rows, rows inserted) per table."""
    tickets: dict[str, list] = {}
    for table in _SHIFTED + _KEEP:
        repl = []
        if table in _SHIFTED:
            ts, ns = _time_columns(stage, table)
            repl += [f"{c} + INTERVAL {offset_s} SECOND AS {c}" for c in ts]
            repl += [f"{c} + {offset_s * _NS} AS {c}" for c in ns]
            if table == "spans":  # span events: {"name", "time_ns", "attributes"?} in a JSON list
                repl.append("CASE WHEN events IS NULL THEN NULL ELSE to_json(list_transform(CAST(events AS JSON[]), "
                            "lambda e: json_merge_patch(e, json_object('time_ns', CAST(e->>'time_ns' AS BIGINT) + "
                            f"{offset_s * _NS})))) END AS events")
        sel = f"SELECT * REPLACE ({', '.join(repl)}) FROM {table}" if repl else f"SELECT * FROM {table}"
        reader = stage.sql(sel).to_arrow_reader(chunk_rows)
        for batch in reader:
            if batch.num_rows:
                tickets.setdefault(table, []).append(writer.submit(table, pa.Table.from_batches([batch])))
    return {table: (sum(t.rows for t in ts), sum(t.wait() for t in ts)) for table, ts in tickets.items()}


def _import(root: str | os.PathLike, writer: Writer, settings: Settings, progress=None) -> BundleResult:
    root = Path(root)
    m = read_manifest(root)
    out = BundleResult()
    spans = ImportResult("otlp")
    for rel in m.get("otlp") or []:
        spans.merge(import_otlp([root / rel], writer, settings, progress=progress))
    out["spans"] = spans
    prom = ImportResult("prometheus")
    cfg = ImportResult("server-info")
    kv = ImportResult("kv-events")
    for inst in m.get("instances") or []:
        name = inst["instance"]
        if inst.get("prom_dir"):
            prom.merge(import_prom([root / inst["prom_dir"]], name, writer, progress=progress))
        if inst.get("server_info"):
            cfg.merge(import_server_info(root / inst["server_info"], name, writer, at=m.get("server_info_at")))
        if inst.get("kv_events"):
            kv.merge(import_kv_events([root / inst["kv_events"]], writer, name, progress=progress))
    out["samples"] = prom
    out["config keys"] = cfg
    out["kv events"] = kv
    return out
