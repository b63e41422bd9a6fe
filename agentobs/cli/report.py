"""`agentobs` commands: report."""

from __future__ import annotations

import click

from .base import Ctx, _source, backend_opts, cli, common, err_console


# --- report ----------------------------------------------------------------------------------------
@cli.command("report")
@click.option("--week", default=None, help="ISO week, e.g. 2026-W48 (Monday 00:00 UTC to the next Monday).")
@click.option("--since", default=None, help="Start (ISO-8601, epoch seconds or a span before now such as 7d).")
@click.option("--until", default=None, help="End, exclusive (default: now).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Report directory (replaced atomically): report.html, summary.md, manifest.json, tables/.")
@click.option("--require-data", is_flag=True, default=False,
              help="Exit 4 when the period has no model calls (the report saying so is still written).")
@backend_opts
@common
def report_cmd(ctx: Ctx, week, since, until, out, require_data, backend, clickhouse_url):
    """Weekly cost-attribution report (default: the last full ISO week): self-contained HTML, a Markdown
    summary, CSV + Parquet of every attribution table. Rerunnable for any past week."""
    from ..report import build, resolve, write

    period = resolve(week, since, until)
    with _source(ctx, backend, clickhouse_url) as src:
        src.check()  # one clear line if the store is missing
        rep = build(src, period, ctx.settings)
    path = write(rep, out)
    if rep.has_data:
        err_console.print(f"report {period.label}: {rep.calls:,} calls → {path}/report.html, summary.md, "
                          f"{len(rep.tables())} tables", highlight=False)
    else:
        err_console.print(f"report {period.label}: no model calls in {period.describe()} — wrote a report that says "
                          f"so to {path}", highlight=False)
        if require_data:
            raise SystemExit(4)


@cli.command("exporter")
@click.option("--host", default=None, help="Listen address (default from setting exporter_listen: 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default from exporter_listen: 9465; 0 picks a free one).")
@click.option("--window", "window_s", type=float, default=None, help="Seconds of calls covered (setting exporter_window_s).")
@click.option("--refresh", "refresh_s", type=float, default=None, help="Seconds between snapshots (exporter_refresh_s).")
@backend_opts
@common
def exporter_cmd(ctx: Ctx, host, port, window_s, refresh_s, backend, clickhouse_url):
    """Serve the derived agent metrics (reuse hit rate, re-prefill share, recompute tax and idle rent $/h by
    instance/model/task type) on a Prometheus /metrics endpoint until SIGTERM/SIGINT."""
    import signal
    import threading

    from ..exporter import serve

    lhost, _, lport = str(ctx.settings.exporter_listen).rpartition(":")
    host = host or lhost or "127.0.0.1"
    port = port if port is not None else int(lport or 9465)
    with _source(ctx, backend, clickhouse_url) as src:
        src.check()
        server, collector = serve(src, host, port, ctx.settings, refresh_s=refresh_s, window_s=window_s)
        err_console.print(f"agentobs exporter on http://{host}:{server.server_port}/metrics — {src.where()}, "
                          f"window {collector.window_s:g} s, refresh every {collector.refresh_s:g} s", highlight=False)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        server.shutdown()
        collector.stop()
# --- end report ------------------------------------------------------------------------------------
