"""End to end in a real browser: `agentobs console` (the real CLI, a real Streamlit server on a free loopback
port) driven by Playwright through Debian's chromium. Visits every page, opens a session timeline from the
Sessions page, runs a SQL query, checks a refused write, and saves a screenshot of each step under
test-output/screenshots/ (gitignored)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_console_store import LLAMA, WORKED_SESSION, build_store

from agentobs.console.shell import PAGES

LLAMA_SAMPLE = "meta-llama/Llama-3.1-8B-Instruct"  # a model of sample_data/fleet

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "screenshots"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # a real server and chromium, end to end
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(apt-get install -y chromium)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    db = build_store(tmp / "console.duckdb", tmp)
    yield from _serve(db, tmp)


@pytest.fixture(scope="module")
def sample_console(tmp_path_factory, sample_db):
    """The console over the sample fleet (the shared session store, read-only)."""
    yield from _serve(sample_db, tmp_path_factory.mktemp("browser_sample"))


def _serve(db, tmp):
    port = _free_port()
    env = dict(os.environ, AGENTOBS_CONSOLE_QUERIES=str(tmp / "queries.json"))
    env.pop("AGENTOBS_CONFIG", None)
    log = open(tmp / "console.log", "wb")  # noqa: SIM115 - a file, not a pipe nobody drains
    # its own process group, so teardown stops the CLI *and* its Streamlit child even if one hangs
    proc = subprocess.Popen([sys.executable, "-m", "agentobs.cli", "console", "--db", str(db), "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:  # readiness: poll the health endpoint (no fixed sleep)
        try:
            with urllib.request.urlopen(base + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            out = (tmp / "console.log").read_bytes().decode(errors="replace")
            pytest.fail(f"agentobs console did not start: {out[-2000:]}")
        time.sleep(0.2)
    yield base
    _stop(proc)
    log.close()


def _stop(proc):
    """SIGTERM the console's process group (the CLI stops Streamlit itself), SIGKILL what is left."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    ctx.close()


def settle(pg) -> None:
    """Wait until the script run is over (no 'Running…' status, no stale elements) and charts have drawn."""
    pg.wait_for_selector("[data-testid='stAppViewContainer']")
    pg.wait_for_function("""() => !document.querySelector("[data-testid='stStatusWidget']")
                                  && !document.querySelector("[data-stale='true']")""")
    for chart in pg.locator("[data-testid='stVegaLiteChart']").all():
        chart.locator("canvas, svg").first.wait_for()
    pg.wait_for_load_state("networkidle")


def shot(pg, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def no_exception(pg) -> None:
    assert pg.locator("[data-testid='stException']").count() == 0, pg.locator("[data-testid='stException']").first.inner_text()


def test_every_page(console, page):
    seen = []
    for _file, title, url, _icon, _section in PAGES:
        page.goto(f"{console}/{'' if url == 'overview' else url}")  # the default page lives at /
        page.get_by_role("heading", name=title, level=1).wait_for()
        settle(page)
        no_exception(page)
        seen.append(page.get_by_role("heading", level=1).first.inner_text())
        shot(page, f"page-{url}")
    assert seen == [title for _f, title, _u, _i, _s in PAGES]  # every page rendered its own title


def test_open_session_timeline_from_sessions(console, page):
    page.goto(f"{console}/sessions")
    page.get_by_role("heading", name="Sessions", level=1).wait_for()
    settle(page)
    # pick the worked-example session in the "Session" selectbox, then "Open timeline"
    page.get_by_label("Session", exact=True).click()
    page.get_by_role("option", name=WORKED_SESSION).click()
    settle(page)
    page.get_by_role("button", name="Open timeline").click()
    page.get_by_role("heading", name="Session timeline", level=1).wait_for()
    settle(page)
    assert f"session={WORKED_SESSION}" in page.url
    no_exception(page)
    # the timeline chart drew; the KPI row shows ΣP of the worked example
    page.locator("[data-testid='stVegaLiteChart'] canvas, [data-testid='stVegaLiteChart'] svg").first.wait_for()
    page.locator("[data-testid='stMetricValue']", has_text="15,661").wait_for()
    settle(page)
    assert page.locator("[data-testid='stVegaLiteChart']").count() == 1
    shot(page, "session-timeline")


def test_trace_waterfall_of_a_call(console, page):
    # the worked example's second chat call (its span id is the call id): the trace's 6 spans as a waterfall, and
    # the span picked shows its attributes (the session id is one)
    page.goto(f"{console}/trace?call=3e7a1c5d9f4b6083")
    page.get_by_role("heading", name="Trace", level=1).wait_for()
    settle(page)
    no_exception(page)
    page.locator("[data-testid='stMetricValue']", has_text="6").first.wait_for()
    assert page.locator("[data-testid='stVegaLiteChart']").count() == 1
    page.get_by_label("Span", exact=True).click()
    page.get_by_role("option", name="3e7a1c5d9f4b6083", exact=False).click()
    settle(page)
    page.get_by_text("chat Qwen/Qwen3-32B — gateway").wait_for()
    page.locator("[data-testid='stJson']", has_text=WORKED_SESSION).first.wait_for()
    shot(page, "trace-waterfall")


def test_filters_live_in_the_url(console, page):
    page.goto(f"{console}/sessions?model={LLAMA}")
    settle(page)
    sidebar = page.locator("[data-testid='stSidebar']")
    sidebar.locator("[data-testid='stMultiSelect']", has_text=LLAMA).wait_for()  # the URL's model is selected
    # navigate with the sidebar: the filter follows into the next page's URL
    sidebar.get_by_role("link", name="Engines").click()
    page.get_by_role("heading", name="Engines", level=1).wait_for()
    settle(page)
    page.wait_for_url(re.compile(r".*/engines\?.*model=meta-llama"))
    assert "model=meta-llama" in page.url and "/engines" in page.url
    shot(page, "filters-in-url")


def expect(locator):
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


def _run_sql(page, sql: str) -> None:
    box = page.locator("[data-testid='stTextArea'] textarea")
    box.fill(sql)
    page.get_by_role("button", name="Run query").click()  # a form: text and click are submitted together
    settle(page)


def test_sql_query_and_refused_write(console, page):
    page.goto(f"{console}/sql")
    page.get_by_role("heading", name="SQL", level=1).wait_for()
    settle(page)
    _run_sql(page, "SELECT session_id, calls FROM sessions ORDER BY calls DESC, session_id")
    page.get_by_text(re.compile(r"^5 rows in \d+ ms$")).wait_for()
    page.locator("[data-testid='stDownloadButton']", has_text="Download CSV").wait_for()
    no_exception(page)
    shot(page, "sql-result")
    _run_sql(page, "DROP TABLE spans")
    page.get_by_text("refused: DROP statements are not allowed").wait_for()
    expect(page.locator("[data-testid='stDataFrame']")).to_have_count(0)  # the previous result is gone
    shot(page, "sql-refused")
    _run_sql(page, "SELECT * FROM read_csv('/etc/passwd')")
    page.get_by_text(re.compile("refused: file and network access is disabled")).wait_for()
    assert "root:" not in page.content()  # nothing of /etc/passwd reached the page
    no_exception(page)


def test_overview_tax_equals_the_cli_ledger(sample_console, sample_db, page):
    # the first screen (no scrolling at 1440×900) shows the same weekly tax and top fixes as `agentobs findings`
    # for the same URL filters; "N sessions affected" opens the Sessions page filtered to that finding
    import json

    from click.testing import CliRunner

    from agentobs.cli import cli
    from agentobs.findings.context import fmt_usd as usd  # the first screen prints $ as the CLI does

    page.set_viewport_size({"width": 1440, "height": 900})
    for qs, flags in (("", []), ("?model=" + LLAMA_SAMPLE, ["--filter", f"model={LLAMA_SAMPLE}"])):
        # the page first: the console's server computes its ledger while this process computes the CLI's
        page.goto(f"{sample_console}/{qs}")
        res = CliRunner().invoke(cli, ["findings", "--db", str(sample_db), "--format", "ledger", *flags])
        assert res.exit_code == 0, res.output
        want = json.loads(res.stdout)
        settle(page)
        no_exception(page)
        box = page.locator(".st-key-tax_answer")
        value = box.locator("[data-testid='stMetricValue']").first
        assert value.inner_text() == usd(want["fleet"]["tax"]["usd_week"])
        assert value.bounding_box()["y"] + value.bounding_box()["height"] < 900  # on the first screen
        text = box.inner_text()
        priced = [f for f in want["findings"] if f["tax"]["usd_week"]][:3]
        assert priced, "the sample fleet's planted problems have a $ figure"
        banded = 0
        for f in priced:
            assert usd(f["tax"]["usd_week"]) + "/week" in text and f["id"] in text
            t = f["tax"]  # an estimate-mode finding shows its band as the CLI does ("estimate: $0.00–$3.84/week")
            if t["mode"] in ("estimate", "mixed") and usd(t["usd_low_week"]) != usd(t["usd_high_week"]):
                assert f"({t['mode']}: {usd(t['usd_low_week'])}–{usd(t['usd_high_week'])}/week)" in text
                banded += 1
            assert f"{f['sessions']:,} sessions affected" in text
        assert banded or qs  # the whole sample's top three include SGLang's hicache_off, an estimate-mode band
        shot(page, "overview-answer" + ("-filtered" if qs else ""))
    # drill down: the top finding's sessions
    top = priced[0]
    box.get_by_role("link", name=f"{top['sessions']:,} sessions affected").first.click()
    page.get_by_role("heading", name="Sessions", level=1).wait_for()
    settle(page)
    no_exception(page)
    assert "finding=" in page.url
    page.get_by_text(f"{top['sessions']:,} sessions affected").first.wait_for()
    shot(page, "sessions-of-a-finding")


def test_page_state_survives_a_reload(console, page):
    # a page's own choices go into its URL; reloading that URL (a new Streamlit session) shows the same view
    page.goto(f"{console}/turn-resume")
    page.get_by_role("heading", name="Turn-resume TTFT", level=1).wait_for()
    settle(page)
    page.get_by_text("p99", exact=True).click()  # the percentile radio
    settle(page)
    page.wait_for_url(re.compile(r".*stat=p99"))
    page.reload()
    page.get_by_role("heading", name="Turn-resume TTFT", level=1).wait_for()
    settle(page)
    assert "stat=p99" in page.url
    expect(page.locator("[data-testid='stRadio'] input[type='radio']:checked")).to_have_count(1)
    assert page.locator("[data-testid='stRadio'] label:has(input:checked)").inner_text().strip() == "p99"
    no_exception(page)
    # the SQL page: the query run is in the URL; a reload shows it and its result again
    page.goto(f"{console}/sql")
    page.get_by_role("heading", name="SQL", level=1).wait_for()
    settle(page)
    _run_sql(page, "SELECT session_id, calls FROM sessions ORDER BY calls DESC, session_id")
    page.get_by_text(re.compile(r"^5 rows in \d+ ms$")).wait_for()
    page.wait_for_url(re.compile(r".*[?&]q=SELECT.*"))
    page.reload()
    page.get_by_role("heading", name="SQL", level=1).wait_for()
    settle(page)
    page.get_by_text(re.compile(r"^5 rows in \d+ ms$")).wait_for()
    # expect() retries: under load the text area can be drawn a moment before its value is restored
    expect(page.locator("[data-testid='stTextArea'] textarea")).to_have_value(re.compile("ORDER BY calls DESC"))
    no_exception(page)
    shot(page, "sql-after-reload")
