"""The ``agentobs`` command line.

Every command takes ``--db PATH`` (default ``$AGENTOBS_DB`` or ./agentobs.duckdb) and ``--config``.
Errors print one line and exit non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from . import __version__
from .config import Settings, load_settings, settings_markdown
from .errors import AgentobsError

err_console = Console(stderr=True)
console = Console()


class Ctx:
    def __init__(self, db: str | None, config: str | None, debug: bool):
        self._db = db
        self.config = config
        self.debug = debug
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config)
        return self._settings

    @property
    def db(self) -> str:
        return self._db or self.settings.db


def common(f):
    """--db, --config and --debug on every command (also accepted before the command name)."""

    @click.option("--db", "db", envvar="AGENTOBS_DB", default=None, help="DuckDB file (default ./agentobs.duckdb).")
    @click.option("--config", "config", envvar="AGENTOBS_CONFIG", default=None, help="Settings file (TOML).")
    @click.option("--debug", is_flag=True, default=False, help="Show tracebacks.")
    @click.pass_context
    @functools.wraps(f)
    def wrapper(click_ctx, db, config, debug, *args, **kwargs):
        parent = click_ctx.find_object(Ctx)
        ctx = Ctx(db or (parent._db if parent else None), config or (parent.config if parent else None),
                  debug or (parent.debug if parent else False))
        click_ctx.obj = ctx
        return f(ctx, *args, **kwargs)

    return wrapper


# --- backend choice (agentobs/backends/source.py, docs/clickhouse.md) --------------------------------
def backend_opts(f):
    """--backend duckdb|clickhouse and --clickhouse-url (defaults: settings backend / clickhouse_url, also
    $AGENTOBS_BACKEND / $AGENTOBS_CLICKHOUSE_URL)."""
    f = click.option("--clickhouse-url", "clickhouse_url", default=None,
                     help="ClickHouse for --backend clickhouse: chdb:///DIR (in-process) or "
                          "http(s)://user:pass@host:8123/db (default: setting clickhouse_url).")(f)
    return click.option("--backend", "backend", type=click.Choice(["duckdb", "clickhouse"]), default=None,
                        help="Read the DuckDB store (--db) or ClickHouse (--clickhouse-url); default: setting "
                             "backend (duckdb).")(f)


def _source(ctx: Ctx, backend: str | None, clickhouse_url: str | None):
    """What the metrics API takes as ``db``: the store path, or an open ClickHouse connection (closed on exit)."""
    from .backends.source import open_source

    return open_source(ctx.settings, backend, clickhouse_url, ctx.db)


def _is_ch(src) -> bool:
    from .backends.source import is_clickhouse

    return is_clickhouse(src)
# --- end backend choice ----------------------------------------------------------------------------


def _filters(filters) -> dict[str, list[str]]:
    """Repeated ``--filter KEY=VALUE`` options as {key: [values]} (what the metrics and findings APIs take)."""
    flt: dict[str, list[str]] = {}
    for f in filters:
        key, sep, value = f.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--filter {f!r}: expected KEY=VALUE, e.g. --filter instance=10.0.0.1:8000")
        flt.setdefault(key.strip(), []).append(value)
    return flt


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--db", default=None, envvar="AGENTOBS_DB", help="DuckDB file (default ./agentobs.duckdb).")
@click.option("--config", default=None, envvar="AGENTOBS_CONFIG", help="Settings file (TOML).")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(__version__, prog_name="agentobs")
@click.pass_context
def cli(click_ctx, db, config, debug):
    """agentobs — per-session observability for LLM inference fleets serving agents."""
    click_ctx.obj = Ctx(db, config, debug)


def _open(ctx: Ctx, read_only: bool = False):
    from .store.db import connect

    return connect(ctx.db, read_only=read_only)


def _writer(con, ctx: Ctx):
    from .store.writer import Writer

    return Writer(con, batch_rows=ctx.settings.writer_batch_rows, flush_s=ctx.settings.writer_flush_s)


def _progress(total: int, label: str):
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    p = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                 console=err_console, transient=True, disable=not err_console.is_terminal)
    task = p.add_task(label, total=total)
    return p, (lambda n: p.advance(task, n))


def _summary(res, what: str) -> None:
    dup = f", {res.duplicates:,} already present" if res.duplicates else ""
    line = (f"{what}: {res.files} file(s), {res.accepted:,} accepted ({res.inserted:,} new{dup}), "
            f"{res.rejected:,} rejected")
    err_console.print(line)
    for e in res.errors[:20]:
        err_console.print(f"  [red]error[/red] {e}", highlight=False)
    if len(res.errors) > 20:
        err_console.print(f"  … {len(res.errors) - 20} more errors")
    for w in res.warnings[:10]:
        err_console.print(f"  [yellow]warning[/yellow] {w}", highlight=False)
    if len(res.warnings) > 10:
        err_console.print(f"  … {len(res.warnings) - 10} more warnings")


def _exit_for(res) -> None:
    if res.accepted == 0 and (res.rejected or res.errors):
        raise SystemExit(1)


# -- import ----------------------------------------------------------------------------------------
@cli.group(name="import")
def import_():
    """Import telemetry files into the store (idempotent: re-importing adds nothing)."""


@import_.command("otlp")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@common
def import_otlp_cmd(ctx: Ctx, paths):
    """OTLP traces: OTLP/JSON (one document or JSON lines, as the Collector file exporter writes)
    or protobuf (single or length-prefixed); .gz transparently; directories recursively."""
    from .collect.files import OTLP_SUFFIXES, expand, import_otlp

    files = expand(paths, OTLP_SUFFIXES)
    total = sum(f.stat().st_size for f in files)
    con = _open(ctx)
    with _writer(con, ctx) as w:
        p, adv = _progress(total, "otlp")
        with p:
            res = import_otlp(paths, w, ctx.settings, progress=adv)
    _summary(res, "spans")
    _exit_for(res)


@import_.command("prom")
@click.argument("path", type=click.Path(exists=True))
@click.option("--instance", required=True, help="Engine instance, host:port (as server.address:server.port on spans).")
@click.option("--at", default=None, help="Snapshot time (epoch seconds or ISO-8601); a directory's files are timed by their names.")
@common
def import_prom_cmd(ctx: Ctx, path, instance, at):
    """Prometheus text snapshots of an engine's /metrics (a file, or a directory of <epoch>.prom files)."""
    from .collect.files import expand, import_prom, parse_at

    files = expand([path], (".prom", ".txt", ".metrics"))
    con = _open(ctx)
    with _writer(con, ctx) as w:
        p, adv = _progress(sum(f.stat().st_size for f in files), "prom")
        with p:
            res = import_prom([path], instance, w, at=parse_at(at), progress=adv)
    _summary(res, "samples")
    _exit_for(res)


@import_.command("server-info")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--instance", required=True, help="Engine instance, host:port.")
@click.option("--at", default=None, help="Capture time (epoch seconds or ISO-8601); default: the file's mtime.")
@common
def import_server_info_cmd(ctx: Ctx, path, instance, at):
    """SGLang GET /server_info JSON (secrets redacted before storing)."""
    from .collect.files import import_server_info, parse_at

    con = _open(ctx)
    with _writer(con, ctx) as w:
        res = import_server_info(path, instance, w, at=parse_at(at))
    _summary(res, "config keys")


@import_.command("kv-events")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--instance", default=None, help="Instance for lines that do not name one.")
@common
def import_kv_cmd(ctx: Ctx, paths, instance):
    """KV-cache event captures (JSON lines of vLLM KVEventBatch payloads; see docs/cli.md)."""
    from .collect.files import import_kv_events

    con = _open(ctx)
    with _writer(con, ctx) as w:
        res = import_kv_events(paths, w, instance)
    _summary(res, "kv events")
    _kv_index(con)
    con.close()
    _exit_for(res)


def _kv_index(con) -> None:
    """Refresh the stored KV-event index after an import that wrote KV events (agentobs.model.kvindex)."""
    from .model.kvindex import refresh

    try:
        b = refresh(con)
    except Exception as e:  # noqa: BLE001 - the import itself is committed; runs derive the index inline
        err_console.print(f"[yellow]warning[/yellow] kv index not refreshed ({type(e).__name__}: {e}); metric runs "
                          "derive it from kv_events until `agentobs kv-index` succeeds", highlight=False)
        return
    if b.rebuilt:
        err_console.print(f"kv index: {b.sessions:,} sessions, {b.removals:,} removals of their blocks "
                          f"({b.seconds:.2f} s)")


@cli.command("kv-index")
@click.option("--force", is_flag=True, default=False, help="Rebuild even when the index is current.")
@common
def kv_index_cmd(ctx: Ctx, force):
    """Build or refresh the KV-event index metric runs read instead of re-deriving it (docs/metrics.md)."""
    from .model.kvindex import refresh

    _open(ctx, read_only=True).close()  # an existing store only: one clear line if it is missing, none created
    con = _open(ctx)
    b = refresh(con, force=force)
    con.close()
    state = "rebuilt" if b.rebuilt else "already current"
    click.echo(f"kv index {state}: {b.sessions:,} sessions, {b.removals:,} removals ({b.seconds:.2f} s)")


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
    from .output import atomic_write, render
    from .sql import run_query

    if fmt == "parquet" and not out:
        raise click.UsageError("--format parquet needs --out FILE")
    cap, limit = max_rows or ctx.settings.sql_row_cap, timeout or ctx.settings.sql_timeout_s
    with _source(ctx, backend, clickhouse_url) as src:
        if _is_ch(src):
            from .backends.clickhouse.sql import run_query as ch_run_query

            res = ch_run_query(src, query, row_cap=cap, timeout_s=limit)
        else:
            res = run_query(query, src, row_cap=cap, timeout_s=limit)
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
    from .metrics import prepare

    _open(ctx, read_only=True).close()  # one clear line if the store is missing
    run, close = prepare(ctx.db, settings=ctx.settings)
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


def _emit(table, fmt, title):
    from .output import render

    data = render(table, fmt, title=title, console=console, full=_full_hint())
    if data is not None:
        sys.stdout.buffer.write(data)


def _full_hint() -> str | None:
    """The other --format choices of the running command (where a shortened table's full values are), if any."""
    ctx = click.get_current_context(silent=True)
    for p in (ctx.command.params if ctx else ()):
        if p.name == "fmt" and isinstance(p.type, click.Choice):
            others = [c for c in p.type.choices if c not in ("table", "parquet")]
            return f"--format {'|'.join(others)}" if others else None
    return None


@cli.command("settings")
@common
def settings_cmd(ctx: Ctx):
    """Show every setting with its default and meaning (the same table as docs/settings.md)."""
    console.print(f"settings source: {ctx.settings.source}")
    console.print(settings_markdown(), markup=False, highlight=False)


# --- simulator -------------------------------------------------------------------------------------
def sample_dir() -> Path:
    """sample_data/ of a checkout, else the copy shipped inside the package."""
    here = Path(__file__).resolve().parent
    for cand in (here.parent / "sample_data", here / "_sample_data"):
        if cand.exists():
            return cand
    raise AgentobsError("sample_data/ not found (neither in the checkout nor in the installed package)")


def _bundle_import(ctx: Ctx, root, rebase_to: float | str | None = None) -> None:
    import datetime as dt

    from .sim.bundle import import_bundle

    con = _open(ctx)
    with _writer(con, ctx) as w:
        p, adv = _progress(sum(f.stat().st_size for f in Path(root).rglob("*") if f.is_file()), "bundle")
        with p:
            res = import_bundle(root, w, ctx.settings, progress=adv, rebase_to=rebase_to)
    _kv_index(con)
    con.close()
    for what, r in res.items():
        _summary(r, what)
    if res.newest is not None:
        at = dt.datetime.fromtimestamp(res.newest, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        err_console.print(f"re-based by {res.offset_s:+,} s: the newest record is at {at}", highlight=False)


def _rebase_arg(value: str | None) -> float | str | None:
    """--rebase-to: now, epoch seconds or an ISO-8601 time (UTC if no zone)."""
    from .collect.files import parse_at

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
@click.option("--import", "do_import", is_flag=True, default=False, help="Also import the bundle into --db.")
@click.option("--compare", is_flag=True, default=False,
              help="What-if: the 20-turn tool-calling trace under radix/prefix cache, HiCache and routing configs.")
@common
def simulate_cmd(ctx: Ctx, scenario, traces, replicas, engine, kv_capacity_tokens, block_size, max_model_len, out,
                 seed, router, duration, sessions_per_min, scrape_every, gzip_prom, no_kv_events, block_hashes,
                 do_import, compare):
    """Simulate an engine fleet serving agent sessions; emit real telemetry formats plus ground truth."""
    from dataclasses import replace

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from .sim.run import compare as run_compare
    from .sim.run import compare_table, simulate
    from .sim.scenarios import scenario as get_scenario
    from .sim.scenarios import whatif_configs

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
    if compare:
        configs = whatif_configs()
        with prog:
            task = prog.add_task("what-if", total=None)
            sums = run_compare(seed, configs, progress=lambda n: prog.advance(task, n))
        _emit(compare_table(sums), "table", "what-if: 20-turn tool-calling sessions, gaps 5–30 s, 3 replicas")
        return
    if traces:
        from .sim.scenarios import trace_scenario

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
    import time

    t = time.perf_counter()
    with prog:
        task = prog.add_task(f"simulate {sc.name}", total=None)
        fleet = simulate(sc, seed, out, progress=lambda n: prog.advance(task, n), prom_every=scrape_every,
                         gzip_prom=gzip_prom, kv_events=not no_kv_events, block_hashes=block_hashes)
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
    from .findings import build
    from .findings.render import headline

    try:
        ledger = build(con_or_db, settings=settings)
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
        raise AgentobsError(f"cannot open {db!r} to rebuild the demo store: {e}") from None
    try:
        data = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
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
        from .sim.live import run_live

        run_live(otlp_endpoint=otlp, speed=speed, seed=1, console=err_console)
        return
    root = sample_dir()
    bundle = root / "fleet"
    if (bundle / "manifest.json").exists():
        _fresh_demo_store(ctx.db, bundle)
        _bundle_import(ctx, bundle, rebase_to="now")  # the sample ends now: `--since 7d` finds it
    else:  # a checkout without the fleet bundle: the METRICS.md worked example only
        from .collect.files import import_otlp

        con = _open(ctx)
        with _writer(con, ctx) as w:
            import_otlp([root / "fixtures" / "otlp"], w, ctx.settings)
        con.close()
    con = _open(ctx, read_only=True)
    _emit(con.sql(HEADLINE_SQL).to_arrow_table(), "table", "sample fleet")
    try:
        from .metrics import compute

        reuse = compute("reuse", db=con, by="instance", settings=ctx.settings)
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


# --- collectors ------------------------------------------------------------------------------------
@cli.command("collect")
@click.option("--fleet", "fleet_path", type=click.Path(exists=True, dir_okay=False),
              help="Fleet file (YAML): receivers, scrape targets, KV-event publishers (see collectors/fleet.yaml).")
@click.option("--config", "old_fleet_path", type=click.Path(exists=True, dir_okay=False),
              help="Deprecated alias of --fleet (for one release; then --config is the settings file, as on every "
                   "other command).")
@click.option("--db", "db", envvar="AGENTOBS_DB", default=None, help="DuckDB file (default ./agentobs.duckdb).")
@click.option("--settings", "settings_path", envvar="AGENTOBS_CONFIG", default=None, help="Settings file (TOML).")
@click.option("--debug", is_flag=True, default=False, help="Show tracebacks.")
@click.pass_context
def collect_cmd(click_ctx, fleet_path, old_fleet_path, db, settings_path, debug):
    """Run the collectors until SIGTERM/SIGINT: OTLP gRPC+HTTP receivers, the fleet scraper, KV-event
    subscribers, the health /metrics endpoint and the read snapshot readers use (--db of readers)."""
    from .collect.fleet import load_fleet
    from .collect.service import Service, run_forever

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
    svc = Service(fleet, ctx.settings, ctx.db)
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

    from .collect.backfill import backfill, engine_metric_names, parse_duration
    from .collect.files import parse_at

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


# --- console ---------------------------------------------------------------------------------------
@cli.command("console")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=int, default=8501, show_default=True, help="Port (0 picks a free one).")
@backend_opts
@common
def console_cmd(ctx: Ctx, host, port, backend=None, clickhouse_url=None):
    """Start the Streamlit console on the store (opened read-only), or on ClickHouse with --backend
    clickhouse; Ctrl-C stops it."""
    import socket

    from .backends.source import resolve
    from .console import launch
    from .store.db import connect

    name, url = resolve(ctx.settings, backend, clickhouse_url)
    if name == "clickhouse":
        from .backends.clickhouse.conn import ClickHouse
        from .errors import StoreError

        ch = ClickHouse(url)  # fail now, in one line, if ClickHouse is unreachable or has no agentobs model
        try:
            if not ch.arrow("SELECT count() AS n FROM system.tables WHERE database = currentDatabase() "
                            "AND name = 'llm_calls'").column(0)[0].as_py():
                raise StoreError(f"no agentobs model at {ch} (view llm_calls missing): "
                                 "run `agentobs clickhouse init --clickhouse-url …` first")
            where = f"ClickHouse {ch}"
        finally:
            ch.close()  # chDB: this process lets go of the path before the app opens it
    else:
        connect(ctx.db, read_only=True).close()  # fail now, in one line, if the store is missing or unreadable
        where = f"store {ctx.db} (read-only)"
    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    err_console.print(f"agentobs console on http://{host}:{port}/ — {where}")
    import signal

    proc = launch(ctx.db, host=host, port=port, backend=name, clickhouse_url=url)

    def _stop(signum, _frame):  # SIGTERM/SIGINT to us: stop the Streamlit child too, never orphan it
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001 - a child that ignores SIGTERM is killed
            proc.kill()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    raise SystemExit(proc.wait())
# --- end console -----------------------------------------------------------------------------------


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
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@backend_opts
@common
def metrics_cmd(ctx: Ctx, name, since, until, by, filters, fmt, backend, clickhouse_url):
    """Agent metrics (METRICS.md). Without NAME: the catalogue with one-line definitions."""
    from .metrics import catalogue_table, compute

    if not name:
        _emit(catalogue_table(), fmt, "metrics (agentobs metrics NAME --by ...; formulas in docs/metrics.md)")
        return
    flt = _filters(filters)
    with _source(ctx, backend, clickhouse_url) as src:
        df = compute(name, db=src, since=since, until=until, by=by, filters=flt or None, settings=ctx.settings)
    _emit(df.to_arrow(), fmt, f"{name}" + (f" by {by}" if by else "") + (" (ClickHouse)" if _is_ch(src) else ""))
# --- end metrics -----------------------------------------------------------------------------------


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
    from .report import build, resolve, write
    from .store.db import connect

    period = resolve(week, since, until)
    with _source(ctx, backend, clickhouse_url) as src:
        if not _is_ch(src):
            connect(src, read_only=True).close()  # one clear line if the store is missing
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

    from .exporter import serve
    from .store.db import connect

    lhost, _, lport = str(ctx.settings.exporter_listen).rpartition(":")
    host = host or lhost or "127.0.0.1"
    port = port if port is not None else int(lport or 9465)
    with _source(ctx, backend, clickhouse_url) as src:
        if not _is_ch(src):
            connect(src, read_only=True).close()
        server, collector = serve(src, host, port, ctx.settings, refresh_s=refresh_s, window_s=window_s)
        store = f"ClickHouse {src}" if _is_ch(src) else f"store {src} (read-only)"
        err_console.print(f"agentobs exporter on http://{host}:{server.server_port}/metrics — {store}, "
                          f"window {collector.window_s:g} s, refresh every {collector.refresh_s:g} s", highlight=False)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        server.shutdown()
        collector.stop()
# --- end report ------------------------------------------------------------------------------------


# --- findings --------------------------------------------------------------------------------------
def _ledger(ctx: Ctx, since, until, filters, backend=None, clickhouse_url=None, include_acked=False,
            simulate=True):
    from .findings import build

    with _source(ctx, backend, clickhouse_url) as src:  # ClickHouse: no acknowledgements (docs/clickhouse.md)
        return build(src, since=since, until=until, filters=_filters(filters) or None, settings=ctx.settings,
                     include_acked=include_acked, simulate=simulate)


@cli.group("findings", invoke_without_command=True)
@click.option("--since", default=None, help="Window start: ISO-8601, epoch seconds, or a span before now (24h, 7d). "
              "Default: findings_default_window_s (7 days) before --until or the newest call.")
@click.option("--until", default=None, help="Window end (exclusive), same forms as --since.")
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE",
              help="Only calls with KEY=VALUE (instance, model, engine, task_type, tenant, agent_name, session, task); "
                   "repeatable. The ledger (tax, ownership, scaling) is computed over those calls.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown", "ledger"]), default="table",
              help="json: the findings, one object each; ledger: the whole ledger (window, the fleet's tax by cause "
                   "and over time, the findings).")
@click.option("--all", "show_all", is_flag=True, default=False, help="Also show acknowledged findings.")
@click.option("--no-simulate", "no_simulate", is_flag=True, default=False,
              help="Skip the simulator replay: recoverable tax from the analytical estimate only (faster).")
@backend_opts
@common
def findings_cmd(ctx: Ctx, since, until, filters, fmt, show_all, no_simulate, backend, clickhouse_url):
    """The recompute-tax ledger: the fleet's tax per week, and the default configs behind it with evidence, $ per
    week, the sessions affected and the exact fix (docs/findings.md). Subcommands list a finding's sessions and
    acknowledge a finding until a date."""
    if click.get_current_context().invoked_subcommand:
        return
    from .findings.render import headline, to_json, to_markdown, to_table

    ledger = _ledger(ctx, since, until, filters, backend, clickhouse_url, show_all, not no_simulate)
    found = list(ledger.findings)
    if fmt == "json":
        sys.stdout.buffer.write(to_json(found))
    elif fmt == "ledger":
        sys.stdout.buffer.write(ledger.to_json())
    elif fmt == "markdown":
        sys.stdout.write("\n".join(headline(ledger)) + "\n\n" + to_markdown(found))
    else:
        for line in headline(ledger):  # one line each, cut at the terminal's width (the full text: --format ledger)
            console.print(line, highlight=False, markup=False, no_wrap=True, overflow="ellipsis", crop=True)
        if found:
            _emit(to_table(found), "table", f"findings ({len(found)}; details: --format markdown; sessions: "
                                            "agentobs findings sessions ID)")
    err_console.print(f"{len(found)} finding(s)" + ("" if found else ": no default config is costing a recompute tax"),
                      highlight=False)


@findings_cmd.command("sessions")
@click.argument("finding_id")
@click.option("--since", default=None, help="Window start, as for `agentobs findings`.")
@click.option("--until", default=None, help="Window end (exclusive).")
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE", help="As for `agentobs findings`.")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@backend_opts
@common
def findings_sessions_cmd(ctx: Ctx, finding_id, since, until, filters, limit, fmt, backend, clickhouse_url):
    """The sessions FINDING_ID owns calls of (its tax), most $ first: then `agentobs calls --session ID`."""
    import pyarrow as pa

    ledger = _ledger(ctx, since, until, filters, backend, clickhouse_url, include_acked=True, simulate=False)
    if ledger.get(finding_id) is None:
        ids = [f.id for f in ledger.findings]
        raise AgentobsError(f"no finding {finding_id!r} in this window" + (f"; findings: {', '.join(ids)}" if ids
                                                                            else ""))
    rows = ledger.sessions_of(finding_id)
    schema = pa.schema([("session_id", pa.string()), ("calls", pa.int64()), ("reprefill_tokens", pa.float64()),
                        ("usd_window", pa.float64()), ("usd_week", pa.float64())])
    table = pa.Table.from_pylist(rows[:limit], schema=schema)
    _emit(table, fmt, f"{finding_id}: {len(rows)} session(s) affected" + (f", top {limit}" if len(rows) > limit
                                                                          else ""))


@findings_cmd.command("ack")
@click.argument("finding_id")
@click.option("--reason", required=True, help="Why it is accepted for now (stored with the acknowledgement).")
@click.option("--until", "until", required=True, help="Until when: a date (2026-11-30), ISO-8601 time, or a span (14d).")
@common
def findings_ack_cmd(ctx: Ctx, finding_id, reason, until):
    """Acknowledge finding FINDING_ID (rule/scope, as `agentobs findings` prints it) until a date."""
    from .findings.acks import add, parse_until

    con = _open(ctx)
    a = add(con, finding_id, reason, parse_until(until))
    con.close()
    err_console.print(f"acknowledged {finding_id} until {a['until']:%Y-%m-%d %H:%M} UTC", highlight=False)


@findings_cmd.command("unack")
@click.argument("finding_id")
@common
def findings_unack_cmd(ctx: Ctx, finding_id):
    """Withdraw the acknowledgement of FINDING_ID."""
    from .findings.acks import remove

    con = _open(ctx)
    ok = remove(con, finding_id)
    con.close()
    if not ok:
        raise AgentobsError(f"no acknowledgement for {finding_id!r} (see `agentobs findings acks`)")
    err_console.print(f"removed the acknowledgement of {finding_id}", highlight=False)


@findings_cmd.command("acks")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@common
def findings_acks_cmd(ctx: Ctx, fmt):
    """List acknowledgements (active and lapsed)."""
    import pyarrow as pa

    from .findings.acks import all_acks

    con = _open(ctx, read_only=True)
    rows = all_acks(con)
    cols = ("finding_id", "reason", "until", "created_at", "created_by")
    _emit(pa.table({c: [r[c] for r in rows] for c in cols}) if rows else
          pa.table({c: pa.array([], pa.string()) for c in cols}), fmt, "acknowledged findings")
# --- end findings ----------------------------------------------------------------------------------


# --- clickhouse (agentobs/backends/clickhouse, docs/clickhouse.md) ---------------------------------
@cli.group("clickhouse")
def clickhouse_grp():
    """The model and metrics on ClickHouse, over what the OTel Collector's ClickHouse exporter writes."""


def _ch_url(f):
    return click.option("--clickhouse-url", "url", default=None,
                        help="chdb:///DIR (in-process chDB) or http(s)://user:pass@host:8123/db (a server); "
                             "default: setting clickhouse_url ($AGENTOBS_CLICKHOUSE_URL, chdb:///agentobs.chdb).")(f)


@clickhouse_grp.command("init")
@_ch_url
@common
def ch_init_cmd(ctx: Ctx, url):
    """Create the exporter's tables if missing, the resolving materialized views and the model views."""
    from .backends.clickhouse import model
    from .backends.clickhouse.conn import ClickHouse

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

    from .backends.clickhouse import load, model
    from .backends.clickhouse.conn import ClickHouse
    from .collect.files import decode_otlp_file, parse_at, snapshot_time

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
    from .backends.clickhouse import metrics as chm
    from .backends.clickhouse.conn import ClickHouse

    flt = _filters(filters)
    ch = ClickHouse(url or ctx.settings.clickhouse_url)
    try:
        df = chm.compute(name, ch, since=since, until=until, by=by, filters=flt or None, settings=ctx.settings)
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
    from .backends.clickhouse.conn import ClickHouse
    from .backends.clickhouse.sql import run_select

    ch = ClickHouse(url or ctx.settings.clickhouse_url)
    try:
        table = run_select(ch, query, row_cap=max_rows or ctx.settings.sql_row_cap,
                           timeout_s=ctx.settings.sql_timeout_s)
    finally:
        ch.close()
    _emit(table, fmt, "ClickHouse")
# --- end clickhouse --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="agentobs", standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        raise SystemExit(130) from None
    except click.ClickException as e:
        e.show()
        raise SystemExit(e.exit_code) from None
    except AgentobsError as e:
        if debug:
            raise
        err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)  # "[cost]" is text, not markup
        raise SystemExit(e.exit_code) from None
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - one line unless --debug
        if debug:
            raise
        err_console.print(f"[red]internal error:[/red] {type(e).__name__}: {escape(str(e))} (rerun with --debug for "
                          "the traceback)",
                          highlight=False)
        raise SystemExit(70) from None


if __name__ == "__main__":
    main()
