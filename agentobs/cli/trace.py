"""`agentobs` commands: trace (one trace's span tree)."""

from __future__ import annotations

import json
import sys

import click

from .base import Ctx, _emit, _open, cli, common, console


@cli.command("trace")
@click.argument("ident", metavar="ID")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
              help="json: the tree with every span's attributes, events and engine phases; csv: one row per span.")
@common
def trace_cmd(ctx: Ctx, ident, fmt):
    """The span tree of trace ID (or of the trace holding span ID, e.g. a call_id): agent → chat → engine request
    with its queue / prefill / decode, tool spans; each span's offset from the trace's start and its duration."""
    import pyarrow as pa

    from ..model.trace import duckdb_query, load

    con = _open(ctx, read_only=True)
    try:
        tr = load(duckdb_query(con), ident)
    finally:
        con.close()
    if fmt == "json":
        sys.stdout.write(json.dumps(tr.to_dict(), indent=1, default=str) + "\n")
        return
    rows = tr.rows()
    if fmt == "csv":
        _emit(pa.Table.from_pylist(rows), "csv", None)
        return
    sessions = tr.session_ids()
    console.print(f"trace {tr.trace_id}: {len(tr.nodes)} span(s), {tr.duration_s:,.3f} s"
                  + (f", session {', '.join(sessions)}" if sessions else "")
                  + (" (first spans only)" if tr.truncated else ""), highlight=False, markup=False)
    table = pa.table({"offset_s": [r["offset_s"] for r in rows], "duration_s": [r["duration_s"] for r in rows],
                      "span": [r["tree"] for r in rows], "role": [r["role"] for r in rows],
                      "detail": [r["detail"] for r in rows]})
    _emit(table, "table", None)
