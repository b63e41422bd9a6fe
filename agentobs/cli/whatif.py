"""`agentobs` commands: whatif (replay the observed window through the simulator with a config change)."""

from __future__ import annotations

import json
import sys

import click

from .base import Ctx, _emit, _filters, _source, backend_opts, cli, common, console, err_console


@cli.command("whatif")
@click.option("--since", default=None, help="Window start: ISO-8601, epoch seconds, or a span before now (24h, 7d). "
              "Default: findings_default_window_s (7 days) before --until or the newest call.")
@click.option("--until", default=None, help="Window end (exclusive), same forms as --since.")
@click.option("--change", "changes", multiple=True, required=True, metavar="KEY=VALUE[@INSTANCE]",
              help="The change to replay; repeatable (applied together): prefix_cache=on|off, hicache=on|off, "
                   "hicache_ratio=R, offload_gib=N, kv_capacity=×2 (x2, 2x, or tokens), router=POLICY "
                   "(round_robin, least_loaded, cache_aware, session_affinity), schedule_policy=fcfs|lpm. "
                   "@INSTANCE: only that instance (default: every instance it applies to).")
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE",
              help="Only calls with KEY=VALUE (as `agentobs findings --filter`); repeatable.")
@click.option("--sessions", type=int, default=None,
              help="Most sessions replayed (a contiguous slice of the window; default: findings_sim_sessions).")
@click.option("--seed", type=int, default=None, help="Which slice (default: findings_sim_seed).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
              help="json: the whole result (before/after per scope, calibration, notes); csv: the before/after rows.")
@backend_opts
@common
def whatif_cmd(ctx: Ctx, since, until, changes, filters, sessions, seed, fmt, backend, clickhouse_url):
    """Replay the observed sessions through the simulator as configured and with --change: computed prefill tokens,
    $ and turn-resume TTFT before/after, with the simulator's calibration error on the unchanged replay (observed vs
    simulated, the same sessions). The findings' recoverable tax is simulated on this same replay (docs/whatif.md)."""
    from ..findings.whatif import run

    with _source(ctx, backend, clickhouse_url) as src:
        w = run(src, list(changes), since=since, until=until, filters=_filters(filters) or None,
                settings=ctx.settings, sessions=sessions, seed=seed)
    if fmt == "json":
        sys.stdout.write(json.dumps(w.to_dict(), indent=1) + "\n")
        return
    if fmt == "csv":
        _emit(w.table(), "csv", None)
        return
    for line in w.headline():
        console.print(line, highlight=False, markup=False)
    _emit(w.table(), "table", f"before → after ({w.label}; tokens and $ scaled to a "
                              f"{'week' if w.period == 'week' else 'window'} as the findings' tax)")
    _emit(w.calibration_table(), "table", "calibration: the unchanged replay vs what was observed of the same "
                                          "sessions (error = simulated ÷ observed − 1)")
    err_console.print(f"replayed {w.sessions_replayed} of {w.sessions_total} sessions in {w.computed_s:.1f} s",
                      highlight=False)
