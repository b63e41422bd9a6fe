"""`agentobs` commands: loadgen (agent-shaped load against a live engine, and the comparison of two runs)."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from ..errors import ConfigError
from .base import Ctx, _emit, cli, common, err_console


def _seconds(value: str | None, flag: str) -> float | None:
    from ..times import span_s

    if value is None:
        return None
    s = span_s(value)
    if s is None:
        try:
            s = float(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a duration (seconds, or 90s, 5m, 2h)", param_hint=flag) from None
    if s <= 0:
        raise click.BadParameter(f"{value!r} must be > 0", param_hint=flag)
    return s


@cli.command("loadgen")
@click.option("--target", default=None, metavar="URL",
              help="OpenAI-compatible endpoint (vLLM, SGLang, a gateway), e.g. http://127.0.0.1:8000.")
@click.option("--workload", default="claude-code", show_default=True,
              type=click.Choice(["claude-code", "mooncake", "synthetic", "store"]),
              help="claude-code: kv-cache-tester traces; mooncake: the Mooncake conversation trace; synthetic: the "
                   "simulator's task mix (--mix); store: sessions observed in --db (same as --from-store).")
@click.option("--trace", "traces", multiple=True, type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Trace file(s) for claude-code / mooncake (default: the bundled ones); repeatable.")
@click.option("--mix", default=None, metavar="TYPE=W,...", help="Synthetic task mix, e.g. coding=3,support=1.")
@click.option("--from-store", "from_store", is_flag=True, help="Replay sessions observed in the store (--db).")
@click.option("--since", default=None, help="With --from-store: sessions starting since (7d, ISO-8601, epoch).")
@click.option("--sample", type=int, default=None, help="With --from-store: this many sessions at random (--seed).")
@click.option("--model", default=None, help="Model to request (default: the first the target lists).")
@click.option("--sessions", type=int, default=None, help="Sessions to run (the workload repeats to reach it).")
@click.option("--concurrency", type=int, default=8, show_default=True, help="Sessions in flight at most.")
@click.option("--rate", type=float, default=None, help="Session arrivals per second (Poisson); default: as slots "
              "free up (Mooncake: the recorded arrivals).")
@click.option("--duration", default=None, help="Stop after this long (90s, 5m, 1h); what ran is kept.")
@click.option("--max-turns", type=int, default=None, help="Calls per session thread at most.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Streamed responses (TTFT measured).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="× every tool gap / think time (0: back to back).")
@click.option("--max-gap", default=None, help="Cap on a (scaled) tool gap: 8s, 1m.")
@click.option("--token-scale", type=float, default=1.0, show_default=True,
              help="× every prompt and output size (0 < s ≤ 1), to fit a small model.")
@click.option("--max-output", type=int, default=None, help="Cap on max_tokens per call.")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Send ignore_eos (vLLM/SGLang) so each call generates its max_tokens.")
@click.option("--tokenizer", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Local tokenizer.json, used when the target has no /tokenize.")
@click.option("--api-key-env", default=None, metavar="VAR",
              help="Environment variable holding the target's API key (sent as a Bearer token, never printed).")
@click.option("--otlp", default=None, metavar="URL",
              help="Send the run's spans to this OTLP/HTTP receiver (agentobs collect), instead of the store.")
@click.option("--into", "into", default=None, metavar="PATH",
              help="Write the run's spans straight into this store (default: --db).")
@click.option("--responses", default=None, type=click.Path(dir_okay=False),
              help="Also write every call (ids, usage as returned, TTFT) to this JSONL file.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds per request.")
@click.option("--compare", "compare_dbs", nargs=2, default=None, metavar="A.duckdb B.duckdb",
              help="Compare two runs instead of running: the difference B − A with its bootstrap interval.")
@click.option("--bootstrap", type=int, default=200, show_default=True, help="With --compare: resamples.")
@click.option("--level", type=float, default=0.95, show_default=True, help="With --compare: interval level.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@common
def loadgen_cmd(ctx: Ctx, target, workload, traces, mix, from_store, since, sample, model, sessions, concurrency,
                rate, duration, max_turns, stream, seed, time_scale, max_gap, token_scale, max_output, ignore_eos, tokenizer,
                api_key_env, otlp, into, responses, timeout, compare_dbs, bootstrap, level, fmt):
    """Agent-shaped load against a live engine: concurrent sessions with growing contexts, tool gaps, retries
    and sub-agents, traced into an agentobs store; or --compare two runs (docs/loadgen.md)."""
    if compare_dbs:
        from ..loadgen.compare import compare, display_table

        res = compare(compare_dbs[0], compare_dbs[1], reps=bootstrap, seed=seed, level=level, settings=ctx.settings)
        title = (f"B − A ({'paired' if res.paired else 'independent'} bootstrap over sessions, {res.reps} resamples, "
                 f"{res.level:.0%} interval); A = {res.a} ({res.sessions_a} sessions), B = {res.b} "
                 f"({res.sessions_b} sessions)")
        _emit(display_table(res) if fmt == "table" else res.table(), fmt, title)
        return
    if not target:
        raise click.UsageError("--target URL is required (or --compare A.duckdb B.duckdb)")
    try:
        from ..loadgen.runner import Options, preflight, run, size_check
        from ..loadgen.tracing import StoreExporter, Tracing
    except ImportError as e:
        raise ConfigError(f"agentobs loadgen needs the OpenTelemetry SDK and OTLP exporter ({e.name} is missing): "
                          "pip install 'agentobs[loadgen]'") from None
    from ..loadgen.workloads import check_plan, load_plan

    if from_store:
        workload = "store"
    if workload != "store" and (since or sample is not None):
        raise click.UsageError("--since / --sample apply to --from-store")
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ConfigError(f"--api-key-env {api_key_env}: that environment variable is empty or unset")
    into = into or (None if otlp else ctx.db)
    if workload == "store" and into and os.path.abspath(into) == os.path.abspath(ctx.db):
        raise click.UsageError("--from-store reads --db; write the run elsewhere (--into PATH or --otlp URL)")
    opts = Options(target=target, model=model, concurrency=concurrency, rate=rate,
                   duration_s=_seconds(duration, "--duration"), max_turns=max_turns, stream=stream, seed=seed,
                   time_scale=time_scale, max_gap_s=_seconds(max_gap, "--max-gap") if max_gap else None,
                   token_scale=token_scale, max_output=max_output, ignore_eos=ignore_eos,
                   timeout_s=timeout, tokenizer=tokenizer, api_key=api_key)
    plan = load_plan(workload, sessions=sessions, seed=seed, traces=traces, mix=mix, store_db=ctx.db, since=since,
                     sample=sample, settings=ctx.settings)
    check_plan(plan)
    pf = preflight(opts, plan)
    v = pf.vocab
    err_console.print(
        f"loadgen: {len(plan.sessions)} session(s) of {plan.source} → {target} model {pf.model}"
        f"{f' (max_model_len {pf.max_model_len})' if pf.max_model_len else ''}; tokenizer: {v.tokenizer}"
        f"{'' if v.checked else ' (sizes unchecked until the engine answers)'}, {len(v.words)} one-token words, chat "
        f"overhead {v.chat_overhead}; {pf.tokens_per_block} tokens per 64-token trace block", highlight=False)
    if pf.first_prompt_target is not None:
        err_console.print(f"first prompt: {pf.first_prompt_tokens} tokens for {pf.first_prompt_target} asked "
                          "(target's count)", highlight=False)
    tracing = Tracing(otlp=otlp, store=None if otlp else into, settings=ctx.settings)
    sink = open(responses, "a", encoding="utf-8") if responses else None  # noqa: SIM115 - closed below

    def on_record(rec):
        if sink:
            sink.write(json.dumps(rec.__dict__) + "\n")

    tty = err_console.is_terminal
    last = [0.0]

    def progress(stats):
        line = stats.line()
        if tty:
            sys.stderr.write("\r\x1b[2K" + line)
            sys.stderr.flush()
        elif time.monotonic() - last[0] >= 10:
            last[0] = time.monotonic()
            print(line, file=sys.stderr, flush=True)

    try:
        runner = run(opts, plan, pf, tracing, progress=progress, on_record=on_record)
    finally:
        if sink:
            sink.close()
        tracing.close()
    if tty:
        sys.stderr.write("\n")
    st = runner.stats
    err_console.print(f"{'stopped (' + st.stopped + '): ' if st.stopped else 'done: '}{st.line()} in "
                      f"{st.elapsed():.1f} s", highlight=False)
    sc = size_check(runner.records)
    if sc:
        err_console.print(f"prompt sizes (engine usage vs asked): {sc.exact}/{sc.calls} exact, {sc.within_1pct} within "
                          f"1 %, mean |error| {sc.mean_abs_rel:.3%}, max {sc.max_abs_rel:.3%}", highlight=False)
    exp = tracing.exporter
    where = f"OTLP {otlp}" if otlp else f"store {into}"
    extra = f" ({exp.accepted} spans stored, {exp.rejected} rejected)" if isinstance(exp, StoreExporter) else ""
    err_console.print(f"spans → {where}{extra}; session ids lg-{runner.run_id}-*", highlight=False)
    for msg in getattr(exp, "errors", [])[:5]:
        err_console.print(f"  [red]error[/red] {msg}", highlight=False)
    if st.calls and st.errors == st.calls:
        raise SystemExit(1)
