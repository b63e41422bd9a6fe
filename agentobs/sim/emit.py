"""The simulator's output bundle: what real systems emit, in the formats our importers read.

    DIR/manifest.json                 what is where (read by ``agentobs import bundle``)
    DIR/otlp/spans-NNNN.jsonl.gz      OTLP/JSON lines (Collector file exporter): invoke_agent roots,
                                      gateway `chat` CLIENT spans, execute_tool spans, engine spans
                                      (vLLM ``llm_request`` / SGLang `` Req …``, children of the gateway span)
    DIR/prom/<inst>/<epoch>.prom[.gz] Prometheus text per instance per scrape (prometheus_client)
    DIR/server_info/<inst>.json       SGLang GET /server_info
    DIR/kv_events/<inst>.jsonl.gz     KV-event captures (agentobs/collect/kvevents.py format)
    DIR/truth/calls.parquet           ground truth per call, keyed by call_id (= gateway span id)
"""

from __future__ import annotations

import copy
import gzip
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from ..output import atomic_write
from . import promexp
from .engine import Instance
from .fleet import Call, Fleet, _SessState

FORMAT = "agentobs-sim-bundle/1"
_pack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


def _attr(k: str, v) -> dict:
    if isinstance(v, bool):
        return {"key": k, "value": {"boolValue": v}}
    if isinstance(v, int):
        return {"key": k, "value": {"intValue": str(v)}}
    if isinstance(v, float):
        return {"key": k, "value": {"doubleValue": v}}
    if isinstance(v, (list, tuple)):
        vals = [({"doubleValue": x} if isinstance(x, float) else {"intValue": str(x)} if isinstance(x, int)
                 else {"stringValue": str(x)}) for x in v]
        return {"key": k, "value": {"arrayValue": {"values": vals}}}
    return {"key": k, "value": {"stringValue": str(v)}}


def _attrs(d: dict) -> list:
    return [_attr(k, v) for k, v in d.items() if v is not None]


def _ns_at(epoch: float, t: float) -> str:
    """Epoch nanoseconds of simulated time ``t`` (integer arithmetic: no float rounding at 1e18)."""
    return str(int(round(epoch * 1e6)) * 1000 + int(round(t * 1e9)))


def inst_dir(name: str) -> str:
    return name.replace(":", "_").replace("/", "_")


def token_ids(hashes: list[int], B: int) -> list[int]:
    """Synthetic token ids for a BlockStored event (the simulator has no text): ``B`` per block, one
    filler id per block (its hash mod 128: one msgpack byte, so the committed sample stays small)."""
    out: list[int] = []
    for h in hashes:
        out += [h % 128] * B
    return out


def itl_ms(runs) -> list[float]:
    out: list[float] = []
    for gap, n in runs or ():
        out.extend([round(gap * 1000.0, 2)] * n)
    return out


class _Sink(Protocol):
    """Where the OTLP/JSON lines go: the bundle's gzip file, or a poster (``sim/live.py``)."""

    def write(self, data: bytes, /) -> object: ...

    def close(self) -> None: ...


class BundleSink:
    """Writes a bundle while the fleet runs. ``prom_every`` keeps one scrape in N (a lean committed
    copy), ``gzip_prom`` compresses snapshots, ``kv_events`` turns the KV-event capture on."""

    def __init__(self, out: str | os.PathLike, kv_events: bool = True, prom_every: int = 1, gzip_prom: bool = False,
                 block_hashes: bool = False, spans_per_line: int = 200, workload: str = "", seed: int = 0):
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "otlp").mkdir(exist_ok=True)
        self.wants_kv_events = kv_events
        self.prom_every = max(1, prom_every)
        self.gzip_prom = gzip_prom
        self.block_hashes = block_hashes
        self.spans_per_line = spans_per_line
        self.workload, self.seed = workload, seed
        self._otlp_path = self.dir / "otlp" / "spans-0001.jsonl.gz"
        self._otlp: _Sink = gzip.GzipFile(self._otlp_path, "wb", 6, mtime=0)  # mtime 0: same bytes every run
        self._buf: dict[str, list] = {}
        self._kv: dict[str, gzip.GzipFile] = {}
        self._epoch = 0.0
        self._kv_seq: dict[str, int] = {}
        self._snap_n = 0
        self.truth: dict[str, list] = {k: [] for k in TRUTH_COLUMNS}
        self._last_calls: list[Call] = []
        self._routed: list = []
        self.n_spans = 0

    # -- spans -------------------------------------------------------------------------------------------
    def _resources(self, fleet: Fleet) -> dict[str, dict]:
        res = {
            "agent": {"attributes": _attrs({"service.name": "agent-harness", "service.version": "sim",
                                            "telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry"}),
                      "scope": {"name": "opentelemetry.util.genai", "version": "1.3b0"}},
            "gateway": {"attributes": _attrs({"service.name": "ai-gateway", "service.version": "sim",
                                              "telemetry.sdk.language": "go", "telemetry.sdk.name": "opentelemetry"}),
                        "scope": {"name": "ai-gateway/tracing/otelgenai", "version": "1.1.0"}},
        }
        for inst in fleet.instances:
            if inst.spec.engine == "vllm":
                res[inst.spec.name] = {"attributes": _attrs({
                    "service.name": "vllm-server", "service.instance.id": inst.spec.name,
                    "telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry"}),
                    "scope": {"name": "vllm.tracing.otel"}}
            else:
                res[inst.spec.name] = {"attributes": _attrs({
                    "service.name": "sglang", "service.instance.id": inst.spec.name,
                    "telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry"}),
                    "scope": {"name": "sglang server"}}
        return res

    def _span(self, fleet: Fleet, res: str, span: dict) -> None:
        if not hasattr(self, "_res"):
            self._res = self._resources(fleet)
        b = self._buf.setdefault(res, [])
        b.append(span)
        self.n_spans += 1
        if len(b) >= self.spans_per_line:
            self._flush_res(res)

    def _flush_res(self, res: str) -> None:
        spans = self._buf.get(res)
        if not spans:
            return
        r = self._res[res]
        doc = {"resourceSpans": [{"resource": {"attributes": r["attributes"]},
                                  "scopeSpans": [{"scope": r["scope"], "spans": spans}]}]}
        self._otlp.write(_json.encode(doc) + b"\n")
        self._buf[res] = []

    def call_done(self, call: Call, fleet: Fleet) -> None:
        self._epoch = fleet.spec.start_epoch
        r = call.req
        sess = call.sess
        inst: Instance = r.inst
        trace = fleet.trace_id(sess.task_id)
        root = fleet.span_id_for(sess.sid)
        host, port = inst.spec.name.rsplit(":", 1)
        model = call.spec.model or inst.model
        resp_id = f"chatcmpl-{call.span_id}{trace[:16]}"
        common = {"gen_ai.conversation.id": sess.sid, "app.task.id": sess.task_id,
                  "agentobs.task.type": sess.task_type, "agentobs.tenant": sess.tenant}
        if call.tool_start is not None and call.spec.tool:
            t_a, t_b = call.tool_start + 0.003, call.t0 - 0.003
            if t_b > t_a:
                self._span(fleet, "agent", {
                    "traceId": trace, "spanId": fleet.span_id(10**12 + int(call.span_id[:8], 16)), "parentSpanId": root,
                    "name": f"execute_tool {call.spec.tool}", "kind": 1, "startTimeUnixNano": _ns_at(self._epoch, t_a),
                    "endTimeUnixNano": _ns_at(self._epoch, t_b), "status": {},
                    "attributes": _attrs({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.spec.tool,
                                          "gen_ai.tool.type": "function", "app.task.id": sess.task_id})})
        ok = r.status == "ok"
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": inst.spec.engine,
                 "gen_ai.request.model": model, **common,
                 "agentobs.attempt": call.attempt if call.attempt > 1 else None,
                 "agentobs.branch": call.branch if call.branch != "main" else None,
                 "gen_ai.request.stream": True, "server.address": host, "server.port": int(port)}
        if call.refused is not None:  # the engine's 400 for a prompt longer than it accepts
            attrs["error.type"] = "400"
            status = {"code": 2, "message": f"400 Bad Request: {call.refused}"}
            end = call.t2
        elif call.rejected:
            attrs["error.type"] = "503"
            status = {"code": 2, "message": "503 Service Unavailable: engine queue full"}
            end = call.t2
        elif r.finish == "restart":  # the engine restarted while serving it: the connection dropped, no usage came
            # back but the prompt the gateway counted itself
            attrs.update({"error.type": "502", "gen_ai.usage.input_tokens": r.P})
            if self.block_hashes:  # the client's hashes of its own prompt: there whatever the engine did
                attrs["agentobs.prompt.block_hashes"] = list(r.chain[: r.nblk])
            status = {"code": 2, "message": "502 Bad Gateway: upstream connection reset"}
            end = call.t2
        else:
            cached = r.C if inst.spec.cache_report else None
            attrs.update({
                "gen_ai.response.id": resp_id, "gen_ai.response.model": model,
                "gen_ai.response.finish_reasons": ["tool_calls" if call.spec.tool or ok else "error"] if ok else None,
                "gen_ai.response.time_to_first_chunk": round(r.t_first - call.t0 + fleet.spec.net_s, 6),
                "gen_ai.usage.input_tokens": r.P, "gen_ai.usage.cache_read.input_tokens": cached,
                "gen_ai.usage.output_tokens": r.O,
                "agentobs.prompt.system_tokens": call.spec.system_tokens or None,
                "agentobs.prompt.tool_tokens": call.spec.tool_tokens or None,
                "agentobs.itl_ms": itl_ms(r.itl) or None,
            })
            if self.block_hashes:
                attrs["agentobs.prompt.block_hashes"] = list(r.chain[: r.nblk])
            if not ok:
                attrs["error.type"] = "stream_interrupted"
            status = {} if ok else {"code": 2, "message": "upstream aborted the stream"}
            end = call.t2
        self._span(fleet, "gateway", {
            "traceId": trace, "spanId": call.span_id, "parentSpanId": root, "name": f"chat {model}", "kind": 3,
            "startTimeUnixNano": _ns_at(self._epoch, call.t0), "endTimeUnixNano": _ns_at(self._epoch, end), "status": status,
            "attributes": _attrs(attrs)})
        if not call.rejected and r.finish != "restart":  # the dying engine's exporter lost its span
            self._engine_span(fleet, call, trace, resp_id, model)
        self._truth(call, fleet)

    def _engine_span(self, fleet: Fleet, call: Call, trace: str, resp_id: str, model: str) -> None:
        r = call.req
        inst: Instance = r.inst
        ttft = r.t_first - r.t_arrive
        e2e = r.t_end - r.t_arrive
        dec = r.t_end - r.t_first
        sid = fleet.span_id(2 * 10**12 + int(call.span_id[:8], 16))
        if fleet.spec.traceparent:  # the gateway forwards W3C traceparent: the engine span is its child
            link = {"traceId": trace, "spanId": sid, "parentSpanId": call.span_id}
        else:  # e.g. LiteLLM: no traceparent to the engine, which starts its own trace (join by response id)
            link = {"traceId": fleet.trace_id(f"engine/{call.span_id}"), "spanId": sid}
        if inst.spec.engine == "vllm":
            a = {"gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": e2e,
                 "gen_ai.latency.time_in_queue": r.queue_s, "gen_ai.usage.prompt_tokens": r.P,
                 "gen_ai.usage.completion_tokens": r.O, "gen_ai.latency.time_in_model_prefill": r.prefill_s,
                 "gen_ai.latency.time_in_model_decode": dec, "gen_ai.latency.time_in_model_inference": r.prefill_s + dec,
                 "gen_ai.request.id": resp_id, "gen_ai.request.top_p": 0.95, "gen_ai.request.max_tokens": 4096,
                 "gen_ai.request.temperature": 0.6, "gen_ai.request.n": 1}
            name = "llm_request"
        else:
            a = {"rid": resp_id, "module": "sglang::request", "gen_ai.usage.prompt_tokens": r.P,
                 "gen_ai.usage.completion_tokens": r.O, "gen_ai.usage.cached_tokens": r.C,
                 "gen_ai.request.id": resp_id, "gen_ai.request.max_tokens": 4096, "gen_ai.request.top_p": 0.95,
                 "gen_ai.request.temperature": 0.6, "gen_ai.response.model": model,
                 "gen_ai.response.finish_reasons": json.dumps([r.finish]),
                 "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": e2e,
                 "gen_ai.latency.time_in_model_decode": dec, "gen_ai.latency.time_in_model_inference": r.prefill_s + dec}
            name = f" Req {resp_id[9:17]}"
        self._span(fleet, inst.spec.name, {
            **link, "name": name, "kind": 2,
            "startTimeUnixNano": _ns_at(self._epoch, r.t_arrive), "endTimeUnixNano": _ns_at(self._epoch, r.t_end),
            "status": {} if r.status == "ok" else {"code": 2}, "attributes": _attrs(a)})

    def session_done(self, st: _SessState, fleet: Fleet) -> None:
        self._epoch = fleet.spec.start_epoch
        sess = st.sess
        if not st.calls:
            return
        assert st.first_t is not None and st.last_t is not None  # set with the first call
        trace = fleet.trace_id(sess.task_id)
        P = sum(c.req.P for c in st.calls if not c.rejected)
        C = sum(c.req.C for c in st.calls if not c.rejected)
        O = sum(c.req.O for c in st.calls if not c.rejected)  # noqa: E741 - METRICS.md notation
        self._span(fleet, "agent", {
            "traceId": trace, "spanId": fleet.span_id_for(sess.sid), "name": f"invoke_agent {sess.agent_name}",
            "kind": 1, "startTimeUnixNano": _ns_at(self._epoch, st.first_t - 0.001), "endTimeUnixNano": _ns_at(self._epoch, st.last_t + 0.001),
            "status": {}, "attributes": _attrs({
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": sess.agent_name,
                "gen_ai.conversation.id": sess.sid, "app.task.id": sess.task_id, "agentobs.task.type": sess.task_type,
                "agentobs.tenant": sess.tenant, "gen_ai.usage.input_tokens": P,
                "gen_ai.usage.cache_read.input_tokens": C, "gen_ai.usage.output_tokens": O})})
        self._last_calls.append(st.calls[-1])

    # -- ground truth -----------------------------------------------------------------------------------
    def _truth(self, call: Call, fleet: Fleet) -> None:
        r = call.req
        inst: Instance = r.inst
        B = inst.spec.block_size
        prev = call.prev
        T = self.truth
        P = r.P
        reff = min(call.R, ((P - 1) // B) * B) if P > 0 else 0
        dropped = r.finish == "restart"  # a restart dropped it: it measured nothing, its retry recomputes
        C = 0 if call.rejected else r.C
        X = 0 if call.first or call.rejected or dropped else max(0, reff - C)
        kind = "first" if call.first else call.spec.kind
        shared = None
        if prev is not None and not prev.rejected and not call.rejected:
            shared = common_prefix(r.chain, r.nblk, prev.req.chain, prev.req.nblk) * B
        if call.rejected:
            cause = "rejected"
        elif dropped:
            cause = "error"
        elif call.first:
            cause = "prior_hit" if C >= B else "cold"  # blocks the session never stored (a prefix other sessions left)
        elif X == 0:
            cause = "prompt_edit" if kind == "edit" else "hit"
        elif not inst.spec.prefix_caching:  # owns the miss first: routing back here would not have hit either
            cause = "cache_disabled"
        elif prev is not None and not prev.rejected and prev.req.inst is not inst:
            cause = "routed_away"
        elif C == 0:
            cause = "evicted_full"
        else:
            cause = "evicted_partial"
        gap = K = ev = outcome = paid = wasted = when = None
        if prev is not None and not prev.rejected and not call.rejected and not dropped:
            gap = call.t0 - prev.t2
            K = prev.req.P + prev.req.O
            # the window ends with the first eviction of a block c would reuse (a block of prev's that c's prompt no
            # longer has — a re-rendered tail, an edited history, prev's output — costs c nothing when it goes)
            pe = first_reuse_eviction(prev.req, r.chain, reff // B)
            if prev.req.inst is not inst:
                outcome = "routed_away"
            elif not inst.spec.prefix_caching:
                # nothing is cached: the KV is freed when the previous call ends (no rent, nothing kept)
                outcome, when, ev, wasted = "evicted", "idle", prev.t2, 0.0
            elif pe is None or pe >= r.t_arrive:
                outcome = "retained" if pe is None or pe >= (r.t_admit or r.t_arrive) else "evicted"
                when = None if pe is None or pe >= (r.t_admit or r.t_arrive) else "queued"
            else:
                outcome = "evicted"
                when = "idle"
            if outcome == "retained":
                paid = K * gap
            if outcome == "routed_away":
                # the KV stays on the previous replica, unused, until it is evicted there (or the end)
                self._routed.append((len(T["call_id"]), prev))
            elif outcome == "evicted" and not inst.spec.prefix_caching:
                pass
            elif pe is not None and pe < (r.t_admit or r.t_arrive):
                ev = pe
                wasted = K * max(0.0, pe - prev.t2)
        E = fleet.spec.start_epoch
        if ev is not None:
            ev += E
        vals = (call.span_id, call.sess.sid, call.sess.task_id, call.sess.task_type, call.branch, call.attempt,
                inst.spec.name, inst.spec.engine, P, None if call.rejected or dropped else C, r.O, E + call.t0,
                E + call.t2,
                call.first, call.R, reff, X, cause, prev.span_id if prev else None,
                prev.req.inst.spec.name if prev is not None and prev.req.inst is not None else None, gap, K, ev, when,
                outcome, paid, wasted, r.queue_s if r.t_admit is not None else None, r.preempted,
                r.C_host, r.status, call.rejected, kind, shared)
        for k, v in zip(TRUTH_COLUMNS, vals, strict=True):
            T[k].append(v)

    # -- engine telemetry -------------------------------------------------------------------------------
    def kv_flush(self, inst: Instance) -> None:
        evs = inst.kv_events
        if not evs:
            return
        name = inst.spec.name
        f = self._kv.get(name)
        if f is None:
            d = self.dir / "kv_events"
            d.mkdir(exist_ok=True)
            f = self._kv[name] = gzip.GzipFile(d / f"{inst_dir(name)}.jsonl.gz", "wb", 6, mtime=0)
            self._kv_seq[name] = 0
        epoch = self._epoch
        B = inst.spec.block_size
        vllm = inst.spec.engine == "vllm"
        by_t: dict[float, list] = {}
        for t, kind, hashes, medium, parent, session in evs:
            if kind == "BlockStored":
                if vllm:  # vLLM 0.32 map-encoded BlockStored (docs/real-vllm.md §2): fields in declaration
                    # order, defaults omitted, session_id last and absent when the request carried none
                    ev: Any = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                          "token_ids": token_ids(hashes, B), "block_size": B, "lora_id": None, "medium": medium,
                          "lora_name": None, "extra_keys": [None] * len(hashes), "group_idx": 0,
                          "kv_cache_spec_kind": "full_attention"}
                    if session is not None:
                        ev["session_id"] = session
                else:  # SGLang array-like BlockStored (no session id)
                    ev = ["BlockStored", hashes, parent, None, B, None, medium]
                by_t.setdefault(t, []).append(ev)
            elif vllm:  # vLLM publishes one BlockRemoved per evicted block
                by_t.setdefault(t, []).extend(
                    {"type": "BlockRemoved", "block_hashes": [h], "medium": medium, "group_idx": 0} for h in hashes)
            else:
                by_t.setdefault(t, []).append(["BlockRemoved", hashes, medium])
        for t, batch in by_t.items():
            seq = self._kv_seq[name]
            self._kv_seq[name] = seq + 1
            payload = _pack.encode([epoch + t, batch, 0])
            f.write(_json.encode({"instance": name, "seq": seq, "ts_received": round(epoch + t + 0.0005, 6),
                                  "payload_hex": payload.hex()}) + b"\n")
        evs.clear()

    def snapshot(self, fleet: Fleet, t: float) -> None:
        self._epoch = fleet.spec.start_epoch
        n = self._snap_n
        self._snap_n += 1
        if n % self.prom_every:
            return
        ts = fleet.spec.start_epoch + t
        for inst in fleet.instances:
            d = self.dir / "prom" / inst_dir(inst.spec.name)
            d.mkdir(parents=True, exist_ok=True)
            text = promexp.render(inst)
            if self.gzip_prom:
                (d / f"{ts:.3f}.prom.gz").write_bytes(gzip.compress(text, 6, mtime=0))
            else:
                (d / f"{ts:.3f}.prom").write_bytes(text)

    def close(self, fleet: Fleet) -> None:
        self._epoch = fleet.spec.start_epoch
        for res in list(self._buf):
            self._flush_res(res)
        self._otlp.close()
        for f in self._kv.values():
            f.close()
        # abandoned windows: the last call of each session, KV held until evicted (or the end)
        T = self.truth
        idx = {cid: i for i, cid in enumerate(T["call_id"])}
        T["abandoned_evict_s"] = [None] * len(T["call_id"])
        T["abandoned_wasted_tok_s"] = [None] * len(T["call_id"])
        for c in self._last_calls:
            i = idx.get(c.span_id)
            if i is None or c.rejected or c.req.evict_first is None:
                continue
            T["abandoned_evict_s"][i] = fleet.spec.start_epoch + c.req.evict_first
            T["abandoned_wasted_tok_s"][i] = (c.req.P + c.req.O) * max(0.0, c.req.evict_first - c.t2)
        for i, prev in self._routed:
            pe = prev.req.evict_first
            if pe is not None:
                T["evict_s"][i] = fleet.spec.start_epoch + pe
                T["rent_wasted_tok_s"][i] = (prev.req.P + prev.req.O) * max(0.0, pe - prev.t2)
        (self.dir / "truth").mkdir(exist_ok=True)
        tbl = pa.table(T)
        pq.write_table(tbl, self.dir / "truth" / "calls.parquet")
        self._write_server_info(fleet)
        self._manifest(fleet)

    def _write_server_info(self, fleet: Fleet) -> None:
        tpl = json.loads((resources.files("agentobs.sim") / "templates" / "sglang_server_info.json").read_text())
        for inst in fleet.instances:
            if inst.spec.engine != "sglang":
                continue
            sp = inst.spec
            d = copy.deepcopy(tpl)
            host, port = sp.name.rsplit(":", 1)
            over = {
                "model_path": inst.model, "tokenizer_path": inst.model, "served_model_name": inst.model,
                "page_size": sp.block_size, "disable_radix_cache": not sp.prefix_caching,
                "enable_hierarchical_cache": sp.hicache, "hicache_ratio": sp.hicache_ratio,
                "hicache_write_policy": sp.hicache_write_policy, "schedule_policy": sp.schedule_policy,
                "chunked_prefill_size": sp.max_batched_tokens, "max_running_requests": sp.max_num_seqs,
                "enable_cache_report": sp.cache_report, "max_total_num_tokens": inst.capacity_blocks * sp.block_size,
                "host": host, "port": int(port), "api_key": None, "admin_api_key": None, "enable_metrics": True,
            }
            d.update(over)
            for st in d.get("internal_states") or []:
                for k in ("model_path", "tokenizer_path", "served_model_name", "page_size", "disable_radix_cache",
                          "enable_hierarchical_cache", "hicache_ratio", "schedule_policy", "chunked_prefill_size",
                          "max_running_requests", "api_key", "admin_api_key"):
                    if k in st:
                        st[k] = over[k]
                if "memory_usage" in st and isinstance(st["memory_usage"], dict):
                    st["memory_usage"]["token_capacity"] = over["max_total_num_tokens"]
            (self.dir / "server_info").mkdir(exist_ok=True)
            atomic_write(self.dir / "server_info" / f"{inst_dir(sp.name)}.json",
                         json.dumps(d, separators=(",", ":")).encode())

    def _manifest(self, fleet: Fleet) -> None:
        insts = []
        for inst in fleet.instances:
            sp = inst.spec
            n = inst_dir(sp.name)
            insts.append({
                "instance": sp.name, "engine": sp.engine, "preset": sp.preset, "model": inst.model,
                "prom_dir": f"prom/{n}" if (self.dir / "prom" / n).exists() else None,
                "server_info": f"server_info/{n}.json" if sp.engine == "sglang" else None,
                "kv_events": f"kv_events/{n}.jsonl.gz" if (self.dir / "kv_events" / f"{n}.jsonl.gz").exists() else None,
                "config": {"block_size": sp.block_size, "prefix_caching": sp.prefix_caching,
                           "kv_capacity_tokens": inst.capacity_blocks * sp.block_size,
                           "offload_ratio": sp.offload_ratio, "hicache": sp.hicache, "hicache_ratio": sp.hicache_ratio,
                           "schedule_policy": sp.schedule_policy, "max_num_seqs": sp.max_num_seqs,
                           "max_batched_tokens": sp.max_batched_tokens, "usd_per_hour": inst.cost.usd_per_hour,
                           "prefill_tps": inst.cost.prefill_tps},
            })
        server_info_at = fleet.spec.start_epoch
        m = {"format": FORMAT, "workload": self.workload, "seed": self.seed, "router": fleet.spec.router,
             "start_epoch": fleet.spec.start_epoch, "end_epoch": fleet.spec.start_epoch + fleet.now,
             "server_info_at": server_info_at, "calls": fleet.calls_done, "sessions": fleet.sessions_done,
             "otlp": [str(self._otlp_path.relative_to(self.dir))], "instances": insts,
             "truth": "truth/calls.parquet"}
        atomic_write(self.dir / "manifest.json", json.dumps(m, indent=1).encode())


TRUTH_COLUMNS = (
    "call_id", "session_id", "task_id", "task_type", "branch", "attempt", "instance", "engine", "prompt_tokens",
    "cached_tokens", "output_tokens", "start_s", "end_s", "first_call", "reusable_tokens", "reusable_eff_tokens",
    "reprefill_tokens", "cause", "prev_call_id", "prev_instance", "gap_s", "kv_tokens", "evict_s", "evicted_while",
    "window", "rent_paid_tok_s", "rent_wasted_tok_s", "queue_s", "preemptions", "host_hit_tokens", "status",
    "rejected", "prompt_kind", "shared_prev_tokens",
)


def first_reuse_eviction(prev, chain, n: int) -> float | None:
    """When the first of the blocks ``chain[:n]`` (what a call reuses) that ``prev`` held was evicted, or None."""
    log = prev.evict_log
    if not log or n <= 0:
        return None
    runs = chain.runs(0, n)
    for t, a, b in log:
        for lo, hi in runs:
            if a < hi and lo < b:
                return t
    return None


def common_prefix(a, na: int, b, nb: int) -> int:
    """Leading blocks two prompts share: the first ``na`` blocks of chain ``a`` and the first ``nb`` of ``b``."""
    ra, rb = a.runs(0, na), b.runs(0, nb)
    i = j = n = 0
    oa = ob = 0  # offsets into the current runs
    while i < len(ra) and j < len(rb):
        xa, xb = ra[i][0] + oa, rb[j][0] + ob
        if xa != xb:
            break
        step = min(ra[i][1] - xa, rb[j][1] - xb)
        n += step
        oa += step
        ob += step
        if ra[i][0] + oa >= ra[i][1]:
            i, oa = i + 1, 0
        if rb[j][0] + ob >= rb[j][1]:
            j, ob = j + 1, 0
    return n
