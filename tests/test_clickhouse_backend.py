"""The ClickHouse backend against the DuckDB store on the same data.

The worked example (tests/fixtures/otlp/agent_task_3turns.json) goes through the real OTLP decoder; DuckDB
gets the spans through the real writer, ClickHouse (chDB, in-process) gets them as the OpenTelemetry
Collector's ClickHouse exporter writes them (otel_traces rows). Two Prometheus expositions per engine
(vLLM, SGLang fixtures, the second with every counter advanced) go to DuckDB's metric_samples and to the
exporter's otel_metrics_* tables. Then the normalized views must agree row for row and the metric suite
must give the same numbers.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
import span_cases

chdb = pytest.importorskip("chdb", reason="chdb (in-process ClickHouse) is not installed: pip install 'agentobs[clickhouse]'")

from agentobs.backends.clickhouse import load, model  # noqa: E402
from agentobs.backends.clickhouse.conn import ClickHouse  # noqa: E402
from agentobs.backends.clickhouse.dialect import to_clickhouse  # noqa: E402
from agentobs.collect import otlp, prom  # noqa: E402
from agentobs.config import load_settings  # noqa: E402
from agentobs.errors import ConfigError  # noqa: E402
from agentobs.metrics import compute_all, names  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.source import ClickHouseSource, as_source  # noqa: E402
from agentobs.store.writer import Writer  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
T_SCRAPE = 1_791_970_000.0  # two scrapes 15 s apart, inside the worked example's day
# every metric runs on ClickHouse (itl_tail unions explicit column lists, capacity casts its re-prefill
# tokens to DOUBLE: docs/clickhouse.md)


def _bump(text: str) -> str:
    """The same exposition with every sample value + 10 (counters advance; buckets stay monotonic)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^([^#\s][^ ]*(?:\{.*\})?) (\S+)$", line)
        if m and not m.group(1).split("{")[0].endswith("_created"):  # a creation time stays (no restart)
            line = f"{m.group(1)} {float(m.group(2)) + 10}"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    settings = load_settings(env={})
    spans = otlp.decode_json((FIX / "otlp/agent_task_3turns.json").read_bytes(), settings).table()
    scrapes = []
    for eng, inst in (("vllm", "10.42.7.31:8000"), ("sglang", "10.42.7.32:30000")):
        text = (FIX / eng / "metrics_sample.txt").read_text()
        scrapes += [(text, inst, T_SCRAPE), (_bump(text), inst, T_SCRAPE + 15)]
    path = tmp_path_factory.mktemp("ch") / "duck.duckdb"
    con = connect(path)
    with Writer(con) as w:
        w.write("spans", spans)
        for text, inst, at in scrapes:
            s = prom.parse_text(text, inst, at)
            w.write("metric_samples", s.samples)
            if s.config.num_rows:
                w.write("engine_config", s.config)
    ch = ClickHouse("chdb:")
    model.create_tables(ch, settings)
    model.create_views(ch, settings)
    ch.insert_arrow("otel_traces", load.traces_rows(spans))
    for text, inst, at in scrapes:
        for table, rows in load.metrics_rows(text, inst, at).items():
            ch.insert_arrow(table, rows)
    yield con, ch, settings
    ch.close()
    con.close()


def _norm(v):
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 6)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    if hasattr(v, "tzinfo") and getattr(v, "tzinfo", None) is not None:
        return v.replace(tzinfo=None) if v.utcoffset().total_seconds() == 0 else v
    return v


def _rows(table: pa.Table, cols, key) -> list[tuple]:
    d = table.select(cols).to_pylist()
    out = []
    for r in d:
        row = []
        for c in cols:
            v = r[c]
            if c in ("itl_ms", "block_hashes") and v is None:
                v = []  # ClickHouse arrays are never NULL: empty = unknown
            row.append(_norm(v))
        out.append(tuple(row))
    idx = [cols.index(k) for k in key]
    return sorted(out, key=lambda t: tuple(str(t[i]) for i in idx))


SPAN_COLS = ["trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status_code",
             "role", "op", "session_id", "task_id", "task_type", "tenant", "agent_name", "attempt", "branch", "model",
             "provider", "engine", "instance", "response_id", "request_id", "input_tokens", "cached_tokens",
             "output_tokens", "system_tokens", "tool_def_tokens", "ttft_s", "queue_s", "prefill_s", "decode_s",
             "finish_reason", "error_type", "tool_name", "itl_ms", "block_hashes"]


@pytest.mark.parametrize("view,key", [
    ("spans", ["span_id"]), ("llm_calls", ["call_id"]), ("tool_calls", ["tool_call_span_id"]),
    ("turn_gaps", ["call_id"]), ("sessions", ["session_id"]), ("tasks", ["task_id"]),
    ("trace_context", ["trace_id"]), ("instance_config", ["instance"]),
])
def test_views_row_for_row(both, view, key):
    con, ch, _ = both
    duck = con.sql(f"SELECT * FROM {view}").to_arrow_table()
    cols = SPAN_COLS if view == "spans" else duck.column_names
    ours = ch.arrow(f"SELECT * FROM {view}")
    assert set(cols) <= set(ours.column_names), set(cols) - set(ours.column_names)
    a, b = _rows(duck, cols, key), _rows(ours, cols, key)
    assert len(a) == len(b) and len(a) > 0 or view == "instance_config"
    for ra, rb in zip(a, b, strict=True):
        assert ra == rb, {c: (x, y) for c, x, y in zip(cols, ra, rb, strict=True) if x != y}


def test_span_cases_promote_the_same_on_clickhouse(both):
    """tests/span_cases.py (cached tokens in the input or not, streaming, HTTP errors, exception events) through
    the exporter's otel_traces rows and ClickHouse's promotion SQL: the rows DuckDB's decoder makes."""
    _, ch, settings = both
    spans = otlp.decode_json_obj(span_cases.request(), settings).table()
    ch.command("CREATE TABLE IF NOT EXISTS span_cases_traces AS otel_traces")
    ch.command("TRUNCATE TABLE span_cases_traces")
    ch.insert_arrow("span_cases_traces", load.traces_rows(spans))
    sql = model.spans_select_sql(settings).replace("FROM otel_traces", "FROM span_cases_traces")
    a, b = _rows(spans, SPAN_COLS, ["span_id"]), _rows(ch.arrow(sql), SPAN_COLS, ["span_id"])
    assert len(a) == len(b) == 11
    for ra, rb in zip(a, b, strict=True):
        assert ra == rb, {c: (x, y) for c, x, y in zip(SPAN_COLS, ra, rb, strict=True) if x != y}


def test_worked_example_counts(both):
    """The worked example: 3 model calls, 2 tool calls, 2 resumed turns, one session and task (METRICS.md)."""
    _, ch, _ = both
    counts = {v: ch.arrow(f"SELECT count() AS n FROM {v}").column(0)[0].as_py()
              for v in ("llm_calls", "tool_calls", "turn_gaps", "sessions", "tasks")}
    assert counts == {"llm_calls": 3, "tool_calls": 2, "turn_gaps": 2, "sessions": 1, "tasks": 1}


def test_metric_samples_same_series_and_values(both):
    """Counters and gauges keep their exposed names and values; histograms come back as cumulative
    _bucket/_count/_sum series (le compared as a number: the receiver re-renders 1.0 as 1)."""
    con, ch, _ = both
    q = ("SELECT instance, metric, {le} AS le, value, ts FROM metric_samples "
         "WHERE metric LIKE 'vllm:%' OR metric LIKE 'sglang:%'")
    duck = con.sql(q.format(le="TRY_CAST(labels['le'] AS DOUBLE)")).to_arrow_table()
    ours = ch.arrow(q.format(le="toFloat64OrNull(labels['le'])"))
    def key(t):
        return sorted((r["instance"], r["metric"], str(r["le"]), round(r["value"], 6), r["ts"].replace(tzinfo=None))
                      for r in t.to_pylist())
    # same multiset of (series, le, value, time) except label sets: compare per (instance, metric, le, time) sums
    from collections import Counter
    ka, kb = Counter((r[0], r[1], r[2], r[4]) for r in key(duck)), Counter((r[0], r[1], r[2], r[4]) for r in key(ours))
    assert ka == kb
    sa = {}
    for r in key(duck):
        sa[(r[0], r[1], r[2], r[4])] = _norm(round(sa.get((r[0], r[1], r[2], r[4]), 0) + r[3], 3))
    sb = {}
    for r in key(ours):
        sb[(r[0], r[1], r[2], r[4])] = _norm(round(sb.get((r[0], r[1], r[2], r[4]), 0) + r[3], 3))
    assert sa == sb
    assert len(ka) > 100


@pytest.fixture(scope="module")
def suites(both):
    con, ch, settings = both
    chosen = list(names())
    return compute_all(as_source(con), settings=settings, metrics=chosen), compute_all(ClickHouseSource(ch=ch), settings=settings, metrics=chosen)


@pytest.mark.parametrize("name", list(names()))
def test_metric_suite_identical(suites, name):
    duck, ours = suites[0][name], suites[1][name]
    assert duck.columns == ours.columns
    assert duck.height == ours.height
    for ra, rb in zip(duck.rows(), ours.rows(), strict=True):
        for c, x, y in zip(duck.columns, ra, rb, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                # NaN on both sides (e.g. corr over constant data) is the same result
                assert (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12), (name, c, x, y)
            else:
                assert x == y, (name, c, x, y)


def test_fleet_hit_rate_counts_the_first_scrape_from_creation(suites):
    """The vLLM fixture's counters carry *_created (the receiver's StartTimeUnix on ClickHouse): the first scrape's
    value counts (queries 6,475,530, hits 5,637,408), then each the +10 of the second scrape; SGLang has no
    *_created: only the second scrape's +10 on each of its two prompt-token series (is_streaming) counts."""
    for suite in suites:
        r = {x["instance"]: x for x in suite["fleet_hit_rate"].to_dicts()}
        assert (r["10.42.7.31:8000"]["query_tokens"], r["10.42.7.31:8000"]["hit_tokens"]) == (6475540, 5637418)
        assert r["10.42.7.32:30000"]["query_tokens"] == 20


def test_worked_example_hit_rate_on_clickhouse(suites):
    """METRICS.md worked example: ΣC/ΣP = 9552/15661 (the three calls' cached and prompt tokens)."""
    reuse = suites[1]["reuse"].to_dicts()[0]
    assert reuse["prompt_tokens"] == 15661 and reuse["cached_tokens"] == 9552
    assert math.isclose(reuse["hit_rate"], 9552 / 15661)


@pytest.mark.parametrize("duck_sql,expected", [
    # quantile_cont is linear interpolation: p50 of 1,2,3,10 = 2.5
    ("SELECT quantile_cont(x, 0.5) AS v FROM (SELECT unnest([1.0, 2.0, 3.0, 10.0]) AS x)", 2.5),
    # list_aggregate of an empty (unknown) list is NULL, not NaN
    ("SELECT list_aggregate(CAST([] AS DOUBLE[]), 'quantile_cont', 0.99) AS v", None),
    # string_agg DISTINCT: sorted, so deterministic
    ("SELECT string_agg(DISTINCT x, ',') AS v FROM (SELECT unnest(['b', 'a', 'b']) AS x)", "a,b"),
    # integer division stays integer on nanosecond-sized values
    ("SELECT 1791970000123456789 // 1000 AS v", 1791970000123456),
    # lag over the first row is NULL, not 0
    ("SELECT lag(x) OVER (ORDER BY x) AS v FROM (SELECT 5 AS x)", None),
    # generate_series is inclusive
    ("SELECT count(*) AS v FROM (SELECT unnest(generate_series(2, 4)) AS k)", 3),
])
def test_dialect_constructs(both, duck_sql, expected):
    _, ch, _ = both
    got = ch.arrow(to_clickhouse(duck_sql)).column(0)[0].as_py()
    assert got == expected


@pytest.mark.parametrize("url,error", [
    ("mysql://h/db", "use chdb:, chdb:///path or http"),
    ("ftp://x", "use chdb:, chdb:///path or http"),
])
def test_bad_url(url, error):
    with pytest.raises(ConfigError, match=re.escape(error)):
        ClickHouse(url)


# the commands run by tests/cli_run.py in one child interpreter; prints [[returncode, stdout, stderr], ...]
CLI_DRIVER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from cli_run import run_cli
url = sys.argv[2]
out = [list(vars(run_cli("clickhouse", *json.loads(a), "--clickhouse-url", url)).values()) for a in sys.argv[3:]]
print(json.dumps(out))
"""


@pytest.mark.slow  # end to end: the commands in a child process
def test_cli_load_init_sql_metrics(tmp_path):
    """The commands end to end on an on-disk chDB, in a child process (chDB allows one database per
    process, and this module's fixture holds an in-memory one): load the worked example, query, refuse writes.
    One child runs them all, one after the other, as separate CLI invocations on the same path."""
    import json
    import subprocess
    import sys

    url = f"chdb://{tmp_path}/ch"
    bad = (("DROP TABLE spans", "only SELECT"), ("SELECT 1; SELECT 2", "one statement only"),
           ("SELECT * FROM url('http://127.0.0.1:1/x', CSV)", "refused: url() reaches outside"),
           # a function readonly = 1 lets through (it is not a table function): refused by name
           ("SELECT file('/etc/passwd')", "refused: file() reaches outside"))
    calls = [["load", str(FIX / "otlp/agent_task_3turns.json")],
             ["sql", "--format", "csv", "SELECT sum(prompt_tokens) AS p FROM llm_calls"],
             ["metrics", "reuse", "--format", "json"], *(["sql", sql] for sql, _ in bad)]
    p = subprocess.run([sys.executable, "-c", CLI_DRIVER, str(Path(__file__).parent), url,
                        *(json.dumps(c) for c in calls)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    (load, sql, metrics, *refused) = [SimpleNamespace(returncode=r[0], stdout=r[1], stderr=r[2])
                                      for r in json.loads(p.stdout.strip().splitlines()[-1])]
    assert load.returncode == 0, load.stderr
    assert "6 spans" in load.stderr
    assert sql.returncode == 0 and sql.stdout.strip().splitlines()[-1] == "15661", sql.stderr
    assert metrics.returncode == 0 and '"cached_tokens":9552' in metrics.stdout.replace(" ", ""), metrics.stderr
    for (sql_text, msg), res in zip(bad, refused, strict=True):
        assert res.returncode != 0 and msg in res.stderr.replace("\n", " "), (sql_text, res.stderr)


def test_session_aliases_come_from_the_alias_table(both):
    """The spans view reads the session-id keys from agentobs_aliases at ingest: a changed ``session_keys``
    written at the next connection (make_source → sync_aliases_note) applies to spans ingested after it, with no
    ``clickhouse init`` again; spans ingested before keep their ids (as on DuckDB, where aliases apply at ingest).
    On the module's chDB (one per process), its own trace, removed again at the end."""
    from agentobs.config import Settings

    _, ch, before = both  # the module's store, made with the default keys
    trace = "ab" * 16

    def span(sid: str, attrs: dict) -> dict:
        return {"traceId": trace, "spanId": sid * 8, "name": "chat m", "kind": 3,
                "startTimeUnixNano": "1800000000000000000", "endTimeUnixNano": "1800000001000000000",
                "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]}

    def ingest(sid: str, attrs: dict) -> None:
        doc = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [span(sid, attrs)]}]}]}
        ch.insert_arrow("otel_traces", load.traces_rows(otlp.decode_json_obj(doc, before).table()))

    def session_of(sid: str):
        return ch.arrow(f"SELECT session_id FROM spans WHERE span_id = '{sid * 8}'").column(0).to_pylist()

    # gen_ai.conversation.id is one of the default keys, my.session is not
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "conv-1", "my.session": "mine-1"}
    after = Settings(values={"session_keys": ["my.session", *before.session_keys]})
    try:
        assert model.stored_aliases(ch)["session_id"] == list(before.session_keys)  # written at init
        ingest("a1", attrs)
        assert session_of("a1") == ["conv-1"]
        assert model.sync_aliases_note(ch, before) is None           # nothing differs: nothing written
        note = model.sync_aliases_note(ch, after)
        assert note is not None and note.startswith("alias lists of session_id updated")
        assert model.stored_aliases(ch)["session_id"][0] == "my.session"
        assert model.alias_differences(ch, before) == ["session_id"]
        ingest("b2", attrs)
        assert session_of("b2") == ["mine-1"]                        # the new first key, without init
        assert session_of("a1") == ["conv-1"]                        # resolved at its ingest
    finally:
        assert model.sync_aliases(ch, before) in (["session_id"], [])  # back to the module's settings
        for table, col in (("otel_traces", "TraceId"), ("spans", "trace_id")):
            ch.command(f"DELETE FROM {table} WHERE {col} = '{trace}'")
    assert model.stored_aliases(ch)["session_id"] == list(before.session_keys)
