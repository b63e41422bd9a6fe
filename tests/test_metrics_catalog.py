"""The metric catalogue, the cost configuration and the CLI: malformed inputs get exact errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentobs.errors import ConfigError
from agentobs.metrics import catalogue, parse_metric
from agentobs.metrics.cost import parse_cost
from agentobs.metrics.geometry import lookup, parse_user_geometry

HEAD = "-- definition: d\n-- unit: u\n-- grain: g\n-- sources: s\n-- by: instance\n"

BAD_FILES = [
    ("-- unit: u\n-- grain: g\n-- sources: s\n-- by: instance\nSELECT 1", "lacks 'definition:'"),
    ("-- definition: d\n-- grain: g\n-- sources: s\n-- by: instance\nSELECT 1", "lacks 'unit:'"),
    ("SELECT 1", "lacks 'definition:', 'unit:', 'grain:', 'sources:', 'by:'"),
    (HEAD.replace("instance", "planet") + "SELECT 1", "unknown grouping(s) 'planet'"),
    (HEAD + "-- colour: red\nSELECT 1", "unknown header field 'colour'"),
    (HEAD + "SELEC 1", "SQL does not parse"),
    (HEAD + "DELETE FROM spans", "exactly one SELECT"),
    (HEAD + "SELECT 1; SELECT 2", "exactly one SELECT"),
    (HEAD + "SELECT $secret", "unknown parameter(s) $secret"),
]


@pytest.mark.parametrize("text,error", BAD_FILES)
def test_loader_refuses_bad_metric_files(text, error):
    with pytest.raises(ConfigError) as e:
        parse_metric("x", text, "x.sql")
    assert error in str(e.value) and str(e.value).startswith("x.sql: ")


def test_every_shipped_metric_has_its_header_and_a_doc_entry():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    cat = catalogue()
    assert {"reuse", "reprefill", "idle_kv_rent", "turn_resume_ttft", "itl_tail", "task_cost", "turn_goodput",
            "duty_cycle", "concurrency", "throughput", "capacity", "fleet_hit_rate"} <= set(cat)
    for m in cat.values():
        assert m.definition and m.unit and m.grain and m.sources and m.by
        assert f"`{m.name}`" in doc, f"docs/metrics.md misses metric {m.name}"
    ok = parse_metric("y", HEAD + "SELECT $by AS grp", "y.sql")
    assert ok.params == frozenset({"by"}) and ok.default_by == "instance"


BAD_COST = [
    ({"usd_per_hr": 2}, "[cost]: unknown key 'usd_per_hr' (did you mean 'usd_per_hour'?)"),
    ({"usd_per_hour": -1}, "[cost]: usd_per_hour must be > 0, got -1"),
    ({"usd_per_hour": "2$"}, "[cost]: usd_per_hour must be a number, got '2$'"),
    ({"instances": {"a:1": {"usd_per_hour": 0}}}, '[cost.instances."a:1"]: usd_per_hour must be > 0, got 0'),
    ({"instances": {"a:1": {"gpus": 8}}}, '[cost.instances."a:1"]: unknown key \'gpus\''),
    ({"instances": {"a:1": 5}}, '[cost.instances."a:1"] must be a table'),
    ({"list_price": {"input": 1}}, "[cost.list_price]: needs input and output"),
    ({"list_price": {"input": 1, "output": 2, "cache": 1}}, "[cost.list_price]: unknown key 'cache'"),
    ({"kv_geometry": {"m": {"layers": 4}}}, '[cost.kv_geometry."m"]: needs kv_heads and head_dim'),
    ({"kv_geometry": {"m": {"layers": 0, "kv_heads": 1, "head_dim": 1}}}, "layers must be a positive integer, got 0"),
]


@pytest.mark.parametrize("section,error", BAD_COST)
def test_cost_config_errors(section, error):
    with pytest.raises(ConfigError) as e:
        parse_cost(section)
    assert error in str(e.value)


def test_kv_geometry_bytes_per_token():
    # 2 × layers × kv_heads × head_dim × 2 bytes (bf16)
    assert lookup("meta-llama/Llama-3.1-8B-Instruct").bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131072
    assert lookup("meta-llama/Llama-3.3-70B-Instruct").bytes_per_token() == 2 * 80 * 8 * 128 * 2
    assert lookup("Qwen/Qwen3-32B").bytes_per_token() == 262144
    assert lookup("Qwen/Qwen3-30B-A3B-Instruct-2507").bytes_per_token() == 2 * 48 * 4 * 128 * 2
    # MLA: layers × (kv_lora_rank + qk_rope_head_dim) × 2 = 61 × 576 × 2
    assert lookup("deepseek-ai/DeepSeek-R1-0528").bytes_per_token() == 70272
    assert lookup("zai-org/GLM-4.5-Air").name == "GLM-4.5-Air" and lookup("zai-org/GLM-4.6").layers == 92
    assert lookup("openai/gpt-oss-120b").bytes_per_token(1) == 2 * 36 * 8 * 64   # fp8 KV cache
    assert lookup("mistralai/Mixtral-8x22B-Instruct-v0.1").layers == 56
    assert lookup("some/unknown-model") is None
    user = parse_user_geometry({"acme/Big-1": {"layers": 10, "kv_heads": 2, "head_dim": 64, "aliases": ["big1"]}})
    assert lookup("acme-big1-chat", user).bytes_per_token() == 2 * 10 * 2 * 64 * 2


def test_cli_metrics_catalogue_json_and_errors(tmp_path):
    from cli_run import run_cli

    from agentobs.model import connect

    db = str(tmp_path / "x.duckdb")
    connect(db).close()

    def run(*args):
        return run_cli("metrics", "--db", db, *args)

    r = run("--format", "json")
    assert r.returncode == 0, r.stderr
    assert [c["metric"] for c in json.loads(r.stdout)][:3] == ["reuse", "reprefill", "idle_kv_rent"]
    r = run("reuse", "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout) == []
    r = run("reuse", "--by", "cause")
    assert r.returncode == 3 and "cannot be grouped by 'cause'" in r.stderr
    r = run("reuse", "--filter", "instance")
    assert r.returncode != 0 and "expected KEY=VALUE" in r.stderr


def test_shipped_cost_example_is_valid():
    import tomllib
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "collectors" / "cost.example.toml").read_bytes()
    m = parse_cost(tomllib.loads(text.decode())["cost"])
    assert m.defaults["usd_per_hour"] == 2.5 and m.instances["10.42.7.31:8000"]["usd_per_hour"] == 19.6
    assert m.list_price == {"input": 0.40, "cached_input": 0.04, "output": 1.60}
    assert [g.bytes_per_token() for _, g in m.geometries] == [2 * 48 * 8 * 128 * 2, 61 * (512 + 64) * 2]


def test_every_rollup_form_is_a_source_part_before_its_definitions_final_part():
    """One definition per metric (agentobs/metrics/rollup.py): each rollup file holds no final SELECT of its own, the
    form is it followed by the definition's text from its ``-- final:`` line on, word for word, and parses as one
    SELECT; the sketch forms put one bound column beside each sketch percentile."""
    import duckdb

    from agentobs.metrics import rollup

    cat = catalogue()
    con = duckdb.connect()
    try:
        for name, (file, _) in rollup.FORMS.items():
            own = (Path(rollup.__file__).parent / file).read_text()
            assert rollup.FINAL not in own and "\nSELECT" not in own, file  # only the source part
            final = cat[name].sql[cat[name].sql.index(rollup.FINAL):]
            text = rollup.form_text(name)
            bounds = rollup._BOUNDS.get(name, {})
            assert text.count(" END AS ") - own.count(" END AS ") - final.count(" END AS ") == len(bounds), name
            assert text.startswith(own.rstrip()), name
            for col, bound in bounds.items():  # without the bound columns, the definition's final part itself
                err = col.rpartition(".")[2].removesuffix("_s") + "_rel_err"
                text = text.replace(f", CASE WHEN {col} IS NOT NULL THEN {bound} END AS {err}", "")
            assert text == own.rstrip() + final, name
            by = rollup._GROUPINGS.get(name, cat[name].by)[0]
            got = rollup.form(name, None, None, {}, by, bucket_s=60.0)
            assert got is not None, name
            stmts = con.extract_statements(got[0])
            assert len(stmts) == 1 and stmts[0].type == duckdb.StatementType.SELECT, name
    finally:
        con.close()
