"""The report directory: files, CSV/Parquet equal to the tables, a self-contained HTML page, the Markdown
summary, atomic replacement, an empty week, and the CLI's exit codes."""

from __future__ import annotations

import json
import os
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from test_report_store import TOTAL_USD, WEEK, build_store, settings

from agentobs.cli import main
from agentobs.report import Section, Table, build, iso_week, write
from agentobs.report.render import fmt_value
from agentobs.source import as_source


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report_out")
    return str(build_store(tmp / "r.duckdb", tmp))


@pytest.fixture(scope="module")
def written(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "2026-W42"
    rep = build(as_source(store), WEEK, settings(), findings=None)
    write(rep, out)
    return rep, out


class _Refs(HTMLParser):
    """Every attribute or tag that would make a browser fetch something."""

    def __init__(self):
        super().__init__()
        self.fetches: list[str] = []
        self.anchors: list[str] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "link", "img", "iframe", "object", "embed", "video", "audio", "source", "image", "use"):
            self.fetches.append(f"<{tag}>")
        for k in ("src", "srcset", "data", "xlink:href", "poster", "background"):
            if k in a:
                self.fetches.append(f"{tag} {k}={a[k]}")
        if "style" in a:
            self.styles.append(a["style"])
        if tag == "a":
            self.anchors.append(a.get("href", ""))
        self._in_style = tag == "style"

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)

    def handle_endtag(self, tag):
        self._in_style = False


def test_files(written):
    rep, out = written
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    tables = sorted(t.name for t in rep.tables())
    assert names == sorted(["manifest.json", "report.html", "summary.md"]
                           + [f"tables/{t}.{ext}" for t in tables for ext in ("csv", "parquet")])
    assert {"spend_by_task_type", "spend_by_agent", "spend_by_tenant", "spend_by_model", "reprefill_by_cause",
            "reprefill_by_instance", "idle_kv_rent_by_instance", "task_cost_by_task", "top_sessions",
            "top_tasks"} <= set(tables)
    # no temp folders left next to it
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_csv_and_parquet_hold_every_row(written):
    rep, out = written
    for t in rep.tables():
        assert pq.read_table(out / "tables" / f"{t.name}.parquet").equals(t.data), t.name
        csv = pacsv.read_csv(out / "tables" / f"{t.name}.csv")
        assert (csv.num_rows, csv.column_names) == (t.data.num_rows, t.data.column_names), t.name
    spend = pacsv.read_csv(out / "tables" / "spend_by_tenant.csv").to_pylist()
    assert sum(r["cost_usd"] for r in spend) == pytest.approx(TOTAL_USD)


def test_html_is_self_contained(written):
    _, out = written
    text = (out / "report.html").read_text()
    p = _Refs()
    p.feed(text)
    assert p.fetches == []
    assert not any("url(" in s or "@import" in s for s in p.styles)
    # the only links are console links, which open on click (nothing is loaded)
    assert p.anchors and all(a.startswith("http://127.0.0.1:8501/session?") for a in p.anchors)
    assert text.count("<svg") >= 5  # spend by 5 dimensions, tax by cause/instance, rent, task histogram


def test_html_and_markdown_content(written):
    rep, out = written
    html = (out / "report.html").read_text()
    md = (out / "summary.md").read_text()
    assert "agentobs weekly report — 2026-W42" in html and md.startswith("# agentobs weekly report — 2026-W42")
    total = fmt_value(TOTAL_USD, "usd")  # $0.02
    assert total in html and f"| Spend (GPU time) | {total} |" in md
    # week-over-week: $0.021524 vs $0.003508 = +513.6 %
    assert "+513.6 % (week before: $0.0035)" in md
    assert "[s1](http://127.0.0.1:8501/session?" in md
    assert "findings were left out of this report" in html and "findings were left out of this report" in md
    assert "Basis:" in html


def test_manifest(written):
    rep, out = written
    m = json.loads((out / "manifest.json").read_text())
    assert m["period"] == {"label": "2026-W42", "since": WEEK.since, "until": WEEK.until}
    assert (m["has_data"], m["calls"], m["previous"]["label"]) == (True, 7, "2026-W41")
    assert m["figures"]["cost_usd"]["value"] == pytest.approx(TOTAL_USD)
    assert m["tables"]["top_sessions"]["rows"] == 3
    assert "report.html" in m["files"] and "manifest.json" in m["files"]


def test_rewrite_replaces_and_a_failed_write_keeps_the_old_report(written, store, tmp_path):
    rep, _ = written
    out = tmp_path / "rep"
    write(rep, out)
    (out / "stale.txt").write_text("from an older run")
    write(rep, out)
    assert not (out / "stale.txt").exists()
    before = (out / "report.html").read_bytes()
    # a table CSV cannot hold (a union column) makes the write fail half-way
    bad = pa.table({"u": pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([1]), pa.array(["x"])])})
    broken = build(as_source(store), WEEK, settings(), findings=None)
    broken.sections.append(Section("bad", "bad", "test", tables=[Table("zz_bad", "bad", "test", bad)]))
    with pytest.raises(pa.ArrowException):
        write(broken, out)
    assert (out / "report.html").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # temp folder removed


def test_out_must_be_a_directory(written, tmp_path):
    from agentobs.errors import AgentobsError

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(AgentobsError, match="is a file; give a directory"):
        write(written[0], f)


def test_empty_week_says_so(store, tmp_path):
    rep = build(as_source(store), iso_week("2026-W40"), settings(), findings=None)
    out = write(rep, tmp_path / "w40")
    html = (out / "report.html").read_text()
    assert 'id="no-data"' in html and "No model calls in 2026-09-28 – 2026-10-05" in html
    assert "**No model calls in 2026-09-28 – 2026-10-05" in (out / "summary.md").read_text()
    assert json.loads((out / "manifest.json").read_text())["has_data"] is False
    assert not (out / "tables").exists()


def _cli(args, capsys) -> tuple[int, str]:
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_cli_exit_codes(store, tmp_path, capsys):
    cfg = tmp_path / "agentobs.toml"
    cfg.write_text("[cost]\nusd_per_hour = 3.6\nprefill_tokens_per_s = 1000\ndecode_tokens_per_s = 100\n"
                   "kv_capacity_tokens = 100000\n")
    base = ["report", "--db", store, "--config", str(cfg)]
    code, err = _cli([*base, "--week", "2026-W42", "--out", str(tmp_path / "a")], capsys)
    assert code == 0 and "report 2026-W42: 7 calls" in err
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["figures"]["cost_usd"]["value"] == \
        pytest.approx(TOTAL_USD)
    code, err = _cli([*base, "--week", "2026-W40", "--out", str(tmp_path / "b")], capsys)
    assert code == 0 and "no model calls" in err and (tmp_path / "b" / "report.html").exists()
    code, _ = _cli([*base, "--week", "2026-W40", "--out", str(tmp_path / "b"), "--require-data"], capsys)
    assert code == 4
    code, err = _cli([*base, "--week", "W42", "--out", str(tmp_path / "c")], capsys)
    assert code == 3 and "is not an ISO week" in err and not (tmp_path / "c").exists()
    code, err = _cli(["report", "--db", str(tmp_path / "none.duckdb"), "--week", "2026-W42", "--out",
                      str(tmp_path / "d")], capsys)
    assert code == 1 and "no agentobs database" in err
    assert not os.path.exists(tmp_path / "d")


def test_console_base_url_from_the_settings_file(store, tmp_path, capsys):
    cfg = tmp_path / "agentobs.toml"
    cfg.write_text('console_url = "https://obs.internal/console"\n')
    code, _ = _cli(["report", "--db", store, "--config", str(cfg), "--week", "2026-W42", "--out",
                    str(tmp_path / "r")], capsys)
    assert code == 0
    assert "](https://obs.internal/console/session?since=2026-10-12T00%3A00%3A00" in \
        Path(tmp_path / "r" / "summary.md").read_text()


def test_a_sketch_percentile_is_shown_with_its_bound():
    """A shown column with a ``<name>_rel_err`` beside it (a percentile from the hourly sketches) is rendered with its
    bound; an exact value (no bound, or a NULL one) as it is."""
    from agentobs.report.render import _table_html

    data = pa.table({"instance": ["a", "b"], "ttft_p99_s": [2.31, 0.5], "ttft_p99_rel_err": [0.01, None],
                     "p50_ms": [3.0, 4.0]})
    html = _table_html(Table("t", "T", "basis", data, show=["instance", "ttft_p99_s", "p50_ms"]), "W")
    assert html.count("±1%") == 1 and "±" not in html.split("±1%")[1]  # row a only; p50_ms has no bound column
