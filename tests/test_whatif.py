"""What-if replays (agentobs.findings.whatif): change parsing, resolving changes into a replay fix, and on the sample
fleet (conftest.sample_db, read only) the calibration of the unchanged replay and the one replay path shared with
the findings' recoverable tax."""

from __future__ import annotations

import json

import pytest
from cli_run import run_cli

from agentobs.config import Settings
from agentobs.findings import build as ledger_of
from agentobs.findings.whatif import Change, WhatIfError, quantile, run
from agentobs.source import as_source

V31, V32, S40, S41 = "10.42.7.31:8000", "10.42.7.32:8000", "10.42.7.40:30000", "10.42.7.41:30000"


# -- parsing ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "want"), [
    ("prefix_cache=on", Change("prefix_cache", "on")),
    ("prefix-cache=OFF@10.0.0.1:8000", Change("prefix_cache", "OFF", "10.0.0.1:8000")),
    ("kv_capacity=×2", Change("kv_capacity", "×2")),
    ("kv_capacity=x2", Change("kv_capacity", "x2")),
    ("kv_capacity=1.5x", Change("kv_capacity", "1.5x")),
    ("kv_capacity=600000", Change("kv_capacity", "600000")),
    ("router=session_affinity", Change("router", "session_affinity")),
    ("offload_gib=64@10.0.0.1:8000", Change("offload_gib", "64", "10.0.0.1:8000")),
    ("hicache=on", Change("hicache", "on")),
])
def test_change_parse(text, want):
    assert Change.parse(text) == want


@pytest.mark.parametrize(("text", "says"), [
    ("prefix_cache", "expected KEY=VALUE"),
    ("cache=on", "unknown key 'cache'"),
    ("prefix_cache=maybe", "prefix_cache takes on or off"),
    ("kv_capacity=x0", "kv_capacity takes a factor"),
    ("kv_capacity=-2", "kv_capacity takes a factor"),
    ("router=random", "router takes one of round_robin"),
    ("offload_gib=-1", "offload_gib takes GiB ≥ 0"),
])
def test_change_parse_errors_name_the_change(text, says):
    with pytest.raises(WhatIfError, match=says):
        Change.parse(text)


def test_quantile_is_linear_interpolation():
    # DuckDB quantile_cont: position (n − 1)·q; [1, 2, 3, 10] at 0.5 → between 2 and 3; at 0.99 → 3 + 0.97·7
    assert quantile([3, 1, 10, 2], 0.5) == pytest.approx(2.5)
    assert quantile([3, 1, 10, 2], 0.99) == pytest.approx(9.79)
    assert quantile([], 0.5) is None


# -- the sample fleet -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cache_on(sample_db):
    return run(as_source(str(sample_db)), ["prefix_cache=on"], settings=Settings())


def test_unchanged_replay_is_calibrated(cache_on):
    # the unchanged replay of the 200 sessions against what was observed of the same sessions: computed prefill
    # Σ(P − C) within 5% (measured +2.1%), re-prefill within 5% (+0.4%)
    cal = {(c.scope, c.figure): c for c in cache_on.calibration}
    assert abs(cal["fleet", "computed_tokens"].error) < 0.05
    assert abs(cal["fleet", "reprefill_tokens"].error) < 0.05
    # the TTFT figures are reported with their error (the presets' timing, not the fleet's: looser)
    assert cal["fleet", "ttft_p50_s"].observed > 0 and cal["fleet", "ttft_p50_s"].error is not None
    assert cache_on.sessions_replayed == 200 and cache_on.sessions_total == 753


def test_prefix_cache_on_changes_only_the_cache_off_instance_config(cache_on):
    # .31 (on), .40 and .41 (SGLang radix cache on) are left as configured; only .32 changes
    assert cache_on.label == "prefix caching on"
    f = cache_on.row("fleet")
    s40 = cache_on.row(S40)
    assert s40.before == s40.after  # its pool (the Llama pair) is not touched: the same simulation
    r32 = cache_on.row(V32)
    assert r32.after.reprefill_tokens < 0.2 * r32.before.reprefill_tokens
    assert r32.after.ttft_p50_s < r32.before.ttft_p50_s
    # the fleet row is the sum of its instances (tokens, $); the period is a week (2.3 h ≥ findings_min_window_s)
    insts = [cache_on.row(i) for i in (V31, V32, S40, S41)]
    assert f.before.computed_tokens == pytest.approx(sum(r.before.computed_tokens for r in insts))
    assert f.after.usd == pytest.approx(sum(r.after.usd for r in insts))
    assert cache_on.period == "week"


def test_prefix_cache_on_recovers_what_the_finding_says(sample_db, cache_on):
    # one replay path: the prefix_cache_off finding's simulated saving (recoverable, plus what is over its tax in
    # also_recovers) is the what-if's re-prefill saving on .32, per week
    led = ledger_of(as_source(str(sample_db)), settings=Settings())
    f = led.get(f"prefix_cache_off/instance={V32}")
    assert f.recoverable.method == "simulation (200 sessions replayed)"
    saved = f.recoverable.tokens_week + (f.also_recovers.tokens_week if f.also_recovers else 0.0)
    r = cache_on.row(V32)
    assert r.before.reprefill_tokens - r.after.reprefill_tokens == pytest.approx(saved, rel=1e-9)


def test_scoped_and_engine_specific_changes(sample_db):
    w = run(as_source(str(sample_db)), [f"kv_capacity=x2@{V31}", "hicache=on"], settings=Settings(), sessions=50)
    # HiCache is SGLang's: the vLLM instances are noted, not changed; .41 (HiCache off) gets it, .40 has it
    assert any(n.startswith(f"hicache=on: not applied to {V31} (vllm") for n in w.notes)
    assert w.row(V31).after.reprefill_tokens <= w.row(V31).before.reprefill_tokens
    assert w.row(S41).after.reprefill_tokens < w.row(S41).before.reprefill_tokens
    with pytest.raises(WhatIfError, match="instance 10.9.9.9:1 not replayed"):
        run(as_source(str(sample_db)), ["prefix_cache=on@10.9.9.9:1"], settings=Settings(), sessions=20)


def test_cli_json(sample_db):
    r = run_cli("whatif", "--db", sample_db, "--change", "prefix_cache=on", "--sessions", "30", "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["changes"] == ["prefix_cache=on"] and d["sessions_replayed"] == 30
    assert [x["scope"] for x in d["rows"]] == ["fleet", V31, V32, S40, S41]
    assert {c["figure"] for c in d["calibration"]} == {"computed_tokens", "reprefill_tokens", "ttft_p50_s",
                                                       "ttft_p99_s"}
    bad = run_cli("whatif", "--db", sample_db, "--change", "router=random")
    assert bad.returncode != 0 and "router takes one of" in bad.stderr


def test_console_page_shows_the_same_replay(sample_db, cache_on, monkeypatch, tmp_path):
    from console_checks import df_of, goto
    from streamlit.testing.v1 import AppTest

    from agentobs.console import APP

    monkeypatch.setenv("AGENTOBS_DB", str(sample_db))
    monkeypatch.setenv("AGENTOBS_CONSOLE_QUERIES", str(tmp_path / "q.json"))
    monkeypatch.delenv("AGENTOBS_CONFIG", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    goto(at, "whatif.py", change=["prefix_cache=on"])
    # the page's before → after table is the library's, row for row
    shown = df_of(at)
    want = cache_on.table().to_pylist()
    assert shown["figure"].to_list() == [r["figure"] for r in want]
    assert shown["after"].to_list() == pytest.approx([r["after"] for r in want])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["computed prefill/week"] == f"{cache_on.row('fleet').after.computed_tokens:,.0f}"
    cal = df_of(at, 1)
    assert cal["error"].to_list() == pytest.approx([c.error for c in cache_on.calibration])
