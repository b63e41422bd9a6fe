"""An attribute's "usual" value (a session's model in the report's top lists, an instance's engine and model in the
findings, the model that picks an instance's KV geometry) is its most frequent value, and a tie goes to the least
value — the same answer every run and on every backend. DuckDB's mode() broke ties by the order it met the rows:
these tables are loaded in two row orders, and both must give the hand-derived answers."""

from __future__ import annotations

import duckdb
import pytest

from agentobs.findings.context import INSTANCES_SQL
from agentobs.metrics.cost import _OBSERVED_SQL
from agentobs.model import connect
from agentobs.report.build import about_sql

# session s1: models b, a, b, a (a tie 2–2: the least, 'a'); tenants y, x, y, y (y: 3 against 1, the most frequent
# wins even though x is less); agent names all NULL (no value: NULL). Session s2: one call, model c, tenant x.
# Task t1: its two sessions z-sess and a-sess both start at 100.0, so its first session is the least id, 'a-sess',
# whichever row comes first.
CALLS = [
    # session_id, task_id, task_type, tenant, agent_name, model, start_s, end_s
    ("s1", "t0", "swe", "y", None, "b", 100.0, 110.0),
    ("s1", "t0", "swe", "x", None, "a", 120.0, 130.0),
    ("s1", "t0", "data", "y", None, "b", 140.0, 150.0),
    ("s1", "t0", "data", "y", None, "a", 160.0, 175.0),
    ("s2", "t0", "swe", "x", "bot", "c", 200.0, 210.0),
    ("z-sess", "t1", "swe", "x", None, "m", 100.0, 105.0),
    ("a-sess", "t1", "swe", "x", None, "m", 100.0, 101.0),
]


def _m_calls(con, rows):
    con.execute("CREATE OR REPLACE TEMP TABLE m_calls (session_id VARCHAR, task_id VARCHAR, task_type VARCHAR, "
                "tenant VARCHAR, agent_name VARCHAR, model VARCHAR, start_s DOUBLE, end_s DOUBLE, in_win BOOLEAN)")
    con.executemany("INSERT INTO m_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, true)", rows)


@pytest.mark.parametrize("order", [1, -1])
def test_report_about_ties(order):
    con = duckdb.connect()
    _m_calls(con, CALLS[::order])
    got = {r[0]: r[1:] for r in con.execute(about_sql("session_id"),
                                            {"ids": ["s1", "s2"]}).fetchall()}
    # s1: task type swe 2 / data 2 → 'data' (least); tenant y; agent NULL; model a; first start 100, last end 175
    assert got["s1"] == ("data", "y", None, "a", 100.0, 175.0, "s1")
    assert got["s2"] == ("swe", "x", "bot", "c", 200.0, 210.0, "s2")
    got = {r[0]: r[1:] for r in con.execute(about_sql("task_id"), {"ids": ["t0", "t1"]}).fetchall()}
    # t0: task type swe 3 / data 2 → swe; tenant x 2 / y 3 → y; agent: bot once (NULLs are no value) → bot;
    # model a 2 / b 2 / c 1 → a; the first session is s1 (start 100)
    assert got["t0"] == ("swe", "y", "bot", "a", 100.0, 210.0, "s1")
    # t1: two sessions start at 100.0: the least id
    assert got["t1"] == ("swe", "x", None, "m", 100.0, 105.0, "a-sess")


@pytest.mark.parametrize("order", [1, -1])
def test_findings_instance_engine_and_model_ties(order):
    con = connect(":memory:")  # the store's views (instance_config) — empty: engine and model come from the calls
    rows = [  # instance, engine, model
        ("i1", "vllm", "m2"), ("i1", "sglang", "m1"),  # both ties: sglang, m1
        ("i2", "vllm", "m1"), ("i2", "vllm", "m2"), ("i2", "sglang", "m2"),  # vllm 2–1, m2 2–1
        (None, None, None),  # calls without an instance: instance '', no engine or model
    ][::order]
    con.execute("CREATE TEMP TABLE m_calls (instance VARCHAR, engine VARCHAR, model VARCHAR, start_s DOUBLE, "
                "end_s DOUBLE, in_win BOOLEAN)")
    con.executemany("INSERT INTO m_calls VALUES (?, ?, ?, 1.0, 2.0, true)", rows)
    con.execute("CREATE TEMP TABLE m_cost (instance VARCHAR, kv_capacity_tokens BIGINT, usd_per_s DOUBLE, "
                "prefill_tps DOUBLE, g_star_s DOUBLE, bytes_per_token DOUBLE, basis VARCHAR, rent_basis VARCHAR)")
    got = {r[0]: r[1:4] for r in con.execute(INSTANCES_SQL).fetchall()}
    assert got == {"": (None, None, 1), "i1": ("sglang", "m1", 2), "i2": ("vllm", "m2", 3)}


@pytest.mark.parametrize("order", [1, -1])
def test_cost_observed_model_ties(order):
    con = duckdb.connect()
    rows = [  # instance, model, prompt, cached, prefill_s
        ("i1", "Qwen/Qwen3-32B", 1000, 0, 0.5), ("i1", "Llama-3.1-8B", 3000, 1000, 0.5),  # a tie: the least name
        ("i2", None, 100, 0, None),  # no model named: NULL (the configured or default geometry applies)
    ][::order]
    con.execute("CREATE TEMP TABLE m_src (instance VARCHAR, model VARCHAR, prompt_tokens BIGINT, "
                "cached_tokens BIGINT, prefill_s DOUBLE)")
    con.executemany("INSERT INTO m_src VALUES (?, ?, ?, ?, ?)", rows)
    got = {r[0]: r[1:] for r in con.execute(_OBSERVED_SQL).fetchall()}
    # i1: prefill rates 1000/0.5 = 2000 and (3000 − 1000)/0.5 = 4000 tokens/s: median 3000 over 2 calls
    assert got == {"i1": (3000.0, 2, "Llama-3.1-8B"), "i2": (None, 0, None)}
