"""TraceLab per-call rows (coding-agent sessions recorded by their harness) → ordinary agentobs spans.

TraceLab (https://github.com/uw-syfi/TraceLab, dataset CC BY 4.0) normalizes Claude Code and Codex session logs into
JSON lines, one row per LLM round (README "Data format", artifacts/utils/DB_SCHEMA.md): ``provider``, ``session_id``,
``round_index``, ``round_id``, ``model``, the token split ``input_tokens_total = prefix_tokens + newly_append_tokens``
(``prefix_tokens``: the provider's cache read), ``output_tokens``, an ordered ``timing_events[]`` list
(``user_message``, ``tool_result``, ``reasoning``, ``text``, ``tool_call``, ``usage_report``, each with a UTC
``timestamp``) and ``tools[]`` (``tool_name``, ``tool_call_id``, ``emitted_at``, ``result_at``, latencies,
``is_error``).

What each row becomes (docs/cli.md, "agentobs import tracelab"), written through the OTLP decoder like any
span so the model views see an ordinary agent session:

- one trace per session (trace id = a hash of the session id) with an ``invoke_agent <harness>`` root span over
  the whole session (``gen_ai.agent.name`` ``claude-code`` / ``codex``, ``session.id``);
- per round a ``chat <model>`` client span under it: start = the last input event of the round (its latest
  ``user_message`` / ``tool_result``: when the model's input was complete — TraceLab's own proxy), else its first
  event; end = the last output event (``reasoning``, ``text``, ``tool_call``, ``usage_report``) at or after the
  start, else the start. ``gen_ai.usage.input_tokens`` = ``input_tokens_total``,
  ``gen_ai.usage.cache_read.input_tokens`` = ``prefix_tokens``, ``gen_ai.usage.output_tokens`` = ``output_tokens``.
  No TTFT: the harness logs whole content blocks, not the first token; the first output event's offset is kept
  as ``tracelab.first_output_s``;
- per tool call an ``execute_tool <name>`` span under the root from ``emitted_at`` to ``result_at`` (else
  ``emitted_at`` + the runner's latency, else the wall latency), status error when ``is_error``.

There is no engine, instance or block hash in a TraceLab row: sessions, hit rates (the provider's cached tokens),
idle gaps, tool time and turn-resume gaps are measured; re-prefill causes and the findings that need an engine
config are not. Span ids are hashes of the session, the round (``round_id``, ``round_index``) and its occurrence in
the file (TraceLab keeps duplicate rows), so importing a file twice adds nothing.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from ..config import Settings
from ..errors import InputError
from ..store.writer import Writer
from . import otlp
from .files import ImportResult, _log, expand

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson")
INPUT_EVENTS = ("user_message", "tool_result")
OUTPUT_EVENTS = ("reasoning", "text", "tool_call", "usage_report")
HARNESS = {"claude": ("claude-code", "anthropic"), "codex": ("codex", "openai")}
SCOPE = "agentobs.import.tracelab"


def _hex(*parts: object, nbytes: int) -> str:
    return hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=nbytes).hexdigest()


def _ns(ts: object, where: str) -> int:
    if not isinstance(ts, str) or not ts:
        raise InputError(f"timestamp {ts!r} is not an ISO-8601 string", where)
    try:
        t = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"timestamp {ts!r} is not ISO-8601", where) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return round(t.timestamp() * 1e6) * 1000


def _attr(key: str, v) -> dict:
    val: dict[str, object]
    if isinstance(v, bool):
        val = {"boolValue": v}
    elif isinstance(v, int):
        val = {"intValue": str(v)}
    elif isinstance(v, float):
        val = {"doubleValue": v}
    else:
        val = {"stringValue": str(v)}
    return {"key": key, "value": val}


def _attrs(d: dict) -> list[dict]:
    return [_attr(k, v) for k, v in d.items() if v is not None]


def _int(row: dict, key: str, where: str, required: bool = False) -> int | None:
    v = row.get(key)
    if v is None:
        if required:
            raise InputError(f"{key} is missing", where)
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise InputError(f"{key} = {v!r} is not a token count", where)
    return int(v)


def _round(row: dict, where: str) -> dict:
    """The call of one TraceLab row: times (ns), tokens, its tool calls; InputError names the bad field."""
    if not isinstance(row, dict):
        raise InputError("a row must be a JSON object", where)
    sid = row.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise InputError("session_id is missing", where)
    evs = row.get("timing_events") or []
    if not isinstance(evs, list):
        raise InputError("timing_events must be a list", where)
    times = [(e.get("event_type"), _ns(e.get("timestamp"), f"{where}: timing_events[{i}]"))
             for i, e in enumerate(evs) if isinstance(e, dict)]
    if not times:
        raise InputError("no timing_events with a timestamp: the round cannot be placed in time", where)
    ins = [t for k, t in times if k in INPUT_EVENTS]
    start = max(ins) if ins else min(t for _k, t in times)
    outs = [t for k, t in times if k in OUTPUT_EVENTS and t >= start]
    end = max(outs) if outs else start
    tools = []
    for i, tc in enumerate(row.get("tools") or []):
        w = f"{where}: tools[{i}]"
        if not isinstance(tc, dict) or not tc.get("emitted_at"):
            raise InputError("a tool call needs emitted_at", w)
        t0 = _ns(tc["emitted_at"], w)
        if tc.get("result_at"):
            t1 = _ns(tc["result_at"], w)
        else:
            ms = tc.get("tool_internal_latency_ms") if tc.get("tool_internal_latency_ms") is not None \
                else tc.get("tool_wall_latency_ms")
            t1 = t0 + int(float(ms) * 1e6) if ms is not None else t0
        tools.append({"name": str(tc.get("tool_name") or "tool"), "id": tc.get("tool_call_id"), "start": t0,
                      "end": max(t0, t1), "error": tc.get("is_error") is True, "index": tc.get("tool_index", i)})
    return {"sid": sid, "provider": str(row.get("provider") or ""), "model": row.get("model"),
            "index": row.get("round_index"), "round_id": row.get("round_id"), "project": row.get("project"),
            "start": start, "end": end, "first_out": min(outs) if outs else None,
            "p": _int(row, "input_tokens_total", where, required=True), "c": _int(row, "prefix_tokens", where),
            "o": _int(row, "output_tokens", where), "reasoning": _int(row, "reasoning_output_tokens", where),
            "cache_write": _int(row, "claude_cache_creation_input_tokens", where), "tools": tools}


def to_otlp(rounds: list[dict]) -> dict:
    """An OTLP/JSON document (one resourceSpans) with the spans of ``rounds`` (``_round`` results, file order)."""
    by_sid: dict[str, list[dict]] = {}
    for r in rounds:
        by_sid.setdefault(r["sid"], []).append(r)
    spans: list[dict] = []
    for sid, rs in by_sid.items():
        trace = _hex("tracelab", sid, nbytes=16)
        root = _hex("tracelab", sid, "root", nbytes=8)
        agent, provider = HARNESS.get(rs[0]["provider"], (rs[0]["provider"] or "agent", rs[0]["provider"] or None))
        common = {"session.id": sid, "gen_ai.conversation.id": sid}
        seen: dict[tuple, int] = {}
        lo = min(min([r["start"]] + [t["start"] for t in r["tools"]]) for r in rs)
        hi = max(max([r["end"]] + [t["end"] for t in r["tools"]]) for r in rs)
        spans.append({"traceId": trace, "spanId": root, "name": f"invoke_agent {agent}", "kind": 1,
                      "startTimeUnixNano": str(lo), "endTimeUnixNano": str(hi),
                      "attributes": _attrs({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
                                            **common, "tracelab.project": rs[0]["project"]})})
        for r in rs:
            k = (r["round_id"], r["index"])
            n = seen[k] = seen.get(k, -1) + 1
            sp = _hex("tracelab", sid, r["round_id"], r["index"], n, nbytes=8)
            spans.append({"traceId": trace, "spanId": sp, "parentSpanId": root, "name": f"chat {r['model'] or ''}".rstrip(),
                          "kind": 3, "startTimeUnixNano": str(r["start"]), "endTimeUnixNano": str(r["end"]),
                          "attributes": _attrs({
                              "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
                              "gen_ai.request.model": r["model"], "gen_ai.response.model": r["model"],
                              "gen_ai.agent.name": agent, **common, "gen_ai.response.id": r["round_id"],
                              "gen_ai.usage.input_tokens": r["p"], "gen_ai.usage.cache_read.input_tokens": r["c"],
                              "gen_ai.usage.output_tokens": r["o"],
                              "gen_ai.usage.reasoning.output_tokens": r["reasoning"],
                              "tracelab.round_index": r["index"], "tracelab.cache_creation_input_tokens":
                                  r["cache_write"],
                              "tracelab.first_output_s": None if r["first_out"] is None
                              else (r["first_out"] - r["start"]) / 1e9})})
            for t in r["tools"]:
                tid = _hex("tracelab", sid, r["round_id"], r["index"], n, "tool", t["index"], t["id"], nbytes=8)
                spans.append({"traceId": trace, "spanId": tid, "parentSpanId": root, "name": f"execute_tool {t['name']}",
                              "kind": 1, "startTimeUnixNano": str(t["start"]), "endTimeUnixNano": str(t["end"]),
                              "status": {"code": 2} if t["error"] else {},
                              "attributes": _attrs({"gen_ai.operation.name": "execute_tool",
                                                    "gen_ai.tool.name": t["name"], "gen_ai.tool.call.id": t["id"],
                                                    **common})})
    return {"resourceSpans": [{"resource": {"attributes": _attrs({"service.name": "tracelab"})},
                               "scopeSpans": [{"scope": {"name": SCOPE}, "spans": spans}]}]}


def _lines(path: Path) -> Iterable[tuple[int, str]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                yield i, line


def read(path: Path, res: ImportResult) -> list[dict]:
    """The rounds of one file; a bad row is an error naming its line (the others still import)."""
    rounds = []
    try:
        for i, line in _lines(path):
            where = f"{path.name}:{i}"
            try:
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise InputError(f"not JSON ({e.msg if isinstance(e, json.JSONDecodeError) else e})", where) from e
                rounds.append(_round(row, where))
            except InputError as e:
                res.errors.append(str(e))
                res.rejected += 1
    except (OSError, UnicodeDecodeError, EOFError) as e:
        res.errors.append(f"{path}: cannot read ({type(e).__name__}: {e})")
        res.rejected += 1
    return rounds


def import_tracelab(paths: Iterable[str | os.PathLike], writer: Writer, settings: Settings) -> ImportResult:
    """TraceLab JSON-lines files (.gz too; directories recursively) into the store's spans."""
    res = ImportResult("tracelab")
    paths = list(paths)
    rounds: list[dict] = []
    for path in expand(paths, SUFFIXES):
        res.files += 1
        rounds += read(path, res)
    if rounds:
        dec = otlp.decode_json_obj(to_otlp(rounds), settings, source="file:tracelab", where="tracelab")
        res.errors.extend(dec.errors)
        res.warnings.extend(dec.warnings)
        res.rejected += dec.rejected
        res.accepted += dec.accepted
        if dec.accepted:
            res.inserted += writer.submit("spans", dec.table()).wait()
    _log(writer, res, ",".join(map(str, paths)))
    writer.flush()
    return res
