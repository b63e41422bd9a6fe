"""Settings validated at load: unknown tables and keys (with a did-you-mean), wrong types and a bad [cost] table are
an error naming the file and the key; one accessor (attributes) for every setting."""

from __future__ import annotations

import pytest
from cli_run import run_cli

from agentobs.config import SETTINGS, Settings, load_settings
from agentobs.errors import ConfigError


def load(tmp_path, text: str) -> Settings:
    p = tmp_path / "agentobs.toml"
    p.write_text(text)
    return load_settings(p, env={})


def error(tmp_path, text: str) -> str:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, text)
    return str(e.value)


def test_misspelt_table_is_an_error_not_the_default_cost(tmp_path):
    # before: [cots] was kept as an unvalidated table and the cost model fell back to the default $2.5/h
    msg = error(tmp_path, "[cots]\nusd_per_hour = 19.6\n")
    assert msg == f"{tmp_path / 'agentobs.toml'}: unknown table [cots] (did you mean 'cost'?)"
    assert error(tmp_path, "[pricing]\nusd = 1\n").endswith("unknown table [pricing] (known tables: cost)")


def test_misspelt_key_names_the_file_and_the_closest_setting(tmp_path):
    msg = error(tmp_path, "sql_row_cap = 10\nsql_row_kap = 5\n")
    assert msg == f"{tmp_path / 'agentobs.toml'}: unknown setting 'sql_row_kap' (did you mean 'sql_row_cap'?)"
    assert error(tmp_path, "zzz = 1\n").endswith("unknown setting 'zzz'")  # nothing close: no guess


@pytest.mark.parametrize("text, message", [
    ('sql_row_cap = "many"\n', "setting 'sql_row_cap' must be int, got 'many'"),
    ("sql_row_cap = 1.5\n", "setting 'sql_row_cap' must be int, got 1.5"),
    ("ttft_slo_s = true\n", "setting 'ttft_slo_s' must be float, got True"),
    ("db = 5\n", "setting 'db' must be str, got 5"),
    ("[db]\npath = 'x.duckdb'\n", "setting 'db' must be str, got {'path': 'x.duckdb'}"),
    ("session_keys = 3\n", "setting 'session_keys' must be list, got 3"),
    ('session_keys = ["a", 1]\n', "setting 'session_keys' must be list, got ['a', 1]"),
])
def test_wrong_type(tmp_path, text, message):
    assert error(tmp_path, text) == f"{tmp_path / 'agentobs.toml'}: {message}"


@pytest.mark.parametrize("text, message", [
    ("[cost]\nusd_per_hour = -1\n", "[cost]: usd_per_hour must be > 0, got -1"),
    ("[cost]\nusd_per_hr = 2\n", "[cost]: unknown key 'usd_per_hr' (did you mean 'usd_per_hour'?)"),
    ('[cost]\nusd_per_hour = "2.5"\n', "[cost]: usd_per_hour must be a number, got '2.5'"),
    ('[cost.instances."10.0.0.1:8000"]\nmodel = 3\n',
     '[cost.instances."10.0.0.1:8000"]: model must be a model name, got 3'),
    ("[cost.list_price]\ninput = 0.4\n", "[cost.list_price]: needs input and output ($ per million tokens); "
                                         "cached_input is optional"),
    ("cost = 5\n", "[cost] must be a table"),
])
def test_bad_cost_table_fails_at_load(tmp_path, text, message):
    assert error(tmp_path, text) == f"{tmp_path / 'agentobs.toml'}: {message}"


def test_good_file_loads_and_reads_through_attributes(tmp_path):
    s = load(tmp_path, 'db = "f.duckdb"\nsql_row_cap = 7.0\n[cost]\nusd_per_hour = 4.0\n'
                       '[cost.instances."10.0.0.1:8000"]\nusd_per_hour = 19.6\n')
    assert (s.db, s.sql_row_cap, s.source) == ("f.duckdb", 7, str(tmp_path / "agentobs.toml"))
    assert s.cost == {"usd_per_hour": 4.0, "instances": {"10.0.0.1:8000": {"usd_per_hour": 19.6}}}


def test_one_accessor_defaults_and_unknown_names():
    s = Settings()
    for setting in SETTINGS:
        assert getattr(s, setting.name) == setting.default
    assert s.cost == {}
    assert Settings(values={"ttft_slo_s": 1.0}).ttft_slo_s == 1.0
    with pytest.raises(AttributeError, match=r"no setting 'ttft_slo' \(did you mean 'ttft_slo_s'\?\)"):
        s.ttft_slo  # noqa: B018 - a misspelt name in code fails, it does not read as None


def test_every_command_refuses_a_bad_settings_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[cots]\nusd_per_hour = 19.6\n")
    # a terminal wide enough for the temp path (longer under pytest-xdist), so only the message's own breaks show
    r = run_cli("--config", p, "metrics", "cost_model", "--db", tmp_path / "x.duckdb", env={"COLUMNS": "400"})
    assert r.returncode == 2
    assert f"error: {p}: unknown table [cots] (did you mean 'cost'?)" == " ".join(r.stderr.split())  # one line
