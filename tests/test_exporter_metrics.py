"""``agentobs exporter``: a real HTTP server on port 0 serving the derived metrics; the scrape parses with
prometheus_client's parser and its values equal the metrics API over the same window."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_report_store import COST_USD, REPREFILL_USD, T, build_store, settings

from agentobs.exporter import DerivedCollector, serve
from agentobs.metrics import compute
from agentobs.source import as_source

NOW = T + 1800  # half an hour after the crafted week's first call; the default window is 3600 s
WINDOW_S = 3600.0


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exporter")
    return str(build_store(tmp / "r.duckdb", tmp))


def scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def values(samples, **match) -> dict[str, float]:
    return {s.labels["group"]: s.value for s in samples if all(s.labels.get(k) == v for k, v in match.items())}


@pytest.fixture(scope="module")
def scraped(store):
    server, collector = serve(store, "127.0.0.1", 0, settings(), clock=lambda: NOW, refresh_s=3600)
    try:
        assert collector.wait_refreshes(1, timeout=60)
        assert collector.last_error == ""
        yield scrape(server.server_port)
    finally:
        server.shutdown()
        collector.stop()


def test_values_equal_the_metrics_api(scraped, store):
    w = dict(since=NOW - WINDOW_S, until=NOW, settings=settings())
    for dim in ("instance", "model", "task_type"):
        reuse = compute("reuse", as_source(store), by=dim, **w)
        assert values(scraped["agentobs_session_reuse_hit_rate"], dimension=dim) == pytest.approx(
            {r[dim]: r["reuse_hit_rate"] for r in reuse.to_dicts() if r["reuse_hit_rate"] is not None}), dim
        rp = compute("reprefill", as_source(store), by=dim, **w).to_dicts()
        assert values(scraped["agentobs_reprefill_token_share"], dimension=dim) == pytest.approx(
            {r[dim]: r["share_of_cache_tokens"] for r in rp if r["share_of_cache_tokens"] is not None}), dim
        # $ over a 1 h window = $/h
        assert values(scraped["agentobs_recompute_tax_usd_per_hour"], dimension=dim) == pytest.approx(
            {r[dim]: r["reprefill_cost_usd"] for r in rp if r["reprefill_cost_usd"] is not None}), dim
        rent = compute("idle_kv_rent", as_source(store), by=dim, **w).to_dicts()
        assert values(scraped["agentobs_idle_kv_rent_usd_per_hour"], dimension=dim, kind="paid") == pytest.approx(
            {r[dim]: r["rent_paid_usd"] for r in rent if r["rent_paid_usd"] is not None}), dim


def test_values_by_hand(scraped):
    # the crafted week's calls all start within the first 110 s after T: the window holds the whole week's data
    tax = values(scraped["agentobs_recompute_tax_usd_per_hour"], dimension="task_type")
    assert sum(tax.values()) == pytest.approx(REPREFILL_USD)
    spend = values(scraped["agentobs_spend_usd_per_hour"], dimension="task_type")
    assert spend == pytest.approx({"swe": COST_USD["s1"] + COST_USD["s3"], "research": COST_USD["s2"]})
    assert values(scraped["agentobs_calls"], dimension="instance") == {"10.1.0.1:8000": 4, "10.1.0.2:8000": 3}
    # instance A: s1 (C 0, 1984, 0 of R_eff 2000 and 2992) and s2's first call; U = 1984 / (2000 + 2992)
    assert values(scraped["agentobs_session_reuse_hit_rate"], dimension="instance")["10.1.0.1:8000"] == \
        pytest.approx(1984 / 4992)


def test_exporter_health_series(scraped):
    assert scraped["agentobs_exporter_snapshot_timestamp_seconds"][0].value == NOW
    assert scraped["agentobs_exporter_window_seconds"][0].value == WINDOW_S
    assert scraped["agentobs_exporter_refresh_errors_total"][0].value == 0
    # unknown is absent, never 0: no KV events → no wasted rent series
    assert values(scraped["agentobs_idle_kv_rent_usd_per_hour"], kind="wasted") == {}


def test_a_failed_refresh_keeps_serving_and_counts(tmp_path):
    c = DerivedCollector(as_source(str(tmp_path / "missing.duckdb")), settings(), clock=lambda: NOW)
    assert c.refresh() is False
    fams = {f.name: f for f in c.collect()}
    assert fams["agentobs_exporter_refresh_errors"].samples[0].value == 1
    assert fams["agentobs_exporter_snapshot_timestamp_seconds"].samples == []
    assert "no agentobs database" in c.last_error


def test_refresh_sees_new_calls(tmp_path):
    from test_report_store import SESSIONS

    db = build_store(tmp_path / "grow.duckdb", tmp_path, sessions=SESSIONS[:1])
    c = DerivedCollector(as_source(str(db)), settings(), clock=lambda: NOW)
    assert c.refresh()
    calls = {s.labels["group"]: s.value for f in c.collect() if f.name == "agentobs_calls" for s in f.samples
             if s.labels["dimension"] == "instance"}
    assert calls == {"10.1.0.1:8000": 3}
    build_store(db, tmp_path, sessions=SESSIONS[:3])  # more calls land (the exporter holds no connection)
    assert c.refresh()
    calls = {s.labels["group"]: s.value for f in c.collect() if f.name == "agentobs_calls" for s in f.samples
             if s.labels["dimension"] == "instance"}
    assert calls == {"10.1.0.1:8000": 4, "10.1.0.2:8000": 3}
