"""Prometheus exposition of a simulated engine, rendered by prometheus_client itself.

A custom collector turns an instance's counters and histograms (engine.Stats) into metric
families with the real vLLM / SGLang names, labels and bucket boundaries (reference/vllm.md,
reference/sglang.md, tests/fixtures), and ``generate_latest`` writes the text, so the format is the
library's own. Only engine families are rendered (no process/python/http families): the committed
sample stays small.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .engine import Hist, Instance


def _hist(name: str, doc: str, h: Hist, labels: dict[str, str]) -> HistogramMetricFamily:
    f = HistogramMetricFamily(name, doc, labels=list(labels))
    cum, buckets = 0, []
    for b, c in zip(h.bounds, h.counts, strict=False):
        cum += c
        buckets.append((repr(float(b)), cum))
    buckets.append(("+Inf", h.count))
    f.add_metric(list(labels.values()), buckets, h.sum)
    return f


def _counter(name: str, doc: str, labels: dict[str, str], series: Sequence[tuple[dict[str, str], float]]):
    keys = list(labels) + (list(series[0][0]) if series else [])
    f = CounterMetricFamily(name, doc, labels=keys)
    for extra, v in series:
        f.add_metric(list(labels.values()) + list(extra.values()), v)
    return f


def _gauge(name: str, doc: str, labels: dict[str, str], v: float) -> GaugeMetricFamily:
    f = GaugeMetricFamily(name, doc, labels=list(labels))
    f.add_metric(list(labels.values()), v)
    return f


class EngineCollector:
    def __init__(self, inst: Instance):
        self.inst = inst

    def collect(self):
        return vllm_families(self.inst) if self.inst.spec.engine == "vllm" else sglang_families(self.inst)


def vllm_config_labels(inst: Instance) -> dict[str, str]:
    sp = inst.spec
    offload = sp.offload_ratio > 0
    return {
        "_block_size_resolved": "True", "block_size": str(sp.block_size), "cache_dtype": "auto",
        "calculate_kv_scales": "False", "enable_prefix_caching": str(sp.prefix_caching), "engine": "0",
        "gpu_memory_utilization": "0.9", "hash_block_size": "None", "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]", "kv_cache_memory_bytes": "None",
        "kv_offloading_backend": "native",
        "kv_offloading_size": str(round(inst.cache.host_capacity * sp.block_size * inst.cost.kv_bytes_per_token / 2**30, 1)) if offload else "None",
        "kv_sharing_fast_prefill": "False", "mamba_block_size": "None", "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none", "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": str(inst.cache.host_capacity) if offload else "None",
        "num_gpu_blocks": str(inst.capacity_blocks), "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256", "sliding_window": "None", "user_specified_block_size": "False",
        "user_specified_mamba_block_size": "False",
    }


def vllm_families(inst: Instance):
    s = inst.s
    L = {"engine": "0", "model_name": inst.model}
    cache = inst.cache
    yield _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", L, len(inst.running))
    yield _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", L, len(inst.waiting))
    yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", L,
                 (cache.used - cache.evictable()) / max(1, cache.capacity))
    yield _counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", L,
                   [({}, s.prompt_tokens)])
    yield _counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", L,
                   [({}, s.cached_gpu)])
    yield _counter("vllm:external_prefix_cache_queries",
                   "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
                   L, [({}, s.prompt_tokens - s.cached_gpu if inst.cache.host_capacity else 0)])
    yield _counter("vllm:external_prefix_cache_hits",
                   "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
                   L, [({}, s.cached_host)])
    yield _counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", L, [({}, s.preemptions)])
    yield _counter("vllm:prompt_tokens", "Number of prefill tokens processed.", L, [({}, s.prompt_tokens)])
    yield _counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", L, [
        ({"source": "local_compute"}, s.computed_tokens), ({"source": "local_cache_hit"}, s.cached_gpu),
        ({"source": "external_kv_transfer"}, s.cached_host)])
    yield _counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", L,
                   [({}, s.cached_gpu + s.cached_host)])
    yield _counter("vllm:generation_tokens", "Number of generation tokens processed.", L, [({}, s.generation_tokens)])
    yield _counter("vllm:request_success", "Count of successfully processed requests.", L, [
        ({"finished_reason": k}, s.requests.get(k, 0)) for k in ("stop", "length", "abort", "error", "repetition")])
    yield _hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", s.prompt_h, L)
    yield _hist("vllm:request_generation_tokens", "Number of generation tokens processed.", s.gen_h, L)
    yield _hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", s.iter_tokens, L)
    yield _hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft, L)
    yield _hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl, L)
    yield _hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.e2e, L)
    yield _hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", s.queue, L)
    yield _hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
                s.inference, L)
    yield _hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                s.prefill_h, L)
    yield _hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                s.decode_h, L)
    f = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                          labels=list(vllm_config_labels(inst)))
    f.add_metric(list(vllm_config_labels(inst).values()), 1.0)
    yield f
    if inst.spec.process_metrics:  # single-process mode: prometheus_client's process collector (one family here)
        yield GaugeMetricFamily("process_start_time_seconds",
                                "Start time of the process since unix epoch in seconds.", value=inst.epoch + inst.started_s)


def sglang_families(inst: Instance):
    s = inst.s
    model = inst.model
    G = {"engine_type": "unified", "model_name": model, "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
    T = {"engine_type": "unified", "model_name": model}
    cache = inst.cache
    B = inst.spec.block_size
    cap_tokens = inst.capacity_blocks * B
    used = (cache.used - cache.evictable()) * B
    evictable = cache.evictable() * B
    yield _gauge("sglang:num_running_reqs", "The number of running requests.", G, len(inst.running))
    yield _gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", G, len(inst.waiting))
    yield _gauge("sglang:token_usage", "The token usage.", G, round(used / max(1, cap_tokens), 2))
    yield _gauge("sglang:kv_used_tokens", "KV tokens in use by running requests.", G, used)
    yield _gauge("sglang:kv_evictable_tokens", "KV tokens held by the prefix cache that can be evicted.", G, evictable)
    yield _gauge("sglang:kv_available_tokens", "KV tokens free or evictable.", G, cap_tokens - used)
    yield _gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", G, cap_tokens)
    yield _gauge("sglang:page_size", "KV cache page size.", G, B)
    yield _counter("sglang:prompt_tokens", "Number of prefill tokens processed.", T,
                   [({"is_streaming": "true"}, s.prompt_tokens)])
    yield _counter("sglang:generation_tokens", "Number of generation tokens processed.", T,
                   [({"is_streaming": "true"}, s.generation_tokens)])
    yield _counter("sglang:num_requests", "Number of requests processed.", T,
                   [({"is_streaming": "true"}, sum(s.requests.values()))])
    series = [({"cache_source": "device"}, s.cached_gpu)]
    if inst.spec.hicache:
        series.append(({"cache_source": "host"}, s.cached_host))
    yield _counter("sglang:cached_tokens", "Number of cached prompt tokens.", T, series)
    yield _counter("sglang:evicted_tokens", "Number of tokens evicted from the KV cache.", {},
                   [({"cache_type": "HiRadixCache" if inst.spec.hicache else "RadixCache"}, cache.evicted_blocks * B)])
    yield _counter("sglang:num_retracted_requests", "Number of retracted requests.", G, [({}, s.preemptions)])
    yield _counter("sglang:num_aborted_requests", "Number of requests aborted.", T, [({}, s.requests.get("abort", 0))])
    yield _hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft,
                {**T, "is_streaming": "true"})
    yield _hist("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl, T)
    yield _hist("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", s.e2e,
                {**T, "is_streaming": "true"})
    yield _hist("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", s.queue, G)


def render(inst: Instance) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(EngineCollector(inst))
    return generate_latest(reg)
