"""`agentobs` commands: clickhouse."""

from __future__ import annotations

import click

from .base import Ctx, _emit, _filters, cli, common, err_console


# --- clickhouse (agentobs/backends/clickhouse, docs/clickhouse.md) ---------------------------------
@cli.group("clickhouse")
def clickhouse_grp():
    """The model and metrics on ClickHouse, over what the OTel Collector's ClickHouse exporter writes."""


def _ch_url(f):
    return click.option("--clickhouse-url", "url", default=None,
                        help="chdb:///DIR (in-process chDB) or http(s)://user:pass@host:8123/db (a server); "
                             "default: setting clickhouse_url ($AGENTOBS_CLICKHOUSE_URL, chdb:///agentobs.chdb).")(f)


def _connect(ctx: Ctx, url):
    """The ClickHouse connection of a read command, with the settings' alias lists written to agentobs_aliases
    when they differ (the spans view reads them at ingest: a changed ``session_keys`` needs no new ``init``).
    A connection that may not write gets a warning naming the lists that differ instead."""
    from ..backends.clickhouse import model
    from ..backends.clickhouse.conn import ClickHouse

    ch = ClickHouse(url or ctx.settings.clickhouse_url)
    note = model.sync_aliases_note(ch, ctx.settings)
    if note:
        err_console.print(note, highlight=False)
    return ch


@clickhouse_grp.command("init")
@_ch_url
@common
def ch_init_cmd(ctx: Ctx, url):
    """Create the exporter's tables if missing, the resolving materialized views and the model views."""
    from ..backends.clickhouse import model
    from ..backends.clickhouse.conn import ClickHouse

    ch = ClickHouse(url or ctx.settings.clickhouse_url)
    try:
        model.create_tables(ch, ctx.settings)
        model.create_views(ch, ctx.settings)
        n = ch.arrow("SELECT count() AS n FROM spans").column(0)[0].as_py()
    finally:
        ch.close()
    err_console.print(f"ClickHouse model ready at {ch} ({n:,} spans resolved)", highlight=False)


@clickhouse_grp.command("load")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--instance", default=None, help="Engine host:port for Prometheus text files.")
@click.option("--at", default=None, help="Scrape time of Prometheus text files (ISO-8601 or epoch s; default: file mtime).")
@_ch_url
@common
def ch_load_cmd(ctx: Ctx, paths, instance, at, url):
    """Write OTLP JSON/protobuf files and Prometheus text into the exporter's tables, as the collector would."""
    from pathlib import Path

    from ..backends.clickhouse import load, model
    from ..backends.clickhouse.conn import ClickHouse
    from ..collect.files import decode_otlp_file, parse_at, snapshot_time

    ch = ClickHouse(url or ctx.settings.clickhouse_url)
    try:
        model.create_tables(ch, ctx.settings)
        model.create_views(ch, ctx.settings)
        for p in map(Path, paths):
            if p.suffix in (".txt", ".prom"):
                if not instance:
                    raise click.UsageError(f"{p}: Prometheus text needs --instance HOST:PORT")
                for table, rows in load.metrics_rows(p.read_text(), instance, snapshot_time(p, parse_at(at))).items():
                    ch.insert_arrow(table, rows)
                err_console.print(f"{p}: metrics")
            else:
                decoded, warnings = decode_otlp_file(p, ctx.settings)
                rows = load.traces_rows(decoded.table())
                if rows.num_rows:
                    ch.insert_arrow("otel_traces", rows)
                err_console.print(f"{p}: {rows.num_rows:,} spans")
    finally:
        ch.close()


@clickhouse_grp.command("metrics")
@click.argument("name")
@click.option("--since", default=None, help="Window start: ISO-8601, epoch seconds, or a span before now (24h, 7d).")
@click.option("--until", default=None, help="Window end (exclusive), same forms as --since.")
@click.option("--by", "by", default=None, help="Grouping the metric supports (see agentobs metrics).")
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE", help="Only calls with KEY=VALUE; repeatable.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@_ch_url
@common
def ch_metrics_cmd(ctx: Ctx, name, since, until, by, filters, fmt, url):
    """One agent metric computed on ClickHouse (the same SQL as `agentobs metrics`, transpiled)."""
    from ..metrics import compute
    from ..source import ClickHouseSource

    flt = _filters(filters)
    ch = _connect(ctx, url)
    try:
        df = compute(name, ClickHouseSource(ch=ch), since=since, until=until, by=by, filters=flt or None,
                     settings=ctx.settings)
    finally:
        ch.close()
    _emit(df.to_arrow(), fmt, f"{name} (ClickHouse)" + (f" by {by}" if by else ""))


@clickhouse_grp.command("sql")
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@click.option("--max-rows", type=int, default=None, help="Row cap (default: setting sql_row_cap).")
@_ch_url
@common
def ch_sql_cmd(ctx: Ctx, query, fmt, max_rows, url):
    """One read-only SELECT (ClickHouse SQL) over the model views (llm_calls, sessions, call_reuse, ...)."""
    from ..backends.clickhouse.sql import run_select

    ch = _connect(ctx, url)
    try:
        table = run_select(ch, query, row_cap=max_rows or ctx.settings.sql_row_cap,
                           timeout_s=ctx.settings.sql_timeout_s)
    finally:
        ch.close()
    _emit(table, fmt, "ClickHouse")
# --- end clickhouse --------------------------------------------------------------------------------
