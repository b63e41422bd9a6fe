"""`agentobs` commands: query."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from ..config import settings_markdown
from ..errors import AgentobsError
from .base import Ctx, _emit, _open, _source, backend_opts, cli, common, console, err_console


# -- sql -------------------------------------------------------------------------------------------
@cli.command("sql")
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]), default="table")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the result to a file (atomically).")
@click.option("--max-rows", type=int, default=None, help="Row cap (default: setting sql_row_cap).")
@click.option("--timeout", type=float, default=None, help="Time limit in seconds (default: setting sql_timeout_s).")
@backend_opts
@common
def sql_cmd(ctx: Ctx, query, fmt, out, max_rows, timeout, backend, clickhouse_url):
    """Run one read-only SELECT over the store (no writes, no file or network access). With --backend
    clickhouse: ClickHouse SQL over the same views (llm_calls, sessions, ...)."""
    from ..output import atomic_write, render

    if fmt == "parquet" and not out:
        raise click.UsageError("--format parquet needs --out FILE")
    cap, limit = max_rows or ctx.settings.sql_row_cap, timeout or ctx.settings.sql_timeout_s
    with _source(ctx, backend, clickhouse_url) as src:
        res = src.user_sql(query, row_cap=cap, timeout_s=limit)
    data = render(res.table, fmt, console=console if not out else Console(file=open(out, "w")))  # noqa: SIM115
    if data is not None:
        if out:
            atomic_write(out, data)
        else:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
    note = res.notice()
    err_console.print(f"{res.table.num_rows:,} rows in {res.elapsed_s * 1000:.0f} ms" + (f" — [bold yellow]{note}[/]" if note else ""))


# -- quick views ------------------------------------------------------------------------------------
# the sessions view (agentobs/model/views.sql): H = ΣC/ΣP over the calls whose C is known (METRICS.md §2), for the
# session and for its main branch and its sub-agent branches apart; retries as call_reuse counts them
SESSIONS_SQL = """
SELECT s.session_id, s.calls, round(s.hit_rate, 3) AS hit_rate,
       s.main_calls, round(s.main_hit_rate, 3) AS main_hit_rate,
       s.branch_calls, round(s.branch_hit_rate, 3) AS branch_hit_rate,
       s.branches - (s.main_calls > 0)::INTEGER AS sub_branches,
       s.retries, strftime(s.first_start_ts, '%Y-%m-%d %H:%M:%S') AS first_start, s.task_type, s.instances,
       s.prompt_tokens, s.cached_tokens, s.calls_cached_unknown, s.output_tokens, s.errors,
       round(s.span_s, 1) AS span_s
FROM sessions s
ORDER BY s.first_start_ts DESC, s.session_id
LIMIT ?
"""

# the session's calls (llm_calls) beside their per-call reuse columns (call_reuse, as the metric run prepares it:
# m_calls, with the settings' default block size): hit class, re-prefill X and miss cause (METRICS.md §1), and the
# idle gap since prev(c) — the previous call of its branch, or for a branch's first call the fork point
CALLS_SQL = """
SELECT c.call_id, strftime(c.start_ts, '%H:%M:%S.%g') AS start, c.branch, c.attempt, c.instance,
       c.prompt_tokens, c.cached_tokens, r.hit_class, r.reprefill_tokens, r.miss_cause,
       round(r.gap_before_s, 3) AS gap_before_s, round(c.ttft_s, 3) AS ttft_s, round(c.e2e_s, 3) AS e2e_s,
       c.output_tokens, c.status, r.is_retry, c.model, c.source
FROM llm_calls c
LEFT JOIN m_calls r ON r.call_id = c.call_id AND r.trace_id = c.trace_id
WHERE c.session_id = $sid
ORDER BY c.start_s, c.call_id
"""


@cli.command("sessions")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@common
def sessions_cmd(ctx: Ctx, limit, fmt):
    """Sessions, newest first: calls, hit rate H = ΣC/ΣP over the calls whose cached tokens are known, the main
    branch and the sub-agent branches apart, retries, tokens."""
    con = _open(ctx, read_only=True)
    table = con.sql(SESSIONS_SQL, params=[limit]).to_arrow_table()
    _emit(table, fmt, f"sessions (newest {limit})")


@cli.command("calls")
@click.option("--session", "session_id", required=True, help="Session id.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@common
def calls_cmd(ctx: Ctx, session_id, fmt):
    """The model calls of one session, in order: hit class, re-prefill tokens and miss cause of each (METRICS.md
    §1), the idle gap before it, retries (attempt > 1, or the same prompt re-sent after an error)."""
    from ..metrics import prepare
    from ..source import as_source

    _open(ctx, read_only=True).close()  # one clear line if the store is missing
    run, close = prepare(as_source(ctx.db), settings=ctx.settings)
    try:
        table = run.cur.sql(CALLS_SQL, params={"sid": session_id}).to_arrow_table()
        similar = None if table.num_rows else run.cur.execute(
            "SELECT session_id FROM sessions ORDER BY jaro_winkler_similarity(session_id, ?) DESC LIMIT 1", [session_id]
        ).fetchone()
    finally:
        close()
    if table.num_rows == 0:
        hint = f" (did you mean {similar[0]!r}?)" if similar else ""
        raise AgentobsError(f"no calls for session {session_id!r}{hint}")
    _emit(table, fmt, f"session {session_id}")



@cli.command("settings")
@common
def settings_cmd(ctx: Ctx):
    """Show every setting with its default and meaning (the same table as docs/settings.md)."""
    console.print(f"settings source: {ctx.settings.source}")
    console.print(settings_markdown(), markup=False, highlight=False)
