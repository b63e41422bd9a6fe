"""The findings window and what a fix recovers: the week-scaling guard for short windows, the explicit
default window (7 days ending at the newest call), and the recoverable tax by simulator replay with its
fallbacks. Crafted stores through the real import path (test_findings_rules.build); cost basis $1e-6 per
re-prefilled token (usd_per_hour 3.6, prefill 1,000 tokens/s)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_findings_rules import (
    T0,
    USD_PER_TOKEN,
    VL,
    WEEK,
    WINDOW,
    Call,
    Fleet,
    build,
    settings,
    two_turn_sessions,
)

from agentobs.cli import cli
from agentobs.findings import run
from agentobs.findings.context import fmt_duration
from agentobs.source import as_source

OFF = {"enable_prefix_caching": "False"}
FID = f"prefix_cache_off/instance={VL}"


def cache_off_fleet(scraped: bool = True, **kw) -> Fleet:
    """vLLM with prefix caching off; every session's second call recomputes its first prompt: X = R_eff =
    10,000 tokens (P1 = 10,000 is a multiple of 16, P2 − 1 = 11,999 ≥ P1). ``scraped=False``: no engine scrapes,
    the calls alone are what the store observed (the window-length tests)."""
    return Fleet(two_turn_sessions(VL, **kw), vllm={VL: OFF}, scraped=scraped)


def by_id(found):
    return {f.id: f for f in found}


# -- week scaling guard -----------------------------------------------------------------------------------
def test_short_window_reports_the_window_not_a_week(store, tmp_path):
    # 3 sessions starting at 0, 1, 2 s; call 1 lasts 2 s, call 2 starts 4 s after it and lasts 2 s:
    # the last call ends at 2 + 2 + 4 + 2 = 10 s after the first start → a 10 s window, not scaled ×60,480
    build(store, tmp_path, cache_off_fleet(n=3, gap=4.0, start=0.0, scraped=False))
    f = by_id(run(as_source(store[0]), settings=settings(), simulate=False))[FID]
    assert f.tax.period == "window" and f.tax.per == " in the observed window"
    assert f.tax.tokens_week == 3 * 10_000                       # the window's tokens, unscaled
    assert f.tax.usd_week == pytest.approx(3 * 10_000 * USD_PER_TOKEN)
    assert "observed window 10 s, shorter than findings_min_window_s (1.0 h): tax for the observed window, " \
           "not scaled to a week" in f.tax.basis
    assert f.recoverable.period == "window" and f.recoverable.usd_week == pytest.approx(0.03)
    # floors and severity use the rate: $0.03 per 10 s is $1,814/week ≥ findings_high_usd_week ($500)
    assert f.severity == "high"
    assert f.confidence == "low"                                 # 3 calls < findings_min_calls
    assert f.summary.endswith("$0.03 in the observed window")


def test_min_window_setting_moves_the_guard(store, tmp_path):
    build(store, tmp_path, cache_off_fleet(n=3, gap=4.0, start=0.0, scraped=False))
    f = by_id(run(as_source(store[0]), settings=settings(findings_min_window_s=5.0), simulate=False))[FID]
    # 10 s ≥ 5 s: scaled to a week, 604,800 / 10 = ×60,480
    assert f.tax.period == "week"
    assert f.tax.tokens_week == pytest.approx(3 * 10_000 * 60_480)
    assert "observed window 10 s scaled ×60,480.0 to a week" in f.tax.basis


@pytest.mark.parametrize(("seconds", "text"), [(12, "12 s"), (119.4, "119 s"), (120, "2 min"), (3599, "60 min"),
                                               (3600, "1.0 h"), (8280, "2.3 h"), (3 * 86400, "3.0 d")])
def test_duration_text(seconds, text):
    assert fmt_duration(seconds) == text


# -- default window -----------------------------------------------------------------------------------------
def test_default_window_ignores_an_old_stray_call(store, tmp_path):
    # 10 sessions 400 s apart from T0+100 (last call ends at 100 + 3,600 + 2 + 60 + 2 = 3,764 s) and one stray
    # call 30 days earlier on the same instance. Default window: 7 days ending at the newest call's start, so
    # the stray call is out and the observed window is 3,764 − 100 = 3,664 s (≥ 1 h: ×604,800 / 3,664).
    fleet = cache_off_fleet(n=10, stagger=400.0, scraped=False)
    fleet.calls.append(Call("stray", VL, -30 * 86400.0, 2.0, 5000, 0))
    build(store, tmp_path, fleet)
    f = by_id(run(as_source(store[0]), settings=settings(), simulate=False))[FID]
    scale = 604_800 / 3_664
    assert f.tax.period == "week"
    assert f.tax.tokens_week == pytest.approx(10 * 10_000 * scale)
    assert "observed window 1.0 h scaled ×165.1 to a week" in f.tax.basis
    assert dict(f.evidence.params)["since"] == pytest.approx(T0 + 3_700 + 62 - 7 * 86400)  # newest start − 7 d
    # the same as the explicit window from the first session on
    g = by_id(run(as_source(store[0]), since=T0 + 100, settings=settings(), simulate=False))[FID]
    assert g.tax == f.tax
    # a default window long enough to include the stray call stretches the scaling to 30 days + 3,764 s
    h = by_id(run(as_source(store[0]), settings=settings(findings_default_window_s=40 * 86400.0), simulate=False)).get(FID)
    assert h is None  # $0.10 over 30 days is $0.02/week, below findings_min_usd_week


# -- recoverable by simulation ------------------------------------------------------------------------------
def test_recoverable_by_replay_matches_hand_computation(store, tmp_path):
    # Sessions 100 s apart never overlap, and one session (10,000 + 12,000 prompt tokens = 1,375 blocks of 16,
    # plus output blocks) fits the 2,500-block pool: replayed with prefix caching on, every second call finds
    # its 625 prompt blocks (C = 10,000), so X = 0; as configured (off) X = 10,000 each. All 10 sessions are
    # replayed (f = 1): recoverable = 100,000 tokens in the hour → ×168 a week, at $1e-6 per token.
    build(store, tmp_path, cache_off_fleet(n=10, gap=5.0, stagger=100.0))
    f = by_id(run(as_source(store[0]), *WINDOW, settings=settings()))[FID]
    assert f.recoverable.method == "simulation (10 sessions replayed)"
    assert f.recoverable.tokens_week == pytest.approx(100_000 * WEEK)
    assert f.recoverable.usd_week == pytest.approx(100_000 * USD_PER_TOKEN * WEEK)
    assert "10 of 10 sessions (20 calls" in f.recoverable.basis
    assert "with prefix caching on at 10.0.0.1:8000" in f.recoverable.basis
    assert "100.0k → 0 tokens (−100%)" in f.recoverable.basis
    assert f.tax.tokens_week == pytest.approx(100_000 * WEEK)     # the observed tax is unchanged by the replay
    # deterministic: the same findings, replay included, on a second run
    assert run(as_source(store[0]), *WINDOW, settings=settings()) == run(as_source(store[0]), *WINDOW, settings=settings())


def test_replay_bounded_by_the_session_setting(store, tmp_path):
    # 4 of 10 sessions replayed: each session has the same prompt tokens (22,000), so f = 10 / 4 = 2.5 and the
    # scaled recoverable is the same 100,000 tokens
    build(store, tmp_path, cache_off_fleet(n=10, gap=5.0, stagger=100.0))
    f = by_id(run(as_source(store[0]), *WINDOW, settings=settings(findings_sim_sessions=4)))[FID]
    assert f.recoverable.method == "simulation (4 sessions replayed)"
    assert "scaled ×2.50 to the window" in f.recoverable.basis
    assert f.recoverable.tokens_week == pytest.approx(100_000 * WEEK)


def test_without_simulation_the_analytical_estimate_says_so(store, tmp_path):
    build(store, tmp_path, cache_off_fleet(n=10, gap=5.0, stagger=100.0))
    f = by_id(run(as_source(store[0]), *WINDOW, settings=settings(), simulate=False))[FID]
    assert f.recoverable.method == "analytical"
    assert f.recoverable.basis.endswith("simulation skipped (--no-simulate)")
    assert f.recoverable.tokens_week == pytest.approx(100_000 * WEEK)  # every disabled-cache prefix would hit
    g = by_id(run(as_source(store[0]), *WINDOW, settings=settings(findings_sim_sessions=0)))[FID]
    assert g.recoverable.method == "analytical"
    assert g.recoverable.basis.endswith("simulation off (findings_sim_sessions = 0)")


def test_replay_falls_back_when_it_cannot_be_built(store, tmp_path):
    # the routing finding spans two instances; one has no engine config, so its pool cannot be simulated
    vl2 = "10.0.0.9:8000"
    calls = two_turn_sessions(VL, n=10, gap=5.0, stagger=100.0, C2=0, instance2=vl2)
    build(store, tmp_path, Fleet(calls, vllm={VL: {}}))
    f = by_id(run(as_source(store[0]), *WINDOW, settings=settings()))["non_affine_routing/model=Qwen/Qwen3-8B"]
    assert f.recoverable.method == "analytical"
    assert f.recoverable.basis.endswith(f"simulation not used: pool {VL} + {vl2}: instance {vl2} has no known engine "
                                        "config (vllm or sglang) to simulate")


def test_cli_no_simulate(store, tmp_path, db_path):
    build(store, tmp_path, cache_off_fleet(n=10, gap=5.0, stagger=100.0))
    store[1].close()
    store[0].close()
    cfg = tmp_path / "agentobs.toml"
    cfg.write_text("[cost]\nusd_per_hour = 3.6\nprefill_tokens_per_s = 1000.0\ndecode_tokens_per_s = 1000.0\n")
    args = ["findings", "--since", str(WINDOW[0]), "--until", str(WINDOW[1]), "--format", "json",
            "--db", str(db_path), "--config", str(cfg)]
    out = {}
    for extra in ([], ["--no-simulate"]):
        r = CliRunner().invoke(cli, args + extra, catch_exceptions=False)
        assert r.exit_code == 0, r.output
        out[bool(extra)] = {d["id"]: d for d in json.loads(r.stdout)}
    assert out[False][FID]["recoverable"]["method"] == "simulation (10 sessions replayed)"
    assert out[True][FID]["recoverable"]["method"] == "analytical"
    assert out[True][FID]["tax"]["period"] == "week"
