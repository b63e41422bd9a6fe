"""One trace's span tree, as stored (the ``spans`` table, docs/schema.md): what ``agentobs trace ID`` prints and the
console's Trace page draws as a waterfall.

A trace is found by its trace id, or by the id of any span in it (a call id is its gateway or engine span id).
The tree follows ``parent_span_id``; a span whose parent is not in the store (not exported, or a remote parent)
is a root. Children are ordered by start time. Every node keeps its offset from the trace's first start and its
duration; an engine span with the engine's phase times (``queue_s``, ``prefill_s``, ``decode_s``, promoted from
the engines' attributes, docs/span-conventions.md) gets its phases as consecutive segments from its start.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import AgentobsError

FIND_SQL = """
SELECT trace_id FROM spans WHERE trace_id = $trace_ident OR span_id = $trace_ident
ORDER BY (trace_id = $trace_ident) DESC LIMIT 1
"""

SPANS_SQL = """
SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, status_message, service_name,
       role, op, session_id, task_id, agent_name, branch, attempt, model, engine, instance, input_tokens,
       cached_tokens, output_tokens, ttft_s, queue_s, prefill_s, decode_s, tool_name, finish_reason, error_type,
       request_id, response_id, attributes{events}
FROM spans WHERE trace_id = $trace_id ORDER BY start_ns, span_id
"""

MAX_SPANS = 5000

PHASES = ("queue_s", "prefill_s", "decode_s")


class TraceNotFound(AgentobsError):
    """No span with that trace or span id."""


@dataclass
class Node:
    span: dict
    depth: int
    offset_s: float             # start − the trace's first start
    duration_s: float | None    # None: the span has no end
    prefix: str = ""            # the tree drawing before the name ("│  ├─ ")
    children: list = field(default_factory=list)

    @property
    def span_id(self) -> str:
        return self.span["span_id"]

    @property
    def role(self) -> str:
        return self.span.get("role") or "other"

    def phases(self) -> list[tuple[str, float, float]]:
        """The engine request's phases as (name, offset_s, duration_s), consecutive from the span's start."""
        out, t = [], self.offset_s
        for p in PHASES:
            d = self.span.get(p)
            if d is not None and d >= 0:
                out.append((p[:-2], t, float(d)))
                t += float(d)
        return out

    def attributes(self) -> dict:
        """The span's attributes: JSON text (DuckDB store), or a map (ClickHouse: key/value pairs)."""
        a = self.span.get("attributes")
        if isinstance(a, str):
            try:
                a = json.loads(a)
            except ValueError:
                return {"attributes": a}
        if isinstance(a, list):
            return {(kv["key"] if isinstance(kv, dict) else kv[0]): (kv["value"] if isinstance(kv, dict) else kv[1])
                    for kv in a}
        return dict(a or {})

    def events(self) -> list:
        e = self.span.get("events")
        if isinstance(e, str):
            try:
                return json.loads(e) or []
            except ValueError:
                return []
        return list(e or [])

    def detail(self) -> str:
        """One line of what matters for the span's role: model, instance, tokens, TTFT, phases; tool name; error."""
        s = self.span
        bits: list[str] = []
        if s.get("model") and self.role in ("gateway", "engine"):
            bits.append(str(s["model"]))
        if s.get("instance"):
            bits.append(str(s["instance"]))
        if s.get("input_tokens") is not None:
            tok = f"P {int(s['input_tokens']):,}"
            if s.get("cached_tokens") is not None:
                tok += f" C {int(s['cached_tokens']):,}"
            if s.get("output_tokens") is not None:
                tok += f" O {int(s['output_tokens']):,}"
            bits.append(tok)
        if s.get("ttft_s") is not None:
            bits.append(f"TTFT {_secs(s['ttft_s'])}")
        ph = self.phases()
        if ph:
            bits.append(" · ".join(f"{n} {_secs(d)}" for n, _o, d in ph))
        if s.get("tool_name") and self.role == "tool":
            bits.append(str(s["tool_name"]))
        if s.get("session_id") and self.depth == 0:
            bits.append(f"session {s['session_id']}")
        if s.get("status_code") == 2:
            bits.append(f"ERROR {s.get('error_type') or s.get('status_message') or ''}".rstrip())
        return "  ".join(bits)


@dataclass
class Trace:
    trace_id: str
    nodes: list[Node]           # depth-first, children by start time
    start_ns: int
    end_ns: int
    truncated: bool = False

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def node(self, span_id: str) -> Node | None:
        return next((n for n in self.nodes if n.span_id == span_id), None)

    def session_ids(self) -> list[str]:
        return sorted({n.span["session_id"] for n in self.nodes if n.span.get("session_id")})

    def rows(self) -> list[dict]:
        """One row per span in tree order (the CLI table, the console's waterfall)."""
        return [{"span_id": n.span_id, "parent_span_id": n.span.get("parent_span_id"), "depth": n.depth,
                 "tree": n.prefix + (n.span.get("name") or ""), "name": n.span.get("name"), "role": n.role,
                 "offset_s": n.offset_s, "duration_s": n.duration_s, "detail": n.detail()} for n in self.nodes]

    def to_dict(self) -> dict:
        def one(n: Node) -> dict:
            s = {k: v for k, v in n.span.items() if k not in ("attributes", "events") and v is not None}
            return {**s, "offset_s": n.offset_s, "duration_s": n.duration_s,
                    "phases": [{"phase": p, "offset_s": o, "duration_s": d} for p, o, d in n.phases()],
                    "attributes": n.attributes(), "events": n.events(), "children": [one(c) for c in n.children]}

        return {"trace_id": self.trace_id, "duration_s": self.duration_s, "spans": len(self.nodes),
                "truncated": self.truncated, "roots": [one(n) for n in self.nodes if n.depth == 0]}


def _secs(v) -> str:
    v = float(v)
    return f"{v * 1000:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"


Query = Callable[[str, dict], list[dict]]


def load(query: Query, ident: str, events: bool = True) -> Trace:
    """The trace holding ``ident`` (a trace id or any of its span ids; hex, any case). ``query(sql, params)``
    returns rows as dicts (a DuckDB connection: :func:`duckdb_query`; the console: its backend's query).
    ``events``: read the spans' events too (the DuckDB store keeps them; the ClickHouse model does not)."""
    key = (ident or "").strip().lower()
    if not key:
        raise TraceNotFound("no trace id given")
    found = query(FIND_SQL, {"trace_ident": key})
    if not found:
        raise TraceNotFound(f"no span with trace id or span id {ident!r} in the store (ids are hex, as "
                            "`agentobs calls` prints call_id and `agentobs sql \"SELECT trace_id FROM llm_calls\"`)")
    tid = found[0]["trace_id"]
    spans = query(SPANS_SQL.format(events=", events" if events else ""), {"trace_id": tid})
    truncated = len(spans) > MAX_SPANS
    spans = spans[:MAX_SPANS]
    return build(tid, spans, truncated)


def build(trace_id: str, spans: list[dict], truncated: bool = False) -> Trace:
    """The tree of ``spans`` (rows of SPANS_SQL)."""
    if not spans:
        raise TraceNotFound(f"trace {trace_id} has no spans")
    t0 = min(int(s["start_ns"]) for s in spans)
    t1 = max(int(s["end_ns"] or s["start_ns"]) for s in spans)
    ids = {s["span_id"] for s in spans}
    kids: dict[str | None, list[dict]] = {}
    for s in spans:
        p = s.get("parent_span_id")
        kids.setdefault(p if p in ids and p != s["span_id"] else None, []).append(s)
    for v in kids.values():
        v.sort(key=lambda s: (int(s["start_ns"]), s["span_id"]))
    nodes: list[Node] = []
    seen: set[str] = set()

    def walk(s: dict, depth: int, lead: str, last: bool, parent: Node | None) -> None:
        if s["span_id"] in seen:   # a cycle in malformed data: each span once
            return
        seen.add(s["span_id"])
        end = s.get("end_ns")
        n = Node(s, depth, (int(s["start_ns"]) - t0) / 1e9,
                 None if end is None else (int(end) - int(s["start_ns"])) / 1e9,
                 "" if depth == 0 else lead + ("└─ " if last else "├─ "))
        nodes.append(n)
        if parent is not None:
            parent.children.append(n)
        cs = kids.get(s["span_id"], [])
        nxt = "" if depth == 0 else lead + ("   " if last else "│  ")
        for i, c in enumerate(cs):
            walk(c, depth + 1, nxt, i == len(cs) - 1, n)

    for r in kids.get(None, []):
        walk(r, 0, "", True, None)
    return Trace(trace_id, nodes, t0, t1, truncated)


def duckdb_query(con) -> Query:
    def q(sql: str, params: dict) -> list[dict]:
        rel = con.sql(sql, params=params)
        cols = rel.columns
        return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]

    return q
