"""`agentobs model status|refresh|rebuild` on a small hand-built store (the maintained session model,
agentobs/model/state.py; docs/cli.md)."""

from __future__ import annotations

from builders import call, make_db
from cli_run import run_cli


def test_model_commands_on_a_store(tmp_path):
    # two sessions, three calls: the state holds one row per call
    db = make_db(tmp_path, [call("c1", "s1", 0, 2, 1000, 0), call("c2", "s1", 10, 12, 2000, 992),
                            call("c3", "s2", 0, 1, 500, 0, task="t2")])
    first = run_cli("model", "refresh", "--db", db)
    assert first.returncode == 0 and "3 calls of 2 sessions derived, 3 stored" in first.stderr + first.stdout
    again = run_cli("model", "refresh", "--db", db)  # nothing new: nothing derived
    assert again.returncode == 0 and "0 calls of 0 sessions derived, 3 stored" in again.stderr + again.stdout
    rebuilt = run_cli("model", "rebuild", "--db", db)
    assert rebuilt.returncode == 0 and "rebuild (asked): 3 calls of 2 sessions derived" in rebuilt.stderr + rebuilt.stdout
    status = run_cli("model", "status", "--db", db)
    assert status.returncode == 0 and status.stdout.startswith("current: 3 calls")


def test_model_refresh_on_a_missing_store_creates_nothing(tmp_path):
    r = run_cli("model", "refresh", "--db", str(tmp_path / "nope.duckdb"))
    assert r.returncode == 1 and "no agentobs database" in r.stderr
    assert not (tmp_path / "nope.duckdb").exists()
