"""The recompute-tax ledger (agentobs.findings.ledger): its invariants on hand-built stores and on the sample fleet,
and the same numbers on every surface (CLI, report, exporter; the console's browser test reads the Overview).

Hand-built stores reuse test_findings_rules' import path and cost basis: a re-prefilled token costs $1e-6, a
one-hour window scales ×168 to a week.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_findings_rules import SG, VL, WEEK, WINDOW, Fleet, build, settings, two_turn_sessions

from agentobs.cli import cli
from agentobs.config import Settings
from agentobs.findings import build as ledger_of
from agentobs.findings.finding import Finding, Scope, Tax
from agentobs.findings.ledger import _cap, order_key
from agentobs.source import as_source


# -- ownership on hand-built stores ------------------------------------------------------------------------------
def test_overlapping_rules_share_the_evicted_calls_without_counting_twice(store, tmp_path):
    # SGLang, FCFS, no HiCache. 10 sessions; follow-ups start at 162 … 171 s, each a full miss of R_eff = 10,000.
    # The queue gauge reads 5 from 150 s and 0 from 166.5 s: the follow-ups at 162–166 s were queued (5 calls,
    # 50,000 tokens), those at 167–171 s not. Both rules claim the queued ones; sglang_fcfs comes first in the
    # ledger, so it owns 50,000 and hicache_off the other 50,000 — together the 100,000 of the fleet, not 150,000.
    q = [(0.0, 0.0), (150.0, 5.0), (166.5, 0.0)]
    build(store, tmp_path, Fleet(two_turn_sessions(SG), sglang={SG: {}}, queue={SG: q}))
    led = ledger_of(as_source(store[0]), since=WINDOW[0], until=WINDOW[1], settings=settings(), simulate=False)
    by = {f.rule: f for f in led.findings}
    assert by["sglang_fcfs"].tax.tokens_window == 50_000 and by["sglang_fcfs"].sessions == 5
    assert by["hicache_off"].tax.tokens_window == 50_000 and by["hicache_off"].sessions == 5
    # hicache_off's own evidence still shows every evicted miss it saw (100,000); its tax says it shares them
    assert dict(by["hicache_off"].evidence.numbers)["reprefill_tokens"] == 100_000
    assert "belongs to a finding listed before it" in by["hicache_off"].tax.basis
    assert led.tokens_window == 100_000
    assert led.owned("reprefill") == pytest.approx((100_000 * WEEK, 100_000 * 1e-6 * WEEK))
    assert led.unattributed_usd_week == pytest.approx(0.0, abs=1e-12)
    # the sessions each owns: disjoint, 5 + 5 of the 10
    a = {x.session_id for x in led.affected[by["sglang_fcfs"].id]}
    b = {x.session_id for x in led.affected[by["hicache_off"].id]}
    assert len(a) == 5 and len(b) == 5 and not a & b
    # analytical recoverable is the owned tax, never the rule's own larger figure
    assert by["hicache_off"].recoverable.tokens_week == pytest.approx(50_000 * WEEK)


def test_a_cache_off_instance_owns_its_routed_turns(store, tmp_path):
    # Round robin between VL (prefix caching on) and VL2 (off): each session's cold call on VL, its follow-up on
    # the cache-off VL2. Every follow-up is routed away *and* lands on a cache that keeps nothing: the miss is
    # cache_disabled (routing it home would not have helped the off replica), so prefix_cache_off owns all
    # 10 × 10,000 tokens and non_affine_routing none.
    from test_findings_rules import VL2

    calls = two_turn_sessions(VL, instance2=VL2)
    build(store, tmp_path, Fleet(calls, vllm={VL: {}, VL2: {"enable_prefix_caching": "False"}}))
    led = ledger_of(as_source(store[0]), since=WINDOW[0], until=WINDOW[1], settings=settings(), simulate=False)
    by = {f.rule: f for f in led.findings}
    assert by["prefix_cache_off"].tax.tokens_window == 100_000 and by["prefix_cache_off"].sessions == 10
    assert "non_affine_routing" not in by
    assert [c.cause for c in led.by_cause] == ["cache_disabled"]


def test_recoverable_above_the_tax_is_capped_and_the_rest_named():
    # a simulated saving of $30 against a $20 tax: recoverable $20, also_recovers $10 (both × the week scale)
    class Ctx:
        tax_scale, window_s = 168.0, 3600.0

    def tax(tok, usd, method="observed"):
        return Tax(tok * 168.0, usd * 168.0, "b", method, "week", tok, usd, 3600.0, 168.0)

    f = Finding("prefix_cache_off", "t", "low", Scope(instance="i"), None, tax(2e7, 20.0),
                tax(3e7, 30.0, "simulation (10 sessions replayed)"), "high", "fix")
    g = _cap(f, Ctx())
    assert g.recoverable.usd_window == 20.0 and g.recoverable.usd_week == 20.0 * 168
    assert g.recoverable.tokens_window == 2e7
    assert g.also_recovers.usd_window == 10.0 and g.also_recovers.usd_week == 10.0 * 168
    assert g.also_recovers.tokens_window == 1e7


def test_unpriced_findings_come_last_and_are_info():
    def f(rule, usd, sev):
        t = Tax(None if usd is None else usd, usd, "b")
        return Finding(rule, "t", sev, Scope(instance=rule), None, t, t, "high", "fix")

    fs = [f("a", None, "info"), f("b", 10.0, "low"), f("c", 600.0, "high"), f("d", 10.0, "low")]
    assert [x.rule for x in sorted(fs, key=order_key)] == ["c", "b", "d", "a"]


# -- invariants on the sample fleet -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sample_ledger(sample_db):
    return ledger_of(as_source(str(sample_db)), settings=Settings())


@pytest.fixture(scope="module")
def sample_ledger_unsimulated(sample_db):
    """The whole sample's ledger without the replay (its first and last call times bound the tests' periods)."""
    return ledger_of(as_source(str(sample_db)), settings=Settings(), simulate=False)


def test_sample_invariants(sample_ledger, sample_db):
    led = sample_ledger
    assert led.findings, "the sample fleet has planted problems"
    s = Settings()
    for f in led.findings:
        t, r = f.tax, f.recoverable
        if t.usd_week is not None and r.usd_week is not None:
            assert r.usd_week <= t.usd_week * (1 + 1e-12), f.id
        if t.tokens_week is not None and r.tokens_week is not None:
            assert r.tokens_week <= t.tokens_week * (1 + 1e-12), f.id
        # one severity rule: the weekly rate against the thresholds; unpriced → info
        rate = t.usd_week if t.period == "week" else None
        want = ("info" if t.usd_week is None else "high" if rate >= s.findings_high_usd_week
                else "medium" if rate >= s.findings_medium_usd_week else "low")
        assert f.severity == want, f.id
        # weekly = window × the scale shown
        if t.usd_window is not None:
            assert t.usd_week == pytest.approx(t.usd_window * t.scale) and t.scale == pytest.approx(led.scale)
    tok, usd = led.owned("reprefill")
    assert usd <= led.usd_week * (1 + 1e-12) and tok <= led.tokens_week * (1 + 1e-12)
    assert sum(c.usd_week for c in led.by_cause) == pytest.approx(led.usd_week)
    assert list(led.findings) == sorted(led.findings, key=order_key)
    # the trend adds up to the window's tax
    assert sum(r[3] for r in led.trend) == pytest.approx(led.usd_window)


def test_sample_cache_off_finding_owns_its_instance(sample_ledger, sample_db):
    # every re-prefill token on the cache-off replica is its finding's (cache_disabled before routed_away)
    from agentobs.metrics import compute

    led = sample_ledger
    f = next(f for f in led.findings if f.rule == "prefix_cache_off")
    inst = f.scope.instance
    m = compute("reprefill", db=as_source(str(sample_db)), since=led.since, until=led.until, by="instance", settings=Settings())
    row = m.filter(m["instance"] == inst).to_dicts()[0]
    assert f.tax.tokens_window == row["reprefill_tokens"]
    assert f.tax.usd_window == pytest.approx(row["reprefill_cost_usd"])
    # and it is the largest $ in the fleet's ledger, listed first
    assert led.findings[0].id == f.id


# -- the same numbers on every surface -------------------------------------------------------------------------
def _cli_json(db, *args):
    res = CliRunner().invoke(cli, ["findings", "--db", str(db), "--format", "json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_cli_json_is_the_ledger(sample_ledger, sample_db):
    rows = _cli_json(sample_db)
    assert [r["id"] for r in rows] == [f.id for f in sample_ledger.findings]
    for r, f in zip(rows, sample_ledger.findings, strict=True):
        assert r["tax"]["usd_week"] == f.tax.usd_week and r["recoverable"]["usd_week"] == f.recoverable.usd_week
        assert r["tax"]["usd_window"] == f.tax.usd_window and r["tax"]["window_s"] == f.tax.window_s
        assert r["sessions"] == f.sessions and r["severity"] == f.severity
        assert {"id", "rule", "severity", "scope", "confidence", "remediation"} <= set(r)
    full = json.loads(CliRunner().invoke(cli, ["findings", "--db", str(sample_db), "--format", "ledger"]).stdout)
    assert full["fleet"]["tax"]["usd_week"] == pytest.approx(sample_ledger.usd_week)


def test_report_lists_the_cli_ledger_of_its_period(sample_ledger_unsimulated, sample_db, tmp_path):
    import pyarrow.csv as pacsv

    from agentobs.report import build as report_build
    from agentobs.report.period import Period
    from agentobs.report.write import write

    led = sample_ledger_unsimulated
    # a period that holds the whole sample, given as the CLI takes it
    since, until = led.first_s - 3600, led.last_s + 3600
    period = Period("sample", since, until)
    rep = report_build(as_source(str(sample_db)), period, Settings())
    out = write(rep, tmp_path / "rep")
    # the CLI's ledger of the period, once: its findings rows are `--format json`'s (the same Finding.to_dict; the
    # two formats are compared on the whole sample in test_cli_json_is_the_ledger) and its fleet tax the headline's
    cli_full = json.loads(CliRunner().invoke(cli, ["findings", "--db", str(sample_db), "--format", "ledger",
                                                   "--since", str(since), "--until", str(until)]).stdout)
    cli_rows = cli_full["findings"]
    csv = pacsv.read_csv(out / "tables" / "findings.csv").to_pylist()
    assert [r["id"] for r in csv] == [r["id"] for r in cli_rows]
    for a, b in zip(csv, cli_rows, strict=True):
        assert a["usd_week"] == pytest.approx(b["tax"]["usd_week"], rel=1e-12) if b["tax"]["usd_week"] is not None \
            else a["usd_week"] is None
        assert a["sessions"] == b["sessions"]
    # the report leads with the answer: the week's tax as the CLI's ledger states it
    assert rep.sections[0].key == "answer"
    assert rep.figure("recompute_tax_usd_week").value == pytest.approx(cli_full["fleet"]["tax"]["usd_week"])
    summary = (out / "summary.md").read_text()
    first = summary.split("\n## ", 2)[1]
    assert first.startswith("The recompute tax this week") and cli_rows[0]["id"] in first


def test_exporter_serves_the_ledger(sample_ledger_unsimulated, sample_db):
    from agentobs.exporter import compute_snapshot

    led = sample_ledger_unsimulated
    now, window = led.last_s + 1.0, 7200.0
    snap = compute_snapshot(as_source(str(sample_db)), Settings(), clock=lambda: now, window_s=window)
    want = ledger_of(as_source(str(sample_db)), since=now - window, until=now, settings=Settings())
    (labels, v), = snap.series["agentobs_recompute_tax_usd_per_week"]
    assert v == pytest.approx(want.usd_week)
    got = {lab["finding"]: x for lab, x in snap.series["agentobs_finding_tax_usd_per_week"]}
    assert got == {f.id: pytest.approx(f.tax.usd_week) for f in want.findings if f.tax.usd_week is not None}
    cli = {r["id"]: r["tax"]["usd_week"] for r in _cli_json(sample_db, "--since", str(now - window),
                                                              "--until", str(now)) if r["tax"]["usd_week"]}
    assert got == {k: pytest.approx(v) for k, v in cli.items()}


def test_cli_lists_a_findings_sessions(sample_ledger, sample_db):
    f = sample_ledger.findings[0]
    res = CliRunner().invoke(cli, ["findings", "sessions", f.id, "--db", str(sample_db), "--format", "json",
                                   "--limit", "100000"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == f.sessions
    assert sum(r["usd_window"] for r in rows) == pytest.approx(f.tax.usd_window)
    bad = CliRunner().invoke(cli, ["findings", "sessions", "nope/fleet", "--db", str(sample_db)])
    assert bad.exit_code != 0 and "no finding 'nope/fleet' in this window" in str(bad.exception)


def test_report_week_before_is_the_ledger_of_the_week_before(store, tmp_path):
    # calls in the hour [T0, T0+1h) and in the hour before: the report's change against the period before reads
    # the report's own run moved back a period; it must equal a ledger prepared on that period alone
    from agentobs.report import build as report_build
    from agentobs.report.period import Period

    calls = two_turn_sessions(SG) + two_turn_sessions(SG, n=4, start=-3000.0)
    build(store, tmp_path, Fleet(calls, sglang={SG: {}}))
    rep = report_build(as_source(store[0]), Period("hour", *WINDOW), settings())
    before = ledger_of(as_source(store[0]), since=WINDOW[0] - 3600, until=WINDOW[0], settings=settings(), simulate=False)
    now = ledger_of(as_source(store[0]), since=WINDOW[0], until=WINDOW[1], settings=settings())
    fig = rep.figure("recompute_tax_usd_week")
    assert before.tokens_window == 40_000 and now.tokens_window == 100_000  # 4 and 10 evicted follow-ups
    assert fig.value == pytest.approx(now.usd_week) and fig.previous == pytest.approx(before.usd_week)
