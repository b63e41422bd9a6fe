"""Prometheus text and SGLang /server_info → metric samples and the normalized instance config."""

from __future__ import annotations

import json

from agentobs.collect import files
from agentobs.collect.prom import canonical_name, parse_text


def cfg(con, instance):
    cur = con.execute("SELECT * FROM instance_config WHERE instance = ?", [instance])
    return dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))


def test_vllm_cache_config_info(store, fixtures):
    con, w = store
    res = files.import_prom([fixtures / "vllm" / "metrics_sample.txt"], "10.42.7.31:8000", w, at=1791969725.0)
    assert res.rejected == 0
    c = cfg(con, "10.42.7.31:8000")
    assert c["engine"] == "vllm"
    assert c["block_size"] == 16
    # num_gpu_blocks="18826" × block_size 16 = 301,216 tokens of KV capacity
    assert c["kv_capacity_tokens"] == 18826 * 16
    assert c["prefix_caching"] is True
    # kv_offloading_size="None" and num_cpu_blocks="None": no offloading
    assert c["kv_offloading"] is False
    # cache_config_info names no model: the served model comes from the model_name label of the vLLM series
    assert c["model"] == "Qwen/Qwen3-32B"
    # counters keep their names; *_created samples are dropped but the fleet hit rate's (prom.KEPT_CREATED)
    hits = con.execute("""SELECT value FROM metric_samples WHERE metric = 'vllm:prefix_cache_hits_total'""").fetchall()
    assert len(hits) == 1 and hits[0][0] > 0
    assert con.execute("SELECT metric, value FROM metric_samples WHERE metric LIKE '%_created' ORDER BY 1").fetchall() \
        == [("vllm:prefix_cache_hits_created", 1786526014.6121852),   # the fixture's values, unix seconds
            ("vllm:prefix_cache_queries_created", 1786526014.6113415)]


def test_sglang_server_info_and_metrics(store, fixtures, tmp_path):
    con, w = store
    info = json.loads((fixtures / "sglang" / "server_info.json").read_text())
    info["api_key"] = "sk-live-very-secret"
    info["internal_states"][0]["hf_token"] = "hf_also-secret"  # only in internal_states
    p = tmp_path / "si.json"
    p.write_text(json.dumps(info))
    files.import_server_info(p, "10.42.7.40:30000", w, at=1791969725.0)
    files.import_prom([fixtures / "sglang" / "metrics_sample.txt"], "10.42.7.40:30000", w, at=1791969725.0)
    c = cfg(con, "10.42.7.40:30000")
    assert c["engine"] == "sglang"
    assert c["block_size"] == 1  # page_size
    assert c["kv_capacity_tokens"] == 427051  # max_total_num_tokens from internal_states[0]
    assert c["prefix_caching"] is True  # disable_radix_cache=false
    assert c["hicache"] is False  # enable_hierarchical_cache=false (the default)
    assert c["schedule_policy"] == "fcfs"
    assert c["cache_report"] is False
    stored = dict(con.execute("SELECT key, value FROM engine_config WHERE key IN ('api_key', 'hf_token', 'admin_api_key')").fetchall())
    # secrets with a value are redacted; an unset secret stays visibly unset
    assert stored == {"api_key": "<redacted>", "hf_token": "<redacted>", "admin_api_key": "null"}
    assert not con.execute("SELECT count(*) FROM engine_config WHERE value LIKE '%secret%'").fetchone()[0]
    n = con.execute("SELECT count(*) FROM metric_samples WHERE metric = 'sglang:cached_tokens_total'").fetchone()[0]
    assert n >= 1


def test_prometheus3_escaped_names_map_to_colon_form():
    text = "# TYPE sglang_cached_tokens_total counter\nsglang_cached_tokens_total{model_name=\"m\"} 42\n"
    s = parse_text(text, "i:1", 1791969725.0)
    assert s.samples.column("metric").to_pylist() == ["sglang:cached_tokens_total"]
    assert s.engine == "sglang"
    assert canonical_name("vllm_num_requests_running") == "vllm:num_requests_running"
    assert canonical_name("process_cpu_seconds_total") == "process_cpu_seconds_total"


def test_directory_of_timestamped_snapshots(store, fixtures, tmp_path):
    con, w = store
    text = (fixtures / "vllm" / "metrics_sample.txt").read_text()
    d = tmp_path / "snaps"
    d.mkdir()
    (d / "1791969725.prom").write_text(text)
    (d / "1791969730.prom").write_text(text.replace('vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-32B"} 3.0',
                                                    'vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-32B"} 5.0'))
    res = files.import_prom([d], "i:8000", w)
    assert res.files == 2 and res.rejected == 0
    vals = con.execute("""SELECT epoch(ts)::BIGINT, value FROM metric_samples
                          WHERE metric = 'vllm:num_requests_running' ORDER BY ts""").fetchall()
    assert vals == [(1791969725, 3.0), (1791969730, 5.0)]
    # config unchanged between the two snapshots: stored once
    assert con.execute("SELECT count(DISTINCT ts) FROM engine_config").fetchone()[0] == 1
