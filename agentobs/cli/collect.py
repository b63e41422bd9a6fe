"""`agentobs` commands: collect."""

from __future__ import annotations

import click

from .base import DB_HELP, Ctx, _open, _writer, cli, common, err_console
from .ingest import import_


# --- collectors ------------------------------------------------------------------------------------
@cli.command("collect")
@click.option("--fleet", "fleet_path", type=click.Path(exists=True, dir_okay=False),
              help="Fleet file (YAML): receivers, scrape targets, KV-event publishers (see collectors/fleet.yaml).")
@click.option("--config", "old_fleet_path", type=click.Path(exists=True, dir_okay=False),
              help="Deprecated alias of --fleet (for one release; then --config is the settings file, as on every "
                   "other command).")
@click.option("--db", "db", default=None, help=DB_HELP)
@click.option("--settings", "settings_path", envvar="AGENTOBS_CONFIG", default=None, help="Settings file (TOML).")
@click.option("--debug", is_flag=True, default=False, help="Show tracebacks.")
@click.pass_context
def collect_cmd(click_ctx, fleet_path, old_fleet_path, db, settings_path, debug):
    """Run the collectors until SIGTERM/SIGINT: OTLP gRPC+HTTP receivers, the fleet scraper, KV-event
    subscribers, the health /metrics endpoint and the read snapshot readers use (--db of readers)."""
    from .. import model
    from ..collect.fleet import load_fleet
    from ..collect.service import Service, run_forever

    if old_fleet_path is not None:
        if fleet_path is not None:
            raise click.UsageError("give the fleet file once: --fleet FLEET.yaml (--config is its deprecated alias)")
        fleet_path = old_fleet_path
        err_console.print("warning: `agentobs collect --config FLEET.yaml` is deprecated; use --fleet FLEET.yaml "
                          "(--config will be the settings file, as on every other command)", highlight=False)
    if fleet_path is None:
        raise click.UsageError("Missing option '--fleet' (the fleet file, e.g. collectors/fleet.yaml).")
    parent = click_ctx.find_object(Ctx)
    ctx = Ctx(db or (parent._db if parent else None), settings_path or (parent.config if parent else None), debug)
    fleet = load_fleet(fleet_path, ctx.settings)
    from ..model.state import refresh

    settings = ctx.settings

    def upkeep(con):
        """A read snapshot's upkeep: the model's views and KV-event index, then its session model."""
        out = model.upkeep(con)
        try:
            refresh(con, settings)
        except Exception as e:  # noqa: BLE001 - publish anyway: readers derive the session model without it
            err_console.print(f"session model not refreshed in the snapshot ({type(e).__name__}: {e})",
                              highlight=False)
        return out

    # the session model (agentobs.model.state) is brought up to date on the store before each read snapshot and in
    # the snapshot's copy: collect imports nothing of the model, the CLI wires it
    # (and once more at stop, within collect_stop_refresh_s)
    svc = Service(fleet, settings, ctx.db, views=model.ensure, upkeep=upkeep,
                  derive=lambda con, budget_s=None: refresh(con, settings, budget_s=budget_s))
    where = ", ".join(x for x in (f"otlp grpc {fleet.grpc}" if fleet.grpc else "", f"otlp http {fleet.http}"
                                  if fleet.http else "", f"health {fleet.health}" if fleet.health else "") if x)
    err_console.print(f"agentobs collect: {len(fleet.targets)} scrape target(s), {len(fleet.kv)} KV-event "
                      f"source(s); {where}; store {ctx.db}", highlight=False)
    if err_console.is_terminal:
        from rich.live import Live

        with Live("starting…", console=err_console, refresh_per_second=2, transient=False) as live:
            run_forever(svc, status=live.update)
    else:
        run_forever(svc, status=None)
    err_console.print(f"stopped: {svc.status_line()}; read snapshot {svc.snapshot_path}", highlight=False)


@import_.command("prometheus")
@click.option("--url", required=True, help="Prometheus base URL, e.g. http://prometheus:9090")
@click.option("--since", default="7d", show_default=True, help="How far back (15m, 6h, 7d, 2w).")
@click.option("--step", default="15s", show_default=True, help="Resolution of query_range.")
@click.option("--end", default=None, help="End time (epoch seconds or ISO-8601); default now.")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Per-request timeout, seconds.")
@common
def import_prometheus_cmd(ctx: Ctx, url, since, step, end, timeout):
    """Backfill engine metrics (vllm:/sglang: families) from a Prometheus server's HTTP API; the
    Prometheus `instance` label becomes the instance."""
    import time as _time

    from ..collect.backfill import backfill, engine_metric_names, parse_duration
    from ..collect.files import parse_at

    since_s = parse_duration(since, "--since")
    step_s = parse_duration(step, "--step")
    end_at = parse_at(end)
    end_s = end_at if end_at is not None else _time.time()
    names = engine_metric_names(url.rstrip("/"), timeout=timeout)
    con = _open(ctx)
    with _writer(con, ctx) as w:
        res = backfill(url, since_s, step_s, w, end=end_s, timeout=timeout, names=names)
    err_console.print(f"prometheus: {res.names} engine metric names, {res.series:,} series, {res.samples:,} samples "
                      f"({res.inserted:,} new), {len(res.errors)} failed queries", highlight=False)
    for e in res.errors[:20]:
        err_console.print(f"  [red]error[/red] {e}", highlight=False)
    if res.samples == 0 and res.errors:
        raise SystemExit(1)
# --- end collectors --------------------------------------------------------------------------------
