"""The Grafana dashboard and the example alert rules: valid JSON/YAML, and every PromQL expression names only
series the exporter itself serves or the engines expose (the vLLM/SGLang scrapes in tests/fixtures/)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_report_store import T, build_store, settings

from agentobs.exporter import DerivedCollector
from agentobs.source import as_source

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
DASHBOARD = ROOT / "dashboards" / "grafana" / "agentobs.json"
ALERTS = ROOT / "collectors" / "prometheus" / "agentobs-alerts.yaml"
ENGINE_SCRAPES = [FIXTURES / "vllm" / "metrics_sample.txt", FIXTURES / "sglang" / "metrics_sample.txt",
                  *sorted((FIXTURES / "vllm_real").glob("*/metrics_after.txt"))]

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Series names in a PromQL expression: identifiers that are not functions, keywords, label names of
    matchers or grouping clauses, strings, durations or numbers."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)              # string literals (label values, Grafana vars)
    e = re.sub(r"\{[^}]*\}", "", e)                           # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                          # range selectors [5m]
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # grouping label lists
    out = set()
    for m in _IDENT.finditer(e):
        name, rest = m.group(0), e[m.end():].lstrip()
        if name in KEYWORDS or rest.startswith("(") or re.fullmatch(r"\d.*", name):
            continue
        out.add(name)
    return out


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (instance) (rate(vllm:prefix_cache_hits_total[5m])) / sum by (instance) (rate(x_total[5m]))',
     {"vllm:prefix_cache_hits_total", "x_total"}),
    ('agentobs_session_reuse_hit_rate{dimension="$dimension"} < 0.6', {"agentobs_session_reuse_hit_rate"}),
    ("histogram_quantile(0.99, sum by (le, instance) (rate(a_bucket[5m])))", {"a_bucket"}),
    ("time() - b_seconds > 900", {"b_seconds"}),
    ("a > 0 and on (instance) b", {"a", "b"}),
])
def test_metric_names_extraction(expr, names):
    assert metric_names(expr) == names


@pytest.fixture(scope="module")
def known(tmp_path_factory) -> set[str]:
    tmp = tmp_path_factory.mktemp("dash")
    db = build_store(tmp / "r.duckdb", tmp)
    c = DerivedCollector(as_source(str(db)), settings(), clock=lambda: T + 1800)
    assert c.refresh()
    exporter = {s.name for fam in c.collect() for s in fam.samples}
    # the crafted store has no KV events, so the exporter emits no wasted-rent sample but serves the family
    assert "agentobs_idle_kv_rent_usd_per_hour" in exporter
    engines = set()
    for f in ENGINE_SCRAPES:
        for fam in text_string_to_metric_families(f.read_text()):
            engines |= {s.name for s in fam.samples}
    assert "vllm:prefix_cache_hits_total" in engines and "sglang:cached_tokens_total" in engines
    return exporter | engines


def _dashboard_exprs() -> list[tuple[str, str]]:
    d = json.loads(DASHBOARD.read_text())
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    return out


def test_dashboard_is_valid_grafana_json():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and isinstance(d["panels"], list)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    rects = []
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for q in rects:  # no two panels overlap
            assert not (g["x"] < q["x"] + q["w"] and q["x"] < g["x"] + g["w"]
                        and g["y"] < q["y"] + q["h"] and q["y"] < g["y"] + g["h"]), p["title"]
        rects.append(g)
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${DS_PROMETHEUS}"
    variables = {v["name"] for v in d["templating"]["list"]}
    assert variables == {"DS_PROMETHEUS", "dimension"}
    dims = next(v for v in d["templating"]["list"] if v["name"] == "dimension")
    assert dims["query"] == "instance,model,task_type"  # the exporter's dimensions


def test_dashboard_names_only_real_metrics(known):
    exprs = _dashboard_exprs()
    assert len(exprs) >= 20
    used = set()
    for title, e in exprs:
        names = metric_names(e)
        assert names, (title, e)
        assert names <= known, (title, names - known)
        used |= names
    # both the derived metrics and both engines are on the dashboard
    assert any(n.startswith("agentobs_") for n in used)
    assert any(n.startswith("vllm:") for n in used) and any(n.startswith("sglang:") for n in used)


def test_alert_rules_are_valid_and_name_only_real_metrics(known):
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert len(rules) >= 8
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, r["alert"]
        assert r["labels"]["severity"] in ("info", "warning", "critical") and r["annotations"]["summary"]
        found = metric_names(r["expr"])
        assert found and found <= known, (r["alert"], found - known)
