"""The helpers every command shares: one time parser (agentobs.times), one did-you-mean (agentobs.errors), one
``--filter KEY=VALUE`` parser (agentobs.cli._filters); each former copy now calls them, with its own message."""

from __future__ import annotations

import datetime as dt

import click
import pytest

from agentobs import times
from agentobs.cli import _filters
from agentobs.collect.backfill import parse_duration
from agentobs.collect.files import parse_at
from agentobs.collect.fleet import parse_fleet
from agentobs.config import Settings
from agentobs.console.filters import parse_ts
from agentobs.errors import ConfigError, InputError, QueryError, did_you_mean
from agentobs.findings.acks import parse_until
from agentobs.metrics import get_metric, parse_time
from agentobs.metrics.cost import parse_cost

NOW = 1_764_590_400.0  # 2025-12-01T12:00:00Z


def clock():
    return NOW


# -- did you mean -------------------------------------------------------------------------------------------------
def test_did_you_mean_forms():
    assert did_you_mean("instanse", ["instance", "model"]) == " (did you mean 'instance'?)"
    assert did_you_mean("zzz", ["b", "a"], "known:") == " (known: b, a)"  # in the order given
    assert did_you_mean("zzz", ["b", "a"]) == ""


def test_did_you_mean_in_every_caller():
    with pytest.raises(QueryError, match=r"^unknown metric 'reuze' \(did you mean 'reuse'\?\)$"):
        get_metric("reuze")
    with pytest.raises(QueryError, match=r"^unknown metric 'zzzzzz' \(choose one of capacity, concurrency, "):
        get_metric("zzzzzz")
    with pytest.raises(ConfigError, match=r"^\[cost\]: unknown key 'zzz' \(known: decode_tokens_per_s, instances, "):
        parse_cost({"zzz": 1})
    with pytest.raises(ConfigError, match=r"^fleet: unknown key 'recevier' \(did you mean 'receiver'\?\)$"):
        parse_fleet({"recevier": {}}, Settings())


# -- one time parser ----------------------------------------------------------------------------------------------
T9 = dt.datetime(2026, 10, 14, 9, 0, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize("value, want", [
    ("2026-10-14T09:00", T9),                       # naive ISO: UTC
    ("2026-10-14T09:00Z", T9),
    ("2026-10-14T11:00+02:00", T9),
    (" 2026-10-14T09:00:00 ", T9),
    (str(T9), T9),                                  # epoch seconds
    (T9, T9),
    (int(T9), T9),
    (dt.datetime(2026, 10, 14, 9, 0), T9),          # naive datetime: UTC
    (dt.datetime(2026, 10, 14, 11, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))), T9),
    (dt.date(2026, 10, 14), T9 - 9 * 3600),         # midnight UTC
    (None, None),
])
def test_parse_time_instants(value, want):
    assert times.parse_time(value, clock) == want
    assert parse_time(value, clock) == want          # agentobs.metrics.parse_time: the same, QueryError on bad input


def test_spans_before_after_or_refused():
    assert times.parse_time("24h", clock, spans=-1) == NOW - 86400
    assert times.parse_time(" 1.5 d ", clock, spans=1) == NOW + 1.5 * 86400
    assert parse_time("90m", clock) == NOW - 5400
    with pytest.raises(ValueError):
        times.parse_time("24h", clock)                # spans=0: not a time
    with pytest.raises(ValueError):
        times.parse_time("250ms", clock, spans=-1)    # ms is a duration unit only
    assert times.span_s("250ms", ms=True) == 0.25 and times.span_s("250ms") is None and times.span_s("x") is None
    with pytest.raises(ValueError):
        times.parse_time("1760432400", clock, epoch=False)
    with pytest.raises(TypeError):
        times.parse_time(True, clock)


def test_parse_utc_is_naive_utc_and_exact():
    assert times.parse_utc("2026-10-14T11:00:00.123456+02:00") == dt.datetime(2026, 10, 14, 9, 0, 0, 123456)
    assert times.parse_utc(str(T9)) == dt.datetime(2026, 10, 14, 9, 0)
    assert times.parse_utc("2d", clock, spans=1) == dt.datetime(2025, 12, 3, 12, 0)


def test_callers_keep_their_messages():
    with pytest.raises(QueryError, match=r"^since 'yesterday' is not a time: use ISO-8601 \(2026-10-14T09:00\), "
                                         r"epoch seconds, or a span before now \(24h, 7d\)$"):
        parse_time("yesterday", clock, "since")
    with pytest.raises(QueryError, match=r"^until \[1\] is not a time$"):
        parse_time([1], clock, "until")
    assert parse_time("", clock) is None
    assert parse_at("2026-10-14T09:00") == T9 and parse_at(str(T9)) == T9 and parse_at(None) is None
    with pytest.raises(InputError, match=r"^--at '24h' is neither epoch seconds nor an ISO-8601 time$"):
        parse_at("24h")                                 # --at takes no spans
    assert parse_ts("2026-10-14T11:00+02:00") == parse_ts(str(T9)) == dt.datetime(2026, 10, 14, 9, 0)
    with pytest.raises(ValueError):
        parse_ts("soon")
    assert parse_until("2026-12-01", clock) == dt.datetime(2026, 12, 2)   # the end of that day
    assert parse_until("14d", clock) == dt.datetime(2025, 12, 15, 12, 0)  # after now
    with pytest.raises(InputError, match=r"^--until '1760432400' is not a date"):
        parse_until("1760432400", clock)                                  # no epoch seconds here
    assert parse_duration("15s", "--step") == 15 and parse_duration("250ms", "--step") == 0.25
    assert parse_duration("2w", "--since") == 2 * 604800
    with pytest.raises(InputError, match=r"^--since: '7 days' is not a duration like 15s, 5m, 7d$"):
        parse_duration("7 days", "--since")
    with pytest.raises(InputError, match=r"^--step: '0s' must be positive$"):
        parse_duration("0s", "--step")


# -- one --filter parser ------------------------------------------------------------------------------------------
def test_filter_parser():
    assert _filters(["instance=a:1", " instance =b:2", "model=org/m=x", "task="]) == {
        "instance": ["a:1", "b:2"], "model": ["org/m=x"], "task": [""]}
    assert _filters([]) == {}
    for bad in ("instance", "=x"):
        with pytest.raises(click.UsageError, match=rf"^--filter '{bad}': expected KEY=VALUE, e\.g\. --filter "
                                                    r"instance=10\.0\.0\.1:8000$"):
            _filters([bad])


# -- secrets never echoed -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("http://default:s3cret@localhost:8123/agentobs", "http://default:***@localhost:8123/agentobs"),
    ("https://u:p@ss@ch.example:8443/otel", "https://u:***@ch.example:8443/otel"),   # a raw "@" in the password
    ("http://:pw@h/x", "http://:***@h/x"),
    ("cannot reach http://a:b@h:1/db nor https://c:d@e/f", "cannot reach http://a:***@h:1/db nor https://c:***@e/f"),
    ("http://user@h:8123/db", "http://user@h:8123/db"),                             # no password: unchanged
    ("http://h:8123/db", "http://h:8123/db"),
    ("chdb:///var/lib/agentobs.chdb", "chdb:///var/lib/agentobs.chdb"),
    ("/var/lib/agentobs/fleet.duckdb", "/var/lib/agentobs/fleet.duckdb"),
])
def test_mask_url(text, want):
    from agentobs.redact import mask_url

    assert mask_url(text) == want


def test_clickhouse_urls_are_masked_in_errors_and_labels():
    pytest.importorskip("chdb")
    from agentobs.backends.clickhouse.conn import ClickHouse
    from agentobs.console.data import label
    from agentobs.errors import StoreError

    with pytest.raises(ConfigError) as e:
        ClickHouse("clickhouse://u:s3cret@h:9000/db")
    assert "s3cret" not in str(e.value) and "clickhouse://u:***@h:9000/db" in str(e.value)
    with pytest.raises(StoreError) as e:
        ClickHouse("http://u:s3cret@127.0.0.1:1/db")  # nothing listens on port 1
    assert "s3cret" not in str(e.value)
    assert label(("clickhouse", "http://u:s3cret@h:8123/db", ())) == "http://u:***@h:8123/db"  # the console caption


class _FakeClient:
    """clickhouse-connect's client as `agentobs clickhouse init` uses it: statements, one count."""

    def __init__(self, **kw):
        self.kw = kw

    def command(self, sql, parameters=None):
        pass

    def query_arrow(self, sql, parameters=None):
        import pyarrow as pa

        if "FROM agentobs_aliases" in sql:  # the stored alias lists: none yet (a new database)
            return pa.table({"field": pa.array([], pa.string()), "keys": pa.array([], pa.list_(pa.string()))})
        return pa.table({"n": [0]})

    def close(self):
        pass


@pytest.mark.parametrize("flag", [True, False])
def test_clickhouse_init_echoes_the_url_without_its_password(monkeypatch, capsys, flag):
    clickhouse_connect = pytest.importorskip("clickhouse_connect")
    from agentobs.cli import main

    seen = []
    monkeypatch.setattr(clickhouse_connect, "get_client", lambda **kw: seen.append(kw) or _FakeClient(**kw))
    url = "http://default:s3cret@ch.example:8123/otel"
    if flag:
        main(["clickhouse", "init", "--clickhouse-url", url])
    else:  # the default: setting clickhouse_url (here from the environment); it printed "None" before
        monkeypatch.setenv("AGENTOBS_CLICKHOUSE_URL", url)
        main(["clickhouse", "init"])
    out = capsys.readouterr()
    assert seen[0]["password"] == "s3cret"  # the password is used ...
    assert "s3cret" not in out.out + out.err  # ... and never printed
    want = "ClickHouse model ready at http://default:***@ch.example:8123/otel (0 spans resolved)"
    assert " ".join(out.err.split()) == want


def test_fold_bounds_shows_each_estimate_with_its_bound():
    """A percentile column with a ``<name>_rel_err`` beside it is shown as text with its bound (the CLI table, via
    render); the bound columns go; NULL stays NULL; a table without bounds is returned as it is."""
    import pyarrow as pa

    from agentobs.output import bound_text, fold_bounds, rel_err_column

    assert rel_err_column("ttft_p99_s") == "ttft_p99_rel_err" and rel_err_column("miss_penalty") == "miss_penalty_rel_err"
    assert bound_text(0.01) == " ±1%" and bound_text(0.0202) == " ±2%" and bound_text(None) == ""
    t = pa.table({"model": ["a", "b"], "ttft_p99_s": [2.3123, None], "ttft_p99_rel_err": [0.01, None],
                  "calls": [3, 4]})
    got = fold_bounds(t)
    assert got.column_names == ["model", "ttft_p99_s", "calls"]
    assert got.column("ttft_p99_s").to_pylist() == ["2.312 ±1%", None]  # 4 significant digits, then the bound
    plain = pa.table({"p99_ms": [1.0]})
    assert fold_bounds(plain) is plain
