"""The `table` format fits the terminal (issue 19): one line per row within the width ($COLUMNS, else the
terminal's, else 120 in a pipe), long ids cut in the middle, prose at the end, numbers formatted, columns
dropped (and named) when they cannot fit; csv/json keep every value in full."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pytest
from builders import call, make_db
from cli_run import run_cli
from rich.cells import cell_len
from rich.console import Console
from test_findings_rules import SG, WINDOW, Fleet, build, two_turn_sessions

from agentobs.output import PIPE_WIDTH, _fmt, fit_columns, header_text, render, shorten, table_width

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
FINDING_ID = f"non_affine_routing/model={LLAMA}"  # 57 characters
SUMMARY = ("2611 of 3414 follow-up calls changed replica although their prefix was cached on the previous one; "
           "23.4M tokens were computed again ($80.91/week)")


def rendered(table: pa.Table, width: int, title: str | None = None, **kw) -> list[str]:
    buf = io.StringIO()
    render(table, "table", title=title, console=Console(file=buf, width=300), width=width, **kw)
    return buf.getvalue().splitlines()


def body(lines: list[str], n: int) -> tuple[list[str], list[str]]:
    """The n row lines (after the header rule) and the lines after them."""
    rule = next(i for i, line in enumerate(lines) if line.strip() and set(line.strip()) == {"─"})
    return lines[rule + 1:rule + 1 + n], lines[rule + 1 + n:]


def assert_one_line_per_row(lines: list[str], width: int, marks: list[str]) -> list[str]:
    """Every line within ``width``; row i is exactly one line, the i-th after the header rule, and holds
    ``marks[i]`` (a value of that row); the line after the rows is empty or the note under the table, never a
    continuation of a cell. Returns the row lines."""
    assert all(cell_len(line) <= width for line in lines), [line for line in lines if cell_len(line) > width]
    rows, rest = body(lines, len(marks))
    assert len(rows) == len(marks)
    for mark, line in zip(marks, rows, strict=True):
        assert mark in line, (mark, line)
    if rest and rest[0].strip():
        assert "not shown" in rest[0] or rest[0].startswith("…"), rest[0]
    return rows


# -- the pieces ------------------------------------------------------------------------------------------------
def test_numbers_formatted():
    assert _fmt(32849888) == "32,849,888"            # thousands separators
    assert _fmt(0.703312) == "0.7033"                # 4 significant digits
    assert _fmt(58.3812) == "58.38" and _fmt(6.4741) == "6.474"
    assert _fmt(12345.678) == "12,346"               # from 1,000 up: whole numbers, not 1.235e+04
    assert _fmt(2280288810.4) == "2,280,288,810"
    assert _fmt(0.0001234) == "0.000123"             # below 0.001: 3 significant digits
    assert _fmt(0.0) == "0" and _fmt(None) == "∅" and _fmt(float("nan")) == "nan"
    assert _fmt("two\nlines\tand  blanks") == "two lines and blanks"  # a cell is one line


def test_shorten_middle_for_ids_end_for_prose():
    # 20 cells: 19 characters and the ellipsis; an id keeps its head (10) and its tail (9)
    assert shorten(FINDING_ID, 20, middle=True) == "non_affine…-Instruct"
    assert shorten(SUMMARY, 20) == "2611 of 3414 follow…"
    assert shorten("short", 20) == "short" and shorten("abcdef", 1) == "…"
    assert cell_len(shorten("会話セッション識別子", 7)) <= 7  # wide characters count as two cells


def test_headers_wrap_after_a_separator_then_abbreviate():
    assert header_text("reusable_tokens_eff", 19) == "reusable_tokens_eff"
    # the first line keeps its "_" (the header goes on); the split with the longest first line that fits
    assert header_text("reusable_tokens_eff", 12) == "reusable_\ntokens_eff"
    # no two-line split fits in 8 (the shortest needs 13: "calls_cached_" / "unknown"): 4 + "…" + 3
    assert header_text("calls_cached_unknown", 8) == "call…own"


def test_fit_columns_by_hand():
    headers = ["id", "severity", "tokens_week", "summary"]
    cells = [[FINDING_ID, "medium", "1,165,086,548", SUMMARY]]
    kinds = ["id", "text", "num", "text"]
    # natural: 57 + 8 + 13 + 146 = 224 (+ 3 gaps of 2). At 120 the budget is 114: prose gives way first (down to
    # 24 at most), and only by the excess 224 − 114 = 110: summary = 146 − 110 = 36, the id stays whole
    shown, w = fit_columns(headers, cells, kinds, 120)
    assert shown == [0, 1, 2, 3] and w == [57, 8, 13, 36]
    # at 80 (budget 74): summary to 24 (→ 102); the id to 32 (→ 77), then by the excess 3 more (→ 29):
    shown, w = fit_columns(headers, cells, kinds, 80)
    assert shown == [0, 1, 2, 3] and w == [29, 8, 13, 24]
    # at 60 (budget 54): even id 20 + 8 + 13 + 24 = 65 does not fit: summary is dropped; then (budget 56) the id
    # gives way by the excess 78 − 56 = 22 only: 35
    shown, w = fit_columns(headers, cells, kinds, 60)
    assert shown == [0, 1, 2] and w == [35, 8, 13]


def test_render_fits_80_and_names_what_it_dropped():
    t = pa.table({"id": [FINDING_ID, "itl_long_prefill/instance=10.42.7.32:8000"],
                  "severity": ["medium", "high"], "tokens_week": [1165086548.2, 1339712518.0],
                  "usd_week": [80.9112, 58.3803], "confidence": ["medium", "high"], "summary": [SUMMARY, "94% of"]})
    lines = rendered(t, 80, title="findings (2; details: --format markdown)")
    rows = assert_one_line_per_row(lines, 80, ["1,165,086,548", "1,339,712,518"])
    # 8 + 13 + 8 + 10 + 5 gaps·2 leave 31 for id and summary: below their least (20 + 24) → summary dropped,
    # and the id has 80 − 39 − 4·2 = 33 cells: 16 of its head, the ellipsis, 16 of its tail
    assert rows[0].startswith("non_affine_routi…-3.1-8B-Instruct  medium")
    assert "80.91" in rows[0] and "58.38" in rows[1]
    assert "1 column(s) not shown at width 80: summary" in " ".join(lines)
    # in csv and json every value stays whole
    assert FINDING_ID in render(t, "csv").decode() and SUMMARY in render(t, "json").decode()


def test_render_pipe_width_and_title_of_its_own():
    t = pa.table({"k": ["a"], "v": [1]})
    lines = rendered(t, 120, title="a title much longer than the two narrow columns of this table")
    assert lines[0] == "a title much longer than the two narrow columns of this table"  # not wrapped over the table
    assert_one_line_per_row(lines, 120, ["a "])


def test_table_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert table_width(Console(file=io.StringIO())) == 80
    monkeypatch.delenv("COLUMNS")
    assert table_width(Console(file=io.StringIO())) == PIPE_WIDTH == 120  # not a terminal: a pipe or a file
    assert table_width(Console(file=io.StringIO(), force_terminal=True, width=93)) == 93


# -- the commands, not on a terminal (as in a pipe) and at 80 columns --------------------------------------------
def agentobs(*args, columns: int | None = None):
    r = run_cli(*args, env={"COLUMNS": str(columns) if columns else None, "LINES": None})
    assert r.returncode == 0, r.stderr
    return r.stdout


SESS = [f"sess-{i}-0199e1a2-6c40-7d2e-b7a1-3f9e5c2d8a1-research-subagent" for i in range(3)]  # 56 characters


@pytest.fixture(scope="module")
def cli_store(tmp_path_factory):
    calls = []
    for i, s in enumerate(SESS):
        t = i * 100.0
        calls += [call(f"c{i}a", s, t, t + 2, 20000 + i, 0, inst="10.42.7.31:8000", model=LLAMA, task=f"t{i}"),
                  call(f"c{i}b", s, t + 10, t + 12, 26000 + i, 19984, inst="10.42.7.40:30000", model=LLAMA,
                       task=f"t{i}")]
    return make_db(tmp_path_factory.mktemp("tables"), calls)


COMMANDS = [
    # (args, key of the json rows whose value marks each table row)
    (["metrics", "reuse", "--by", "instance"], "calls"),
    (["metrics", "reuse"], "prompt_tokens"),
    (["sessions"], "session_id"),
    (["calls", "--session", SESS[1]], "call_id"),
    (["sql", "SELECT call_id, session_id, model, instance, prompt_tokens, cached_tokens FROM llm_calls "
             "ORDER BY call_id"], "call_id"),
]


_JSON: dict[tuple, list] = {}


@pytest.mark.parametrize("columns", [80, None], ids=["columns80", "pipe"])
@pytest.mark.parametrize("args,key", COMMANDS, ids=[" ".join(a[:2]) for a, _ in COMMANDS])
def test_commands_one_line_per_row(cli_store, args, key, columns):
    key_args = (cli_store, *args)
    if key_args not in _JSON:  # the same rows for both widths: asked once
        _JSON[key_args] = json.loads(agentobs(*args, "--db", cli_store, "--format", "json"))
    rows = _JSON[key_args]
    assert len(rows) >= 2
    lines = agentobs(*args, "--db", cli_store, columns=columns).splitlines()
    # an id may be cut in the middle: its first 7 characters stay (and tell these rows apart)
    marks = [r[key][:7] if isinstance(r[key], str) else _fmt(r[key]) for r in rows]
    assert_one_line_per_row(lines, columns or PIPE_WIDTH, marks)


def test_metric_catalogue_and_findings_fit(tmp_path, store, db_path):
    # the catalogue: prose definitions, cut at the end
    for columns in (80, None):
        lines = agentobs("metrics", columns=columns).splitlines()
        width = columns or PIPE_WIDTH
        rows, _ = body(lines, 14)
        assert all(cell_len(x) <= width for x in lines) and rows[0].startswith("reuse ")
        assert rows[-1].startswith("cost_model ")
    # findings: one finding, its id and summary
    build(store, tmp_path, Fleet(two_turn_sessions(SG), sglang={SG: {}}))
    con, w = store
    w.close()
    con.close()
    win = ["--since", str(WINDOW[0]), "--until", str(WINDOW[1]), "--no-simulate", "--db", str(db_path)]
    found = json.loads(agentobs("findings", *win, "--format", "json"))
    assert [f["id"] for f in found] == [f"hicache_off/instance={SG}"]
    for columns in (80, None):
        lines = agentobs("findings", *win, columns=columns).splitlines()
        assert_one_line_per_row(lines, columns or PIPE_WIDTH, ["hicache_off/"])


def test_a_real_pipe_gets_the_pipe_width(cli_store):
    """End to end: `agentobs sessions` in a new interpreter writing to a real pipe, without $COLUMNS."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    r = subprocess.run([sys.executable, "-m", "agentobs.cli", "sessions", "--db", cli_store], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = json.loads(agentobs("sessions", "--db", cli_store, "--format", "json"))
    assert_one_line_per_row(r.stdout.splitlines(), PIPE_WIDTH, [row["session_id"][:7] for row in rows])
