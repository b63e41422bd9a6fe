"""`agentobs` commands: metrics."""

from __future__ import annotations

import click

from .base import Ctx, _emit, _filters, _source, backend_opts, cli, common


# --- metrics ---------------------------------------------------------------------------------------
@cli.command("metrics")
@click.argument("name", required=False)
@click.option("--since", default=None, help="Window start: ISO-8601, epoch seconds, or a span before now (24h, 7d).")
@click.option("--until", default=None, help="Window end (exclusive), same forms as --since.")
@click.option("--by", "by", default=None,
              help="Grouping: session|task|instance|model|cause|task_type|session_length (what the metric supports).")
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE",
              help="Only calls with KEY=VALUE (instance, model, engine, task_type, tenant, agent_name, session, task, "
                   "branch); repeatable.")
@click.option("--exact", is_flag=True,
              help="Exact percentiles: never read them from the hourly sketches (which state their error bound, "
                   "e.g. ttft_p99_rel_err, shown as ±1%), at the cost of reading every call.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@backend_opts
@common
def metrics_cmd(ctx: Ctx, name, since, until, by, filters, exact, fmt, backend, clickhouse_url):
    """Agent metrics (METRICS.md). Without NAME: the catalogue with one-line definitions."""
    from ..metrics import catalogue_table, compute

    if not name:
        _emit(catalogue_table(), fmt, "metrics (agentobs metrics NAME --by ...; formulas in docs/metrics.md)")
        return
    flt = _filters(filters)
    with _source(ctx, backend, clickhouse_url) as src:
        df = compute(name, db=src, since=since, until=until, by=by, filters=flt or None, settings=ctx.settings,
                     exact=exact)
        where = src.where()
    _emit(df.to_arrow(), fmt, f"{name}" + (f" by {by}" if by else "") + f" — {where}")
# --- end metrics -----------------------------------------------------------------------------------
