"""Run agent sessions against an OpenAI-compatible endpoint (``agentobs loadgen``).

Each session is one agent task: an ``invoke_agent`` root span, a ``chat <model>`` CLIENT span per model call
(GenAI semantic conventions + agentobs attributes, docs/span-conventions.md) and an ``execute_tool`` span for
every idle gap. Calls of a thread run one after the other, each after its gap (scaled by ``time_scale``);
parallel segments (sub-agents) run their threads at once; a retried turn sends the same prompt again after the
agent rejected the first answer. Every request carries the session id three ways: body ``session_id``, header
``x-session-id`` and the W3C ``traceparent`` of its chat span (engines then parent their own spans under it).

Preflight (before any load): the target answers ``GET /v1/models`` and serves the model; the tokenizer and the
word vocabulary are set up and the first prompt's size is checked; a prompt that does not fit the model's
``max_model_len`` is refused. One clear error otherwise.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..errors import ConfigError, did_you_mean
from ..sim.workload import CallSpec, Session
from .client import Client, HttpError, Target
from .prompts import LocalTokenizer, PromptBuilder, RemoteTokenizer, Tokenizer, Vocabulary, vocabulary
from .tracing import Tracing
from .workloads import BLOCK, Plan

_W3C = TraceContextTextMapPropagator()  # the traceparent header (no baggage: the run sets none)


@dataclass
class Options:
    target: str
    model: str | None = None
    concurrency: int = 8
    rate: float | None = None          # session arrivals per second (Poisson); None: as slots free up
    duration_s: float | None = None    # stop launching, and cancel what runs, after this long
    max_turns: int | None = None       # calls per thread (main and each sub-agent)
    stream: bool = True
    seed: int = 0
    time_scale: float = 1.0            # × every gap and open-loop arrival
    max_gap_s: float | None = None     # cap on a (scaled) gap
    token_scale: float = 1.0           # × every prompt and output size (and tokens per block)
    max_output: int | None = None      # cap on max_tokens per call
    ignore_eos: bool = True            # vLLM/SGLang: generate exactly max_tokens
    temperature: float = 0.0
    timeout_s: float = 600.0
    retries: int = 1                   # re-sends of a call that failed (HTTP error) before the session gives up
    tokenizer: str | None = None       # local tokenizer.json when the target has no /tokenize
    api_key: str | None = None
    run_id: str | None = None
    progress_s: float = 1.0

    def __post_init__(self):
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency must be ≥ 1, got {self.concurrency}")
        for name in ("rate", "duration_s", "time_scale", "token_scale", "timeout_s", "max_gap_s"):
            v = getattr(self, name)
            if v is not None and (not math.isfinite(v) or v < 0 or (v == 0 and name not in ("time_scale", "max_gap_s"))):
                flag = "--" + name.removesuffix("_s").replace("_", "-")
                raise ConfigError(f"{flag} must be a positive number, got {v!r}")
        if self.token_scale > 1:
            raise ConfigError(f"--token-scale scales prompts down (0 < s ≤ 1), got {self.token_scale}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ConfigError(f"--max-turns must be ≥ 1, got {self.max_turns}")


@dataclass
class Preflight:
    target: Target
    model: str
    max_model_len: int | None
    vocab: Vocabulary
    tokens_per_block: int
    first_prompt_target: int | None = None
    first_prompt_tokens: int | None = None


@dataclass
class CallRecord:
    session_id: str
    branch: str
    turn: int
    attempt: int
    request_id: str
    target_prompt_tokens: int
    max_tokens: int
    t_send: float
    latency_s: float = 0.0
    status: int | None = None
    error: str | None = None
    rejected: bool = False
    response_id: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    ttft_s: float | None = None
    trace_id: str | None = None
    span_id: str | None = None


@dataclass
class Stats:
    t0: float = field(default_factory=time.monotonic)
    sessions_total: int = 0
    sessions_started: int = 0
    sessions_done: int = 0
    sessions_failed: int = 0
    calls: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    stopped: str | None = None
    t_end: float | None = None

    def elapsed(self) -> float:
        return (self.t_end or time.monotonic()) - self.t0

    def line(self) -> str:
        el = max(self.elapsed(), 1e-9)
        s = (f"sessions {self.sessions_done}/{self.sessions_total} done ({self.sessions_started - self.sessions_done} "
             f"running) · {self.calls} calls, {self.calls / el:.1f}/s · {self.errors} errors")
        if self.ttft:
            p50, p99 = percentile(self.ttft, 0.5), percentile(self.ttft, 0.99)
            s += f" · TTFT p50 {p50 * 1000:.0f} ms p99 {p99 * 1000:.0f} ms"
        elif self.latency:
            s += f" · latency p50 {percentile(self.latency, 0.5) * 1000:.0f} ms"
        return s


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (DuckDB's quantile_cont, numpy's default)."""
    v = sorted(xs)
    if not v:
        return math.nan
    pos = q * (len(v) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


# -- preflight -------------------------------------------------------------------------------------------------------
def _get_json(url: str, headers: dict, timeout: float = 15.0):
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def preflight(opts: Options, plan: Plan) -> Preflight:
    target = Target.parse(opts.target)
    base = f"http://{target.host}:{target.port}{target.prefix}"
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    try:
        doc = _get_json(base + "/v1/models", headers)
    except urllib.error.HTTPError as e:
        raise ConfigError(f"--target {opts.target}: GET /v1/models answered HTTP {e.code}; is this an "
                          "OpenAI-compatible endpoint (and the API key right)?") from e
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise ConfigError(f"--target {opts.target}: cannot reach GET /v1/models ({reason})") from e
    models: dict[str, dict] = {str(m["id"]): m for m in (doc.get("data") or []) if isinstance(m, dict) and m.get("id")} \
        if isinstance(doc, dict) else {}
    if not models:
        raise ConfigError(f"--target {opts.target}: GET /v1/models lists no model")
    model = opts.model or next(iter(models))
    if model not in models:
        raise ConfigError(f"--model {model!r} is not served by {opts.target}{did_you_mean(model, models, 'it serves')}")
    mml = models[model].get("max_model_len")
    tok: Tokenizer | None = RemoteTokenizer.probe(base, model, headers)
    if tok is None:
        tok = LocalTokenizer(opts.tokenizer) if opts.tokenizer else Tokenizer()
    vocab = vocabulary(tok)
    tpb = max(1, round(BLOCK * opts.token_scale))
    pf = Preflight(target, model, int(mml) if mml else None, vocab, tpb)
    # the largest prompt must fit
    if pf.max_model_len:
        worst = None
        for s in plan.sessions:
            for c in iter_calls(s, opts.max_turns):
                need = scaled(c.P, opts.token_scale) + out_tokens(c, opts)
                if worst is None or need > worst[0]:
                    worst = (need, s.sid)
        if worst and worst[0] > pf.max_model_len:
            raise ConfigError(f"session {worst[1]} needs {worst[0]} tokens (prompt + output) but {model} takes at "
                              f"most {pf.max_model_len} (max_model_len): scale the workload down with "
                              f"--token-scale {math.floor(opts.token_scale * pf.max_model_len / worst[0] * 1000) / 1000:g} "
                              "or fewer --max-turns")
    # the first prompt as the engine will count it
    first = next((c for s in plan.sessions for c in iter_calls(s, opts.max_turns)), None)
    if first is not None and vocab.checked:
        builder = PromptBuilder(vocab, tpb)
        want = scaled(first.P, opts.token_scale)
        msgs = [{"role": "user", "content": builder.content(first.chain, max(1, want - vocab.chat_overhead), 1,
                                                            first.nblk)}]
        got = tok.chat_count(msgs)
        if got is None:
            got = tok.count(msgs[0]["content"])
        pf.first_prompt_target, pf.first_prompt_tokens = want, got
    return pf


def scaled(n: int, s: float) -> int:
    return max(1, round(n * s))


def out_tokens(c: CallSpec, opts: Options) -> int:
    o = scaled(c.O, opts.token_scale)
    return min(o, opts.max_output) if opts.max_output else o


def iter_calls(s: Session, max_turns: int | None):
    for seg in s.segments:
        for _, calls in seg.threads:
            yield from (calls[:max_turns] if max_turns else calls)


# -- the run ---------------------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, opts: Options, plan: Plan, pf: Preflight, tracing: Tracing,
                 on_record: Callable[[CallRecord], None] | None = None):
        self.opts, self.plan, self.pf, self.tracing = opts, plan, pf, tracing
        self.tracer = tracing.tracer
        self.builder = PromptBuilder(pf.vocab, pf.tokens_per_block)
        self.client = Client(pf.target, opts.timeout_s)
        self.stats = Stats(sessions_total=len(plan.sessions))
        self.records: list[CallRecord] = []
        self.on_record = on_record
        self.run_id = opts.run_id or os.urandom(3).hex()
        self._auth = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
        self._stop = asyncio.Event()
        self._seq: dict[str, int] = {}  # session → its last call's number

    def stop(self, why: str = "stopped") -> None:
        if self.stats.stopped is None:
            self.stats.stopped = why
        self._stop.set()

    async def run(self, progress: Callable[[Stats], None] | None = None) -> Stats:
        opts = self.opts
        rng = random.Random(opts.seed)
        sem = asyncio.Semaphore(opts.concurrency)
        tasks: set[asyncio.Task] = set()
        open_loop = opts.rate is None and any(
            c.at_s is not None for s in self.plan.sessions[:1] for c in iter_calls(s, None))
        ticker = asyncio.ensure_future(self._ticker(progress)) if progress else None
        deadline = None if opts.duration_s is None else time.monotonic() + opts.duration_s
        t_start = time.monotonic()

        async def launch():
            t_next = 0.0
            for k, sess in enumerate(self.plan.sessions):
                if opts.rate is not None:
                    t_next += rng.expovariate(opts.rate)
                elif open_loop:  # recorded arrivals (Mooncake)
                    t_next = sess.start_s * opts.time_scale
                delay = t_start + t_next - time.monotonic()
                if delay > 0 and await self._wait(delay):
                    return
                await sem.acquire()
                if self._stop.is_set():
                    sem.release()
                    return
                self.stats.sessions_started += 1
                t = asyncio.ensure_future(self._session(k, sess))
                tasks.add(t)
                t.add_done_callback(lambda t: (tasks.discard(t), sem.release()))

        launcher = asyncio.ensure_future(launch())
        try:
            while True:
                waits = [launcher, *tasks] if not launcher.done() else list(tasks)
                if not waits:
                    break
                stop_wait = asyncio.ensure_future(self._stop.wait())
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, _ = await asyncio.wait([*waits, stop_wait], timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not stop_wait.done():
                    stop_wait.cancel()
                if deadline is not None and time.monotonic() >= deadline:
                    self.stop("duration reached")
                if self._stop.is_set():
                    break
            launcher.cancel()
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(launcher, *tasks, return_exceptions=True)
        finally:
            if ticker:
                ticker.cancel()
            self.stats.t_end = time.monotonic()
            await self.client.close()
        if progress:
            progress(self.stats)
        return self.stats

    async def _wait(self, delay: float) -> bool:
        """Sleep ``delay`` s; True when the run was stopped meanwhile."""
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=delay)
            return True
        except TimeoutError:
            return False

    async def _ticker(self, progress):
        while True:
            await asyncio.sleep(self.opts.progress_s)
            progress(self.stats)

    async def _session(self, k: int, sess: Session) -> None:
        sid = f"lg-{self.run_id}-{sess.sid}"
        task_id = f"lg-{self.run_id}-{sess.task_id}"
        attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": sess.agent_name,
                 "gen_ai.conversation.id": sid, "app.task.id": task_id, "agentobs.task.type": sess.task_type,
                 "agentobs.loadgen.run": self.run_id}
        if sess.tenant:
            attrs["agentobs.tenant"] = sess.tenant
        ok = False
        with self.tracer.start_as_current_span(f"invoke_agent {sess.agent_name}", kind=SpanKind.INTERNAL,
                                               attributes=attrs):
            t0 = time.monotonic()
            try:
                first = True
                for seg in sess.segments:
                    if seg.kind == "seq" or len(seg.threads) == 1:
                        for branch, calls in seg.threads:
                            if not await self._thread(sid, task_id, branch, calls, t0, first):
                                return
                    else:
                        res = await asyncio.gather(*(self._thread(sid, task_id, b, calls, t0, False)
                                                     for b, calls in seg.threads))
                        if not all(res):
                            return
                    first = False
                ok = True
            finally:
                if ok:
                    self.stats.sessions_done += 1
                else:
                    self.stats.sessions_failed += 1
                    self.stats.sessions_done += 1

    async def _thread(self, sid: str, task_id: str, branch: str, calls: list[CallSpec], t0: float,
                      first_segment: bool) -> bool:
        opts = self.opts
        if opts.max_turns:
            calls = calls[:opts.max_turns]
        for turn, c in enumerate(calls):
            if c.at_s is not None:  # open loop: the recorded time within the session
                delay = t0 + c.at_s * opts.time_scale - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            elif c.gap_s > 0 and opts.time_scale > 0 and not (turn == 0 and first_segment):
                tool = c.tool or "think"
                gap = c.gap_s * opts.time_scale
                with self.tracer.start_as_current_span(f"execute_tool {tool}", kind=SpanKind.INTERNAL, attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                        "gen_ai.conversation.id": sid, "app.task.id": task_id,
                        **({"agentobs.branch": branch} if branch != "main" else {})}):
                    await asyncio.sleep(gap if opts.max_gap_s is None else min(gap, opts.max_gap_s))
            attempts = 2 if c.fail else 1
            attempt = 0
            failures = 0
            n = self._seq[sid] = self._seq.get(sid, -1) + 1  # the call's number in its session (request ids)
            while True:
                attempt += 1
                rejected = attempt < attempts
                rec = await self._call(sid, task_id, branch, turn, attempt, c, rejected, n)
                if rec.error is not None:
                    failures += 1
                    if failures > opts.retries:
                        return False
                    await asyncio.sleep(min(5.0, 0.5 * failures))
                    continue
                if rejected:
                    await asyncio.sleep(c.backoff_s * opts.time_scale)
                    continue
                break
        return True

    async def _call(self, sid: str, task_id: str, branch: str, turn: int, attempt: int, c: CallSpec,
                    rejected: bool, n: int) -> CallRecord:
        opts, pf = self.opts, self.pf
        want = scaled(c.P, opts.token_scale)
        n_out = out_tokens(c, opts)
        rid = f"{sid}-c{n}-a{attempt}"
        seed = zlib.crc32(f"{sid}/{n}".encode())
        content = self.builder.content(c.chain, max(1, want - pf.vocab.chat_overhead), seed, c.nblk)
        body = {"model": pf.model, "messages": [{"role": "user", "content": content}], "max_tokens": n_out,
                "temperature": opts.temperature, "session_id": sid}
        if opts.ignore_eos:
            body["ignore_eos"] = True
        if opts.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        headers = {"x-session-id": sid, "X-Request-Id": rid, **self._auth}
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                 "gen_ai.request.model": pf.model, "gen_ai.conversation.id": sid, "app.task.id": task_id,
                 "agentobs.attempt": attempt, "server.address": pf.target.host, "server.port": pf.target.port,
                 "gen_ai.request.max_tokens": n_out, "gen_ai.request.temperature": opts.temperature,
                 "gen_ai.request.stream": opts.stream, "agentobs.loadgen.target_prompt_tokens": want}
        if branch != "main":
            attrs["agentobs.branch"] = branch
        rec = CallRecord(sid, branch, turn, attempt, rid, want, n_out, time.time())
        with self.tracer.start_as_current_span(f"chat {pf.model}", kind=SpanKind.CLIENT, attributes=attrs,
                                               record_exception=False, set_status_on_exception=False) as span:
            _W3C.inject(headers)
            ctx = span.get_span_context()
            if ctx.is_valid:
                rec.trace_id, rec.span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
            t0 = time.perf_counter()
            try:
                resp = await self.client.request("POST", "/v1/chat/completions", body, headers, stream=opts.stream)
            except HttpError as e:
                rec.error = str(e)
            except asyncio.CancelledError:
                rec.error = "cancelled"
                span.set_attribute("error.type", "cancelled")
                span.set_status(Status(StatusCode.ERROR, "run stopped"))
                rec.latency_s = time.perf_counter() - t0
                self._record(rec)
                raise
            rec.latency_s = time.perf_counter() - t0
            if rec.error is None:
                rec.status = resp.status
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {resp.body[:200].decode('utf-8', 'replace')}"
                else:
                    try:
                        self._parse(resp, rec, span)
                    except (HttpError, ValueError, KeyError, TypeError, AttributeError) as e:
                        rec.error = f"bad response: {e}"
            if rec.error is not None:
                span.set_attribute("error.type", str(rec.status) if rec.status and rec.status != 200 else
                                   "bad_response" if rec.status == 200 else "connection")
                span.set_status(Status(StatusCode.ERROR, rec.error[:200]))
            elif rejected:
                span.set_attribute("error.type", "invalid_output")
                span.set_status(Status(StatusCode.ERROR, "the agent rejected the answer (replayed retry)"))
                rec.rejected = True
        self._record(rec)
        return rec

    def _parse(self, resp, rec: CallRecord, span) -> None:
        usage = None
        finish = None
        if self.opts.stream:
            first = None
            chunks: list[float] = []
            for ev, t in zip(resp.events, resp.event_s, strict=True):
                rec.response_id = rec.response_id or ev.get("id")
                if ev.get("usage"):
                    usage = ev["usage"]
                for ch in ev.get("choices") or []:
                    d = ch.get("delta") or {}
                    if d.get("content") or d.get("reasoning_content"):
                        chunks.append(t)
                        if first is None:
                            first = t
                    finish = ch.get("finish_reason") or finish
            if first is not None:
                rec.ttft_s = first
                stream_attrs = {"gen_ai.response.time_to_first_chunk": first}
                if len(chunks) > 1:
                    stream_attrs["agentobs.itl_ms"] = [round((b - a) * 1000, 3) for a, b in
                                                       zip(chunks, chunks[1:], strict=False)]
                span.set_attributes(stream_attrs)
        else:
            doc = resp.json()
            rec.response_id = doc.get("id")
            usage = doc.get("usage")
            ch = (doc.get("choices") or [{}])[0]
            finish = ch.get("finish_reason")
        attrs: dict[str, Any] = {}
        if rec.response_id:
            attrs["gen_ai.response.id"] = rec.response_id
            attrs["gen_ai.response.model"] = self.pf.model
        if finish:
            attrs["gen_ai.response.finish_reasons"] = [finish]
        if usage:
            rec.prompt_tokens = usage.get("prompt_tokens")
            rec.output_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            rec.cached_tokens = details.get("cached_tokens")
            if rec.prompt_tokens is not None:
                attrs["gen_ai.usage.input_tokens"] = int(rec.prompt_tokens)
            if rec.output_tokens is not None:
                attrs["gen_ai.usage.output_tokens"] = int(rec.output_tokens)
            if rec.cached_tokens is not None:
                attrs["gen_ai.usage.cache_read.input_tokens"] = int(rec.cached_tokens)
        span.set_attributes(attrs)

    def _record(self, rec: CallRecord) -> None:
        st = self.stats
        if rec.error == "cancelled":
            self.records.append(rec)
            return
        st.calls += 1
        if rec.error is not None:
            st.errors += 1
        else:
            st.latency.append(rec.latency_s)
            if rec.ttft_s is not None:
                st.ttft.append(rec.ttft_s)
        self.records.append(rec)
        if self.on_record:
            self.on_record(rec)


# -- the achieved prompt sizes ---------------------------------------------------------------------------------------
@dataclass
class SizeCheck:
    calls: int
    exact: int
    within_1pct: int
    mean_abs_rel: float
    max_abs_rel: float
    target_tokens: int
    achieved_tokens: int


def size_check(records: list[CallRecord]) -> SizeCheck | None:
    """The engine's ``usage.prompt_tokens`` against the prompt size asked for, per call that answered."""
    xs = [(r.target_prompt_tokens, r.prompt_tokens) for r in records if r.error is None and r.prompt_tokens]
    if not xs:
        return None
    rel = [abs(b - a) / a for a, b in xs]
    return SizeCheck(len(xs), sum(1 for a, b in xs if a == b), sum(1 for x in rel if x <= 0.01),
                     sum(rel) / len(rel), max(rel), sum(a for a, _ in xs), sum(b for _, b in xs))


def run(opts: Options, plan: Plan, pf: Preflight, tracing: Tracing, progress=None, on_record=None,
        install_signals: bool = True, started: Callable[[Runner], None] | None = None) -> Runner:
    """Run to the end (or ``--duration``, or SIGINT/SIGTERM: stop cleanly, keep what ran); returns the runner.
    ``started(runner)`` is called once the runner exists (``runner.stop()`` ends the run from a callback)."""
    import signal

    runner: Runner | None = None

    async def main():
        nonlocal runner
        runner = Runner(opts, plan, pf, tracing, on_record)
        if started:
            started(runner)
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, runner.stop, "interrupted")
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
        try:
            await runner.run(progress)
        finally:
            if install_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    try:
                        loop.remove_signal_handler(sig)
                    except (NotImplementedError, RuntimeError, ValueError):
                        pass

    asyncio.run(main())
    assert runner is not None
    return runner
