"""Findings on sample_data/fleet (the simulator bundle `agentobs demo` loads): the planted problems are found,
with $ in the range the simulator's ground truth (truth/calls.parquet) implies.

The store is the session's shared import of the bundle (conftest.sample_db, read only). Expected tax of a
finding = the true re-prefill tokens of its cause on its instances (truth ``cause``, ``reprefill_tokens``) × the
same cost basis the findings use (the metric run's ``m_cost``: $/s ÷ prefill tokens/s per instance) × 604,800 ÷
the true window (first call start to last call end).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from agentobs.config import Settings
from agentobs.findings import run
from agentobs.findings.context import Context
from agentobs.findings.replay import build as build_replay
from agentobs.metrics import prepare
from agentobs.source import as_source

BUNDLE = Path(__file__).parent.parent / "sample_data" / "fleet"
TRUTH = str(BUNDLE / "truth" / "calls.parquet")
QWEN, LLAMA = "Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct"
V31, V32, S40, S41 = "10.42.7.31:8000", "10.42.7.32:8000", "10.42.7.40:30000", "10.42.7.41:30000"

pytestmark = pytest.mark.skipif(not (BUNDLE / "manifest.json").exists(), reason="sample_data/fleet not in this checkout")


@pytest.fixture(scope="module")
def db(sample_db) -> Path:
    return sample_db


@pytest.fixture(scope="module")
def found(db):
    return {f.id: f for f in run(as_source(str(db)), settings=Settings())}


@pytest.fixture(scope="module")
def truth():
    con = duckdb.connect()
    x = {(i, c): t for i, c, t in con.sql(
        f"SELECT instance, cause, sum(reprefill_tokens) FROM read_parquet('{TRUTH}') GROUP BY ALL").fetchall()}
    window = con.sql(f"SELECT max(end_s) - min(start_s) FROM read_parquet('{TRUTH}')").fetchall()[0][0]
    return x, window


@pytest.fixture(scope="module")
def mrun(db):
    """One metric run over the whole store (the findings' own preparation, agentobs.metrics.prepare)."""
    mrun, close = prepare(as_source(str(db)), settings=Settings())
    yield mrun
    close()


@pytest.fixture(scope="module")
def cost(mrun):
    return {r["instance"]: r["usd_per_s"] / r["prefill_tps"] for r in mrun.table("m_cost").to_dicts()}


def expected_usd_week(truth, cost, instances, causes):
    x, window = truth
    return sum(x.get((i, c), 0) * cost[i] for i in instances for c in causes) * 604_800 / window


def test_the_planted_problems_are_found(found):
    assert {f"prefix_cache_off/instance={V32}", f"hicache_off/instance={S41}",
            f"non_affine_routing/model={LLAMA}"} <= set(found)
    # Qwen is round-robined too, between .31 and the cache-off .32: its turns that land on .32 are cache_disabled
    # (owned by prefix_cache_off), and the routed_away ones (.32 → .31) are 2.5M of its 62.4M reusable tokens
    # (4%), under findings_routed_away_share (10%): the fix for Qwen is the cache, not the router
    assert f"non_affine_routing/model={QWEN}" not in found
    # and not where the config is healthy: prefix caching on at .31, HiCache on at .40; retention is not
    # suggested for the cache-off replica (it retains nothing)
    assert not {f"prefix_cache_off/instance={V31}", f"hicache_off/instance={S40}",
                f"retention_vs_recompute/instance={V32}"} & set(found)


@pytest.mark.parametrize(("fid", "instances", "causes", "tol"), [
    # re-prefill by cause: the metrics agree with the truth on every miss's cause and on ΣX outside branches' first
    # calls (docs/simulator.md); per cause a handful of calls move (e.g. 843 cache_disabled calls found vs 844 true).
    (f"prefix_cache_off/instance={V32}", [V32], ["cache_disabled"], 0.02),
    (f"non_affine_routing/model={LLAMA}", [S40, S41], ["routed_away"], 0.02),
    # 61 true evicted misses on .41 (749k tokens): one call more or less (~12k tokens) is 1.6%
    (f"hicache_off/instance={S41}", [S41], ["evicted_full", "evicted_partial"], 0.05),
])
def test_tax_matches_ground_truth(found, truth, cost, fid, instances, causes, tol):
    f = found[fid]
    assert f.tax.period == "week"  # 2.3 h ≥ findings_min_window_s
    assert f.tax.usd_week == pytest.approx(expected_usd_week(truth, cost, instances, causes), rel=tol)


def test_recoverable_by_simulation(found, truth, cost):
    for fid in (f"prefix_cache_off/instance={V32}", f"hicache_off/instance={S41}",
                f"non_affine_routing/model={LLAMA}"):
        rec = found[fid].recoverable
        assert rec.method == "simulation (200 sessions replayed)", fid
        assert "200 of 753 sessions" in rec.basis and rec.usd_week > 0, fid
        assert rec.usd_week <= found[fid].tax.usd_week, fid  # never above the finding's own tax
    # .31 and .32 are twins (same preset, same share of the Qwen sessions' round-robin traffic) but for prefix
    # caching, so turning it on at .32 should bring its true re-prefill down to .31's: the saving is X(.32) − X(.31)
    # (all causes). .32's whole re-prefill is its cache_disabled tax (that cause comes first), so the saving is
    # below the tax here: 29,244,224 of 31,828,656 tokens, 92%. 25%: a 200-session slice is replayed.
    x, _ = truth
    total = {i: sum(t for (j, _c), t in x.items() if j == i) for i in (V31, V32)}
    assert x.get((V32, "routed_away"), 0) == 0  # the truth uses the same cause order
    want = expected_usd_week(truth, cost, [V32], ["cache_disabled"]) - \
        expected_usd_week(truth, cost, [V31], ["routed_away", "evicted_partial"])
    assert total[V32] - total[V31] == pytest.approx(29_244_224, rel=1e-6)  # 31,828,656 − 2,584,432 tokens
    f = found[f"prefix_cache_off/instance={V32}"]
    assert f.recoverable.usd_week == pytest.approx(want, rel=0.25)
    assert f.recoverable.usd_week > 0.6 * f.tax.usd_week


def test_replay_as_configured_reproduces_the_true_reprefill(mrun, truth):
    # the replay of 200 of 753 sessions (as configured: round robin, .32 cache off, .41 HiCache off), scaled to
    # the window by prompt tokens, against the true re-prefill per instance (all causes): within 20%
    x, _ = truth
    ctx = Context(mrun.cur, Settings(), None, None)
    replay = build_replay(ctx, 200, 1)
    # a session keeps its model: one pool per model, the model's two replicas
    assert [p.instances for p in replay.pools] == [[V31, V32], [S40, S41]]
    for pool in replay.pools:
        assert pool.router == "round_robin"
        assert pool.changed_share == pytest.approx(0.5, abs=0.02)  # round robin over 2 replicas: 1 in 2 moves
        base = replay.reprefill(pool)
        for inst in pool.instances:
            true = sum(t for (j, _c), t in x.items() if j == inst)
            assert base[inst] * pool.scale == pytest.approx(true, rel=0.2), inst
