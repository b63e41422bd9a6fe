"""The HTML report in a real browser (Debian chromium via Playwright): it renders offline, requests nothing
but itself, shows the headline and the charts; a full-page screenshot goes to test-output/report/."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_report_store import WEEK, build_store, settings

from agentobs.report import build, iso_week, write
from agentobs.source import as_source

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "report"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # a real server and chromium, end to end
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(apt-get install -y chromium)"),
]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report_browser")
    db = str(build_store(tmp / "r.duckdb", tmp))
    full = write(build(as_source(db), WEEK, settings(), findings=None), tmp / "full")
    empty = write(build(as_source(db), iso_week("2026-W40"), settings(), findings=None), tmp / "empty")
    return full, empty


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def _open(browser, path: Path):
    ctx = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})
    page = ctx.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri(), wait_until="load")
    return ctx, page, requests, errors


def test_report_renders_offline(browser, reports):
    full, _ = reports
    ctx, page, requests, errors = _open(browser, full / "report.html")
    try:
        assert requests == [(full / "report.html").resolve().as_uri()]  # nothing but the page itself
        assert errors == []
        assert page.locator("h1").inner_text() == "agentobs weekly report — 2026-W42"
        kpi = page.locator('.kpi[data-key="calls"] .v')
        assert kpi.inner_text() == "7"
        # every chart drew bars with a real size
        svgs = page.locator("svg")
        assert svgs.count() >= 5
        box = page.locator("#spend svg rect").first.bounding_box()
        assert box is not None and box["width"] > 10 and box["height"] > 5
        assert page.locator("#top table a").first.inner_text() == "s1"
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "report_2026-W42.png"), full_page=True)
    finally:
        ctx.close()
    assert (SHOTS / "report_2026-W42.png").stat().st_size > 10_000


def test_empty_week_renders_the_notice(browser, reports):
    _, empty = reports
    ctx, page, requests, errors = _open(browser, empty / "report.html")
    try:
        assert errors == [] and len(requests) == 1
        assert page.locator("#no-data").is_visible()
        assert "No model calls in 2026-09-28" in page.locator("#no-data").inner_text()
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "report_empty_week.png"), full_page=True)
    finally:
        ctx.close()
