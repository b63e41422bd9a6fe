"""Saved queries of the SQL page: built-in examples plus the user's own, kept in a JSON file.

The file is ``$AGENTOBS_CONSOLE_QUERIES``, else ``~/.config/agentobs/console_queries.json``; it is a JSON
object ``{"name": "SELECT ..."}`` written atomically. The store itself is never written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import InputError
from ..output import atomic_write

EXAMPLES: tuple[tuple[str, str], ...] = (
    ("example: slowest first tokens", """SELECT session_id, call_id, instance, model, round(ttft_s, 3) AS ttft_s,
       prompt_tokens, cached_tokens
FROM llm_calls
ORDER BY ttft_s DESC NULLS LAST
LIMIT 20"""),
    ("example: sessions with most calls", """SELECT session_id, task_type, calls, retries, instances,
       prompt_tokens, cached_tokens, errors
FROM sessions
ORDER BY calls DESC
LIMIT 20"""),
    ("example: long idle gaps", """SELECT session_id, prev_call_id, call_id, round(gap_s, 1) AS gap_s,
       prev_instance, instance, prompt_tokens, cached_tokens
FROM turn_gaps
WHERE gap_s > 30
ORDER BY gap_s DESC"""),
    ("example: tool time per tool", """SELECT tool_name, count(*) AS calls, round(sum(duration_s), 1) AS total_s,
       round(median(duration_s), 2) AS p50_s
FROM tool_calls
GROUP BY tool_name
ORDER BY total_s DESC"""),
    ("example: engine metrics available", """SELECT engine, instance, metric, count(*) AS samples,
       min(ts) AS first, max(ts) AS last
FROM metric_samples
GROUP BY ALL
ORDER BY engine, instance, metric"""),
)


def path() -> Path:
    env = os.environ.get("AGENTOBS_CONSOLE_QUERIES")
    return Path(env) if env else Path.home() / ".config" / "agentobs" / "console_queries.json"


def user_queries(p: Path | None = None) -> dict[str, str]:
    p = p or path()
    if not p.exists():
        return {}
    try:
        obj = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON ({e.msg} at line {e.lineno} column {e.colno}); fix or delete the file",
                         str(p)) from e
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise InputError('expected a JSON object {"name": "SELECT ..."}', str(p))
    return obj


def load(p: Path | None = None) -> list[tuple[str, str]]:
    """Examples first, then the user's queries (an unreadable file is reported, examples still load)."""
    try:
        mine = user_queries(p)
    except InputError:
        mine = {}
    return [*EXAMPLES, *sorted(mine.items())]


def save(name: str, sql: str, p: Path | None = None) -> Path:
    if not name or not name.strip():
        raise InputError("a saved query needs a name")
    if name.startswith("example:"):
        raise InputError(f"{name!r}: names starting with 'example:' are reserved for the built-in examples")
    p = p or path()
    queries = user_queries(p)
    queries[name] = sql
    atomic_write(p, (json.dumps(queries, indent=1, sort_keys=True) + "\n").encode())
    return p
