"""`agentobs` commands: sim."""

from __future__ import annotations

from pathlib import Path

import click

from ..config import Settings
from ..errors import AgentobsError
from .base import Ctx, _emit, _open, _progress, _summary, _writer, cli, common, console, err_console
from .console import console_cmd
from .ingest import _kv_index, _model_state, import_


# --- simulator -------------------------------------------------------------------------------------
def sample_dir() -> Path:
    """sample_data/ of a checkout, else the copy shipped inside the package."""
    pkg = Path(__file__).resolve().parent.parent  # agentobs/
    for cand in (pkg.parent / "sample_data", pkg / "_sample_data"):
        if cand.exists():
            return cand
    raise AgentobsError("sample_data/ not found (neither in the checkout nor in the installed package)")


def _bundle_import(ctx: Ctx, root, rebase_to: float | str | None = None) -> None:
    import datetime as dt

    from ..collect.bundle import import_bundle

    con = _open(ctx)
    with _writer(con, ctx) as w:
        p, adv = _progress(sum(f.stat().st_size for f in Path(root).rglob("*") if f.is_file()), "bundle")
        with p:
            res = import_bundle(root, w, ctx.settings, progress=adv, rebase_to=rebase_to)
    _kv_index(con)
    _model_state(con, ctx)
    con.close()
    for what, r in res.items():
        _summary(r, what)
    if res.newest is not None:
        at = dt.datetime.fromtimestamp(res.newest, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        err_console.print(f"re-based by {res.offset_s:+,} s: the newest record is at {at}", highlight=False)


def _rebase_arg(value: str | None) -> float | str | None:
    """--rebase-to: now, epoch seconds or an ISO-8601 time (UTC if no zone)."""
    from ..collect.files import parse_at

    if value is None or value == "now":
        return value
    try:
        return parse_at(value)
    except AgentobsError:
        raise click.BadParameter(f"{value!r} is neither now, epoch seconds nor an ISO-8601 time",
                                 param_hint="--rebase-to") from None


@import_.command("bundle")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--rebase-to", "rebase_to", default=None, metavar="now|EPOCH|ISO",
              help="Move every timestamp (spans, samples, config, KV events) by one whole-second offset so the "
                   "newest lands at this time (now: the wall clock at import). The files are not changed.")
@common
def import_bundle_cmd(ctx: Ctx, path, rebase_to):
    """A simulator output directory (manifest.json): spans, Prometheus snapshots, server info, KV events."""
    _bundle_import(ctx, path, _rebase_arg(rebase_to))


@cli.command("simulate")
@click.option("--scenario", default=None,
              help="Named fleet + workload (sample, quick, bench, claude-code, mooncake). [default: quick]")
@click.option("--trace", "traces", multiple=True, type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Replay a kv-cache-tester JSON trace (one session per file; repeatable) instead of a scenario.")
@click.option("--replicas", type=click.IntRange(1, 256), default=None,
              help="With --trace: identical engine replicas.  [default: 2]")
@click.option("--engine", type=click.Choice(["vllm", "sglang"]), default=None,
              help="With --trace: the replicas' engine.  [default: vllm]")
@click.option("--kv-capacity-tokens", type=click.IntRange(1), default=None,
              help="With --trace: GPU KV pool per replica, tokens.  [default: the preset's, 300,000]")
@click.option("--block-size", type=click.Choice(["1", "2", "4", "8", "16", "32", "64"]), default=None,
              help="With --trace: KV block (page) size in tokens; divides the traces' 64.  [default: 16]")
@click.option("--max-model-len", type=click.IntRange(1), default=None,
              help="With --trace: longest prompt accepted (vLLM --max-model-len).  [default: the KV pool]")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write the bundle here (telemetry + ground truth).")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--router", type=click.Choice(["round_robin", "least_loaded", "cache_aware", "session_affinity"]), default=None,
              help="Override the scenario's router policy.")
@click.option("--duration", type=float, default=None, help="Seconds of simulated arrivals (synthetic workloads).")
@click.option("--sessions-per-min", type=float, default=None, help="Session arrival rate (synthetic workloads).")
@click.option("--scrape-every", type=int, default=1, show_default=True, help="Keep one Prometheus snapshot in N (5 s each).")
@click.option("--gzip-prom", is_flag=True, default=False, help="Gzip the Prometheus snapshots.")
@click.option("--no-kv-events", is_flag=True, default=False, help="Do not write KV-event captures.")
@click.option("--block-hashes", is_flag=True, default=False, help="Put agentobs.prompt.block_hashes on gateway spans.")
@click.option("--restart", "restarts", multiple=True, metavar="INSTANCE@SECONDS",
              help="Restart that replica's engine at that simulated second (repeatable): its cache emptied, its "
                   "counters back to 0, the calls in flight failed.")
@click.option("--process-metrics", is_flag=True, default=False,
              help="vLLM replicas expose process_start_time_seconds (one API server), which dates a restart.")
@click.option("--import", "do_import", is_flag=True, default=False, help="Also import the bundle into --db.")
@click.option("--compare", is_flag=True, default=False,
              help="What-if: the 20-turn tool-calling trace under radix/prefix cache, HiCache and routing configs.")
@common
def simulate_cmd(ctx: Ctx, scenario, traces, replicas, engine, kv_capacity_tokens, block_size, max_model_len, out,
                 seed, router, duration, sessions_per_min, scrape_every, gzip_prom, no_kv_events, block_hashes,
                 restarts, process_metrics, do_import, compare):
    """Simulate an engine fleet serving agent sessions; emit real telemetry formats plus ground truth."""
    from dataclasses import replace

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from ..sim.run import compare as run_compare
    from ..sim.run import compare_table, parse_restart, simulate
    from ..sim.scenarios import scenario as get_scenario
    from ..sim.scenarios import whatif_configs

    prog = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=err_console, transient=True, disable=not err_console.is_terminal)
    trace_opts = {"--replicas": replicas, "--engine": engine, "--kv-capacity-tokens": kv_capacity_tokens,
                  "--block-size": block_size, "--max-model-len": max_model_len}
    if traces:
        clash = [o for o, v in (("--scenario", scenario), ("--compare", compare), ("--duration", duration),
                                ("--sessions-per-min", sessions_per_min)) if v]
        if clash:
            raise click.UsageError(f"--trace replays the given files; it does not combine with {', '.join(clash)}")
        bs = int(block_size or 16)
        if kv_capacity_tokens is not None and kv_capacity_tokens < bs:
            raise click.BadParameter(f"{kv_capacity_tokens} is less than one block ({bs} tokens)",
                                     param_hint="--kv-capacity-tokens")
    else:
        given = [o for o, v in trace_opts.items() if v is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} only apply with --trace FILE")
    if compare and (restarts or process_metrics):
        raise click.UsageError("--compare runs its own configs; it does not combine with --restart / --process-metrics")
    if compare:
        configs = whatif_configs()
        with prog:
            task = prog.add_task("what-if", total=None)
            sums = run_compare(seed, configs, progress=lambda n: prog.advance(task, n))
        _emit(compare_table(sums), "table", "what-if: 20-turn tool-calling sessions, gaps 5–30 s, 3 replicas")
        return
    if traces:
        from ..sim.scenarios import trace_scenario

        sc = trace_scenario(traces, replicas=replicas or 2, engine=engine or "vllm",
                            kv_capacity_tokens=kv_capacity_tokens, block_size=int(block_size or 16),
                            max_model_len=max_model_len)
    else:
        sc = get_scenario(scenario or "quick")
    if router:
        sc = replace(sc, router=router)
    if duration:
        sc = replace(sc, duration_s=duration)
    if sessions_per_min:
        sc = replace(sc, sessions_per_min=sessions_per_min)
    if do_import and not out:
        raise click.UsageError("--import needs --out DIR")
    restart_at = [parse_restart(r) for r in restarts]
    import time

    t = time.perf_counter()
    with prog:
        task = prog.add_task(f"simulate {sc.name}", total=None)
        fleet = simulate(sc, seed, out, progress=lambda n: prog.advance(task, n), prom_every=scrape_every,
                         gzip_prom=gzip_prom, kv_events=not no_kv_events, block_hashes=block_hashes,
                         restarts=restart_at, process_metrics=process_metrics)
    wall = time.perf_counter() - t
    err_console.print(f"simulated {fleet.calls_done:,} calls of {fleet.sessions_done:,} sessions, "
                      f"{fleet.now / 3600:.2f} h on {len(fleet.instances)} replicas in {wall:.1f} s"
                      + (f" → {out}" if out else ""))
    if fleet.refused:
        err_console.print(f"{fleet.refused:,} calls refused (HTTP 400): prompt longer than the replica accepts "
                          "(KV pool or --max-model-len); they are error calls in the bundle")
    if do_import:
        _bundle_import(ctx, out)


# hit_rate: H = ΣC / ΣP over the calls whose cached tokens are known (METRICS.md §2; a call of unknown C is in
# neither sum)
HEADLINE_SQL = """
SELECT count(*) AS calls, count(DISTINCT session_id) AS sessions, count(DISTINCT instance) AS instances,
       round(sum(cached_tokens) / nullif(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0), 3)
           AS hit_rate,
       round(median(ttft_s), 3) AS ttft_p50_s, round(quantile_cont(ttft_s, 0.99), 3) AS ttft_p99_s
FROM llm_calls
"""


def _print_answer(con_or_db, settings: Settings, db: str | None = None) -> None:
    """The answer the demo is for, from the tax ledger (the same lines `agentobs findings` opens with): the fleet's
    recompute tax per week with its scaling, what findings own of it, and the top fixes with their sessions."""
    from ..findings import build
    from ..findings.render import headline
    from ..source import as_source

    try:
        ledger = build(as_source(con_or_db), settings=settings)
    except AgentobsError as e:
        err_console.print(f"[yellow]findings unavailable:[/yellow] {e}")
        return
    db = db or str(con_or_db)
    console.print()
    for line in headline(ledger):
        console.print(line, highlight=False, markup=False, no_wrap=True, overflow="ellipsis", crop=True)
    if not ledger.findings:
        console.print("No finding: no default config is making sessions pay a recompute tax.", highlight=False)
    console.print(f"  every finding, its evidence and fix: agentobs findings --db {db} --format markdown\n",
                  highlight=False, markup=False, soft_wrap=True)


def _fresh_demo_store(db: str, bundle: Path) -> None:
    """The demo re-bases the sample to the import's time, so it needs a store without the sample at another time.
    A store that holds only the sample bundle's files (an earlier demo) is removed; one with other data is
    refused rather than mixed."""
    import duckdb

    p = Path(db)
    if not p.exists():
        return
    try:
        con = duckdb.connect(db, read_only=True)
    except duckdb.Error as e:
        raise AgentobsError(f"cannot open {db!r} to rebuild the demo store: {e}") from e
    try:
        data = sum((con.execute(f"SELECT count(*) FROM {t}").fetchone() or (0,))[0]
                   for t in ("spans", "metric_samples", "kv_events", "engine_config", "scrapes"))
        sources = [x for (s,) in con.execute("SELECT source FROM ingest_log").fetchall() for x in s.split(",")]
    except duckdb.Error:
        data, sources = 1, []  # not an agentobs store
    finally:
        con.close()
    if not data:
        return
    home = bundle.resolve()

    def sample(src: str) -> bool:  # this bundle, or the sample of another checkout or install
        return home in Path(src).resolve().parents or "sample_data/fleet/" in src.replace("\\", "/")

    if not (sources and all(map(sample, sources))):
        raise AgentobsError(f"{db} holds other data; `agentobs demo` re-bases the sample to now and builds its own "
                            "store: pass --db demo.duckdb (or remove the file)")
    err_console.print(f"rebuilding the demo store {db}", highlight=False)
    for f in (p, Path(db + ".wal")):
        f.unlink(missing_ok=True)


@cli.command("demo")
@click.option("--no-console", is_flag=True, default=False, help="Build the store and print the headline metrics only.")
@click.option("--live", is_flag=True, default=False,
              help="Serve simulated engines (/metrics, /server_info) and export OTLP to a running `agentobs collect`.")
@click.option("--otlp", default="http://127.0.0.1:4318", show_default=True, help="OTLP/HTTP endpoint for --live.")
@click.option("--speed", type=float, default=10.0, show_default=True, help="Simulated seconds per wall second (--live).")
@click.option("--port", type=int, default=8501, show_default=True, help="Console port.")
@common
def demo_cmd(ctx: Ctx, no_console, live, otlp, speed, port):
    """Build a store from sample_data/ (2 h of simulated fleet traffic) and open the console."""
    if live:
        from ..sim.live import run_live

        run_live(otlp_endpoint=otlp, speed=speed, seed=1, console=err_console)
        return
    root = sample_dir()
    bundle = root / "fleet"
    if (bundle / "manifest.json").exists():
        _fresh_demo_store(ctx.db, bundle)
        _bundle_import(ctx, bundle, rebase_to="now")  # the sample ends now: `--since 7d` finds it
    else:  # a checkout without the fleet bundle: the METRICS.md worked example only
        from ..collect.files import import_otlp

        con = _open(ctx)
        with _writer(con, ctx) as w:
            import_otlp([root / "fixtures" / "otlp"], w, ctx.settings)
        con.close()
    con = _open(ctx, read_only=True)
    _emit(con.sql(HEADLINE_SQL).to_arrow_table(), "table", "sample fleet")
    try:
        from ..metrics import compute
        from ..source import as_source

        reuse = compute("reuse", db=as_source(con), by="instance", settings=ctx.settings)
        keep = [c for c in ("instance", "sessions", "calls", "hit_rate", "reuse_hit_rate", "reprefill_tokens", "mode")
                if c in reuse.columns]
        _emit(reuse.select(keep).to_arrow(), "table", "session reuse by instance (agentobs metrics reuse --by instance)")
    except AgentobsError as e:  # the metrics layer reports its own problems; the store is still there
        err_console.print(f"[yellow]metrics unavailable:[/yellow] {e}")
    _print_answer(con, ctx.settings, ctx.db)
    con.close()
    err_console.print(f"store: {ctx.db} — try `agentobs metrics --db {ctx.db}` or `agentobs sql \"SELECT * FROM llm_calls\" --db {ctx.db}`")
    if not no_console:
        click_ctx = click.get_current_context()
        click_ctx.invoke(console_cmd, port=port, host="127.0.0.1", db=ctx.db, config=ctx.config, debug=ctx.debug,
                         backend="duckdb")  # the store demo just built, whatever the backend setting
# --- end simulator ---------------------------------------------------------------------------------
