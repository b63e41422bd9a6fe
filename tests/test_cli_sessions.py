"""`agentobs calls` and `agentobs sessions` on a small hand-built store (issue 19): each call's hit class,
re-prefill tokens and miss cause; the session hit rate H = ΣC / ΣP over the calls whose C is known
(METRICS.md §2); one definition of retries; sub-agent branches beside the main branch.

Block size B = 16 (no engine config: the default_block_size setting). Session s1, times in seconds after T0:

    call branch  inst  t       P     C      R      R_eff  X      hit class  miss cause
    c1   main    A     0–2     1000  0      —      —      —      —          cold
    c2   main    A     10–12   2000  992    1000   992    0      hit        —        (992 ≥ 992 − 16)
    c3   main    B     20–22   3000  0      2000   2000   2000   miss       routed_away
    d1   b1      B     23–25   3500  2992   3000   2992   0      hit        —        (fork point: c3)
    c4   main    B     30–32   4000  1000   3000   2992   1992   partial    evicted_partial
    d2   b1      A     33–35   4500  0      3500   3488   3488   miss       routed_away  (attempt 2: a retry)
    c5   main    B     40–42   5000  NULL   4000   4000   NULL   NULL       unknown
    c6   main    B     50–51   6000  4992   5000   4992   0      hit        —        (status error)
    c7   main    B     52–54   6000  5984   6000   5984   0      hit        —        (same P after an error: retry)

R is the append-only estimate P(prev); R_eff = floor(min(R, P − 1) / 16) · 16 (3000 → 2992, 3500 → 3488,
6000 → min(6000, 5999) → 5984).

Session s2 (the retry definition at a fork): e1 (main, 0–2, P 1000, C 0) fails; e2 (branch b1, 5–7, P 1000,
C 992) forks from it with the same P — not a retry, a retry is a re-send within its own branch; e3 (main,
10–12, P 1000, C 992) re-sends it on main — a retry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_metrics_golden import call, make_db

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def s1_calls():
    return [
        call("c1", "s1", 0, 2, 1000, 0, inst=A),
        call("c2", "s1", 10, 12, 2000, 992, inst=A),
        call("c3", "s1", 20, 22, 3000, 0, inst=B),
        call("d1", "s1", 23, 25, 3500, 2992, inst=B, branch="b1"),
        call("c4", "s1", 30, 32, 4000, 1000, inst=B),
        call("d2", "s1", 33, 35, 4500, 0, inst=A, branch="b1", attempt=2),
        call("c5", "s1", 40, 42, 5000, None, inst=B),
        call("c6", "s1", 50, 51, 6000, 4992, inst=B, status=2),
        call("c7", "s1", 52, 54, 6000, 5984, inst=B),
    ]


def s2_calls():
    return [
        call("e1", "s2", 100, 102, 1000, 0, inst=A, status=2, task="t2"),
        call("e2", "s2", 105, 107, 1000, 992, inst=A, branch="b1", task="t2"),
        call("e3", "s2", 110, 112, 1000, 992, inst=A, task="t2"),
    ]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return make_db(tmp_path_factory.mktemp("sessions"), s1_calls() + s2_calls())


def agentobs(*args):
    # a pipe without $COLUMNS: tables 120 wide (os.environ, not the process's C environment, which a test run
    # may have given COLUMNS=80)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    r = subprocess.run([sys.executable, "-m", "agentobs.cli", *args], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_calls_show_hit_class_reprefill_and_miss_cause(db):
    rows = json.loads(agentobs("calls", "--session", "s1", "--db", db, "--format", "json"))
    got = {r["call_id"]: (r["hit_class"], r["reprefill_tokens"], r["miss_cause"]) for r in rows}
    assert [r["call_id"] for r in rows] == ["c1", "c2", "c3", "d1", "c4", "d2", "c5", "c6", "c7"]  # by start
    assert got == {
        "c1": (None, None, "cold"),                  # first call: nothing reusable yet
        "c2": ("hit", 0, None),                      # R_eff 992, C 992
        "c3": ("miss", 2000, "routed_away"),         # R_eff 2000 on A, served by B with nothing cached
        "d1": ("hit", 0, None),                      # the branch's first call reuses its fork point c3
        "c4": ("partial", 1992, "evicted_partial"),  # 2992 − 1000, same instance as c3
        "d2": ("miss", 3488, "routed_away"),         # prev = d1 (its branch) on B; d2 on A
        "c5": (None, None, "unknown"),               # C unknown: X unknown
        "c6": ("hit", 0, None),
        "c7": ("hit", 0, None),
    }
    gaps = {r["call_id"]: r["gap_before_s"] for r in rows}
    assert gaps["d1"] == 1.0 and gaps["c4"] == 8.0 and gaps["d2"] == 8.0  # 23 − 22 (fork), 30 − 22, 33 − 25
    assert [r["call_id"] for r in rows if r["is_retry"]] == ["d2", "c7"]
    # the table shows the same columns
    out = agentobs("calls", "--session", "s1", "--db", db)
    line = next(x for x in out.splitlines() if x.startswith("c4 "))
    assert "partial" in line and "1,992" in line and "evicted_partial" in line
