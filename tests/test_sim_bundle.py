"""Simulator output through the normal import path, and the metrics against ground truth."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from agentobs.cli import cli
from agentobs.collect.bundle import import_bundle, read_manifest
from agentobs.config import load_settings
from agentobs.errors import InputError
from agentobs.model import connect
from agentobs.sim.run import simulate
from agentobs.sim.scenarios import scenario
from agentobs.store.writer import Writer

SC = replace(scenario("quick"), duration_s=150.0, snapshot_s=15.0)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "bundle"
    simulate(SC, seed=11, out=out)
    return out


@pytest.fixture(scope="module")
def store(bundle, tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("db") / "s.duckdb"
    r = CliRunner().invoke(cli, ["import", "bundle", str(bundle), "--db", str(db)])
    assert r.exit_code == 0, r.output
    return db


def test_manifest_lists_every_output(bundle):
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["format"] == "agentobs-sim-bundle/1" and m["calls"] > 50
    engines = {i["engine"] for i in m["instances"]}
    assert engines == {"vllm", "sglang"}
    for inst in m["instances"]:
        assert (bundle / inst["prom_dir"]).is_dir()
        assert (bundle / inst["kv_events"]).is_file()
        assert (inst["server_info"] is None) == (inst["engine"] == "vllm")


def test_everything_imports_without_rejections(bundle, tmp_path):
    con = connect(tmp_path / "x.duckdb")
    with Writer(con) as w:
        res = import_bundle(bundle, w, load_settings(None))
    for what, r in res.items():
        assert r.rejected == 0 and not r.errors, (what, r.errors[:3])
        assert r.accepted > 0, what
    truth = con.sql(f"SELECT count(*) FROM read_parquet('{bundle}/truth/calls.parquet')").fetchall()[0][0]
    calls = con.sql("SELECT count(*), count(*) FILTER (WHERE source = 'gateway+engine' OR status = 'error') "
                    "FROM llm_calls").fetchall()[0]
    assert calls[0] == truth and calls[1] == truth  # every call joined with its engine span (or rejected)
    # engine config reached instance_config for both engines, with the simulated block size
    cfg = dict(con.sql("SELECT engine, block_size FROM instance_config").fetchall())
    assert cfg == {"vllm": 16, "sglang": 16}
    # vLLM BlockStored carry the session id; SGLang's do not (as the real engines)
    kv = dict(con.sql("SELECT split_part(instance, ':', 2), count(session_id) > 0 FROM kv_events "
                      "WHERE type = 'BlockStored' GROUP BY 1").fetchall())
    assert kv == {"8000": True, "30000": False}


def test_bad_manifests(tmp_path):
    with pytest.raises(InputError, match="no manifest.json: not a simulator bundle"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(InputError, match="manifest.json is not JSON"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "other/2"}')
    with pytest.raises(InputError, match="manifest format is 'other/2'"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "agentobs-sim-bundle/1", "instances": [{}]}')
    with pytest.raises(InputError, match=r"instances\[0\] has no 'instance'"):
        read_manifest(tmp_path)


VALIDATE = """
SELECT
  sum(t.reprefill_tokens) FILTER (WHERE NOT t.first_call)       AS true_x,
  sum(r.reprefill_tokens) FILTER (WHERE NOT t.first_call)       AS metric_x,
  avg(CASE WHEN coalesce(r.miss_cause, 'hit') = t.cause THEN 1.0 ELSE 0.0 END)
      FILTER (WHERE t.reprefill_tokens > 0 OR r.reprefill_tokens > 0)   AS cause_agree,
  count(*) FILTER (WHERE t.reprefill_tokens > 0 OR r.reprefill_tokens > 0) AS misses,
  sum(coalesce(t.rent_paid_tok_s, 0) + coalesce(t.rent_wasted_tok_s, 0)) FILTER (WHERE t.window IN ('retained', 'evicted')) AS true_rent,
  sum(coalesce(r.rent_paid_token_s, 0) + coalesce(r.rent_wasted_token_s, 0)) FILTER (WHERE t.window IN ('retained', 'evicted')) AS metric_rent
FROM truth t JOIN call_reuse r USING (call_id)
-- The first call of a parallel branch is left out: METRICS.md defines prev(c) within a branch and
-- says nothing for a branch's first call; the simulator's truth uses the fork point, call_reuse the
-- session's latest earlier call (possibly a sibling branch). See docs/simulator.md.
WHERE NOT t.branch_first
"""


def _validate(db: Path, bundle: Path):
    con = duckdb.connect(str(db), read_only=True)
    con.execute(f"""CREATE TEMP VIEW truth AS
        SELECT *, branch <> 'main' AND row_number() OVER (PARTITION BY session_id, branch ORDER BY start_s) = 1
                  AS branch_first
        FROM read_parquet('{bundle}/truth/calls.parquet')""")
    return con.sql(VALIDATE).fetchall()[0]


def test_metrics_match_ground_truth(store, bundle):
    true_x, metric_x, agree, misses, true_rent, metric_rent = _validate(store, bundle)
    assert true_x > 0 and misses > 20  # round robin over 2 replicas: plenty of routed-away misses
    assert metric_x == pytest.approx(true_x, rel=0.01)
    assert agree >= 0.95
    assert metric_rent == pytest.approx(true_rent, rel=0.02)


def test_estimate_mode_without_kv_events(bundle, tmp_path, capsys):
    """Without KV events the metric falls back to the append-only estimate; its error is reported,
    not asserted tight (docs/simulator.md lists the figure)."""
    m = json.loads((bundle / "manifest.json").read_text())
    for inst in m["instances"]:
        inst["kv_events"] = None
    nokv = tmp_path / "nokv"
    nokv.mkdir()
    for p in bundle.iterdir():
        (nokv / p.name).symlink_to(p)
    (nokv / "manifest.json").unlink()
    (nokv / "manifest.json").write_text(json.dumps(m))
    db = tmp_path / "e.duckdb"
    con = connect(db)
    with Writer(con) as w:
        import_bundle(nokv, w, load_settings(None))
    con.close()
    true_x, metric_x, agree, misses, true_rent, metric_rent = _validate(db, bundle)
    with capsys.disabled():
        print(f"\n[estimate mode] re-prefill error {metric_x / true_x - 1:+.2%}, cause agreement {agree:.1%}, "
              f"rent (retained+evicted windows) metric/true = {metric_rent / true_rent:.3f}")
    assert metric_x == pytest.approx(true_x, rel=0.10)


def _kv_events(bundle: Path, engine: str = "vllm"):
    """(session_id key present?, event) for every event of the bundle's replicas of ``engine``."""
    import gzip

    import msgspec

    m = read_manifest(bundle)
    out = []
    for inst in m["instances"]:
        if inst["engine"] != engine or not inst["kv_events"]:
            continue
        for line in gzip.open(bundle / inst["kv_events"]):
            rec = json.loads(line)
            out.extend(msgspec.msgpack.decode(bytes.fromhex(rec["payload_hex"]))[1])
    return out


# behind a LiteLLM-like gateway (no traceparent), half the sessions send session_id, a tight vLLM pool
LITELLM_LIKE = replace(SC, duration_s=150.0, snapshot_s=0.0, session_id_share=0.5, traceparent=False,
                       instances=(replace(SC.instances[0], kv_capacity_tokens=40_000), *SC.instances[1:]))


@pytest.fixture(scope="module")
def bundle_nolink(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "nolink"
    simulate(LITELLM_LIKE, seed=11, out=out)
    return out


def test_vllm_kv_events_have_the_real_032_shape(bundle, bundle_nolink):
    # docs/real-vllm.md §2: one hash per BlockRemoved; BlockStored carries token_ids (block_size per
    # block), extra_keys (one null per block), no num_tokens, and session_id as the last key.
    removed = [e for e in _kv_events(bundle_nolink) if e["type"] == "BlockRemoved"]  # a tight vLLM pool
    stored = [e for e in _kv_events(bundle) if e["type"] == "BlockStored"]
    assert len(removed) > 100 and stored
    assert {len(e["block_hashes"]) for e in removed} == {1}
    assert all(list(e) == ["type", "block_hashes", "medium", "group_idx"] for e in removed)
    for e in stored:
        n = len(e["block_hashes"])
        assert len(e["token_ids"]) == n * e["block_size"] == n * 16
        assert e["extra_keys"] == [None] * n
        assert "num_tokens" not in e
        assert list(e)[-1] == "session_id"   # the quick scenario: every request carries its session


def test_session_id_on_kv_events_only_for_sessions_that_send_it(bundle_nolink):
    from agentobs.sim.run import build_workload
    from agentobs.sim.workload import IdAlloc

    sessions = build_workload(LITELLM_LIKE, 11, IdAlloc(1))
    sends = {s.sid for s in sessions if s.engine_session}
    assert 0 < len(sends) < len(sessions)     # a share of 0.5: some do, some do not
    stored = [e for e in _kv_events(bundle_nolink) if e["type"] == "BlockStored"]
    seen = {e["session_id"] for e in stored if "session_id" in e}
    assert seen and seen <= sends
    assert any("session_id" not in e for e in stored)  # absent, not null, when the request had none
    assert all(e.get("session_id", "x") is not None for e in stored)


def test_engine_spans_without_traceparent_join_by_response_id(bundle_nolink, tmp_path):
    # LiteLLM does not forward traceparent: the engine span starts its own trace with no parent; the
    # model still joins it to the gateway span through gen_ai.request.id = the gateway's response id.
    db = tmp_path / "n.duckdb"
    r = CliRunner().invoke(cli, ["import", "bundle", str(bundle_nolink), "--db", str(db)])
    assert r.exit_code == 0, r.output
    con = duckdb.connect(str(db), read_only=True)
    eng = con.sql("SELECT count(*), count(parent_span_id), "
                  "count(*) FILTER (WHERE trace_id IN (SELECT trace_id FROM spans WHERE role = 'gateway')) "
                  "FROM spans WHERE role = 'engine'").fetchall()[0]
    assert eng[0] > 20 and eng[1] == 0 and eng[2] == 0
    by_src = dict(con.sql("SELECT source, count(*) FROM llm_calls GROUP BY ALL").fetchall())
    # every call the engine served is joined; only 503 rejections (no engine span) stay gateway-only
    rejected = con.sql(f"SELECT count(*) FROM read_parquet('{bundle_nolink}/truth/calls.parquet') "
                       "WHERE rejected").fetchall()[0][0]
    assert by_src.get("gateway+engine") == eng[0] and by_src.get("gateway", 0) == rejected
    assert "engine" not in by_src
