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


def test_a_directory_import_equals_a_full_parse_of_each_snapshot(store, tmp_path):
    """`import_prom` of a target's snapshots parses each series once (promcache.SeriesParser, as the live scraper):
    its rows equal prom.parse_text of every file, and the config is stored when it changes. The input: the first 20
    snapshots of a vLLM and an SGLang target of the sample bundle, plus hand-made ones where series appear and
    vanish, a label value changes, a line carries a timestamp, and the cache config changes (block_size 16 → 32)."""
    import gzip
    import shutil
    from pathlib import Path

    con, w = store
    fleet = Path(__file__).parent.parent / "sample_data" / "fleet" / "prom"
    dirs = {}
    for name, inst in (("10.42.7.31_8000", "10.42.7.31:8000"), ("10.42.7.40_30000", "10.42.7.40:30000")):
        d = tmp_path / name
        d.mkdir()
        for p in sorted((fleet / name).iterdir())[:20]:
            shutil.copyfile(p, d / p.name)
        dirs[inst] = d
    cfg_line = ('vllm:cache_config_info{block_size="%d",enable_prefix_caching="True",num_gpu_blocks="100"} 1.0')
    hand = [
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n" + cfg_line % 16,
        "vllm:num_requests_running{model_name=\"m\"} 4\nvllm:num_requests_waiting{model_name=\"m\"} 1\n" + cfg_line % 16,
        "vllm:num_requests_running{model_name=\"n\"} 5 1790000100000\n" + cfg_line % 32,
        "vllm:num_requests_waiting{model_name=\"m\"} 2\n" + cfg_line % 32,
    ]
    d = tmp_path / "hand"
    d.mkdir()
    for k, text in enumerate(hand):
        (d / f"{1790000000 + 60 * k}.prom").write_text(text + "\n")
    dirs["h:1"] = d
    want_samples, want_cfg = [], []
    for inst, d in dirs.items():
        res = files.import_prom([d], inst, w)
        assert res.rejected == 0 and res.errors == []
        last = None
        for p in sorted(d.iterdir()):
            raw = p.read_bytes()
            text = (gzip.decompress(raw) if p.suffix == ".gz" else raw).decode()
            s = parse_text(text, inst, files.snapshot_time(p, None), str(p), source=f"file:{p.name}")
            want_samples += [tuple(r.values()) for r in s.samples.select(
                ["ts", "instance", "metric", "labels_key", "value", "engine"]).to_pylist()]
            cfg_rows = s.config.select(["key", "value"]).to_pylist()
            if cfg_rows and cfg_rows != last:
                want_cfg += [(inst, r["key"], r["value"]) for r in cfg_rows]
                last = cfg_rows
    got = con.execute("SELECT ts, instance, metric, labels_key, value, engine FROM metric_samples").fetchall()
    assert sorted(got, key=repr) == sorted(want_samples, key=repr) and len(got) > 1000
    got_cfg = con.execute("SELECT instance, key, value FROM engine_config").fetchall()
    assert sorted(got_cfg) == sorted(want_cfg)
    # the hand-made target stored its config three times: block_size 16 (served model m: the first two files
    # carry the same config), 32 with model n, 32 with model m again (the served model is part of the config)
    assert sorted(v for i, k, v in got_cfg if i == "h:1" and k == "block_size") == ["16", "32", "32"]
    assert sorted(v for i, k, v in got_cfg if i == "h:1" and k == "served_model_name") == ["m", "m", "n"]
