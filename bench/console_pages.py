"""Console page render times, measured with Streamlit's AppTest (the same script runner the server uses).

    .venv/bin/python bench/console_pages.py                     # synthetic 1,000,000-call store
    .venv/bin/python bench/console_pages.py --calls 20000       # smaller synthetic store
    .venv/bin/python bench/console_pages.py --db sample.duckdb  # an existing store (e.g. agentobs demo)
    .venv/bin/python bench/console_pages.py --db sample.duckdb --browser   # the real server, in chromium
    .venv/bin/python bench/console_pages.py --db sample.duckdb --browser --first-visit 3   # the first Overview

For each page: the first render (cold: nothing cached for this db stamp + filters) and a second render
(warm: st.cache_data hits), in seconds, plus the ratio cold/warm. Before the first render the console's modules
are imported, as the server does at start (agentobs.console.serve, which ``agentobs console`` runs), so the
figures are page renders, not the process's one-time imports; ``--no-preload`` leaves that to the first page.
``--browser`` measures what a user waits for instead: the real ``agentobs console`` (a fresh server, so the first
visit of each page is cold) driven by Debian's chromium through Playwright (the dev extra), each visit in a new
browser context (no cached assets, a new Streamlit session): from navigation until the page's title is drawn, the
script run is over (no status widget, no stale element) and its charts have drawn.
Targets (docs/console.md): < 2 s on sample_data, < 5 s on 1M calls; in chromium on sample_data the first
Overview < 4 s and every page warm < 2 s. The synthetic store is written through the one Writer as gateway spans:
sessions of 10 calls on 8 instances, 2 models, 4 task types, prompts growing by ~1,500 tokens a turn.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentobs.console import APP  # noqa: E402
from agentobs.console.shell import PAGES  # noqa: E402
from agentobs.model import connect  # noqa: E402
from agentobs.store.writer import Writer  # noqa: E402

T0_NS = 1_791_969_665 * 10**9


def synth_spans(n_calls: int, seed: int = 7, calls_per_session: int = 10) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = n_calls
    i = np.arange(n)
    sess = i // calls_per_session
    turn = i % calls_per_session
    n_sess = int(sess.max()) + 1
    sess_start = rng.uniform(0, 2 * 3600, n_sess)  # sessions start over 2 hours
    gap = rng.exponential(20.0, n)                  # tool / think time between calls
    dur = rng.uniform(1.0, 8.0, n)
    # call start = session start + cumulated (dur + gap) of the earlier turns of the session
    step = dur + gap
    cum = np.cumsum(step)
    first = np.repeat(cum[::calls_per_session] - step[::calls_per_session], calls_per_session)[:n]
    start = sess_start[sess] + (cum - step - first)
    prompt = (2000 + 1500 * turn + rng.integers(0, 400, n)).astype(np.int64)
    keep = rng.uniform(0, 1, n)
    prev_p = np.where(turn > 0, 2000 + 1500 * (turn - 1), 0)
    cached = np.where(turn == 0, 1024, np.where(keep < 0.7, (prev_p // 16) * 16, np.where(keep < 0.9, 0, 512)))
    inst_of_sess = rng.integers(0, 8, n_sess)
    moved = (rng.uniform(0, 1, n) < 0.05) & (turn > 0)
    inst = np.where(moved, (inst_of_sess[sess] + 1) % 8, inst_of_sess[sess])
    models = np.array(["Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct"])
    ttypes = np.array(["swe-fixer", "researcher", "triage", "coder"])
    instances = np.array([f"10.42.8.{k}:8000" for k in range(8)])
    start_ns = (T0_NS + start * 1e9).astype(np.int64)
    end_ns = start_ns + (dur * 1e9).astype(np.int64)
    sess_ids = np.char.add("sess-", sess.astype(str))
    return pa.table({
        "trace_id": np.char.add("t", sess.astype(str)),
        "span_id": np.char.add("c", i.astype(str)),
        "parent_span_id": pa.nulls(n, pa.string()),
        "name": np.full(n, "chat"),
        "kind": np.full(n, 3, dtype=np.int8),
        "start_ns": start_ns, "end_ns": end_ns,
        "status_code": np.where(rng.uniform(0, 1, n) < 0.01, 2, 0).astype(np.int8),
        "role": np.full(n, "gateway"), "op": np.full(n, "chat"),
        "session_id": sess_ids, "task_id": np.char.add("task-", sess.astype(str)),
        "task_type": ttypes[sess % 4], "tenant": np.char.add("team-", (sess % 5).astype(str)),
        "attempt": np.ones(n, dtype=np.int32), "model": models[sess % 2], "provider": np.full(n, "vllm"),
        "engine": np.full(n, "vllm"), "instance": instances[inst],
        "input_tokens": prompt, "cached_tokens": cached.astype(np.int64),
        "output_tokens": rng.integers(50, 400, n).astype(np.int64),
        "ttft_s": np.where(cached > 0, 0.15, 0.8) + rng.uniform(0, 0.1, n),
        "ingest_source": np.full(n, "bench"),
    })


def build(db: Path, n_calls: int, with_state: bool = True) -> float:
    t = time.perf_counter()
    con = connect(db)
    spans = synth_spans(n_calls)
    with Writer(con, batch_rows=200_000, flush_s=5.0) as w:
        for off in range(0, spans.num_rows, 200_000):
            w.submit("spans", spans.slice(off, 200_000))
    if with_state:  # the maintained session model, as imports and collect keep it (agentobs.model.state)
        from agentobs.config import load_settings
        from agentobs.model import state

        state.rebuild(con, load_settings())
    con.execute("CHECKPOINT")
    con.close()
    return time.perf_counter() - t


def measure(db: Path, session_id: str | None, preload: bool = True, skip: frozenset[str] = frozenset()
            ) -> list[tuple[str, float, float]]:
    from streamlit.testing.v1 import AppTest

    if preload:
        from agentobs.console.serve import preload as load

        t = time.perf_counter()
        failed = load()
        print(f"preloaded the console's modules in {time.perf_counter() - t:.2f} s (as the server does at start)"
              + (f"; failed: {', '.join(failed)}" if failed else ""))

    os.environ["AGENTOBS_DB"] = str(db)
    at = AppTest.from_file(str(APP), default_timeout=600)
    if preload:
        # the server scans the installed packages for Streamlit components once, when its runtime starts
        # (Runtime.__init__); AppTest does it in its first run, which would charge ~0.3 s of server start to the
        # first page. Done here, before the timing, as the server does before it listens.
        from streamlit.components.v2.component_manager import BidiComponentManager

        if hasattr(at, "_bidi_component_manager"):
            t = time.perf_counter()
            mgr = BidiComponentManager()
            mgr.discover_and_register_components(start_file_watching=False)
            at._bidi_component_manager = mgr
            print(f"scanned for Streamlit components in {time.perf_counter() - t:.2f} s (as the server does at start)")
    t = time.perf_counter()
    at.run()  # the first run renders the default page (Overview) cold
    first = time.perf_counter() - t
    rows = []
    for file, title, url, _icon, _section in PAGES:
        if url in skip:
            continue
        times = [first] if url == "overview" else []
        while len(times) < 2:  # cold, then warm (cached)
            at.switch_page(f"views/{file}")
            if url == "session" and session_id:
                at.query_params["session"] = session_id
            t = time.perf_counter()
            at.run()
            times.append(time.perf_counter() - t)
            if at.exception:
                raise SystemExit(f"{title}: {at.exception[0].value}")
        rows.append((title, times[0], times[1]))
        print(f"  {title}: cold {times[0]:.2f} s, warm {times[1]:.2f} s", flush=True)  # progress (a long 10M run)
    return rows


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# a page is drawn when its script run is over (no status widget, no stale or skeleton element) and every chart drew
DRAWN = """() => !document.querySelector("[data-testid='stStatusWidget']")
    && !document.querySelector("[data-stale='true'], [data-testid='stSkeleton'], [data-testid='stAppSkeleton']")
    && document.querySelector("[data-testid='stApp']")?.getAttribute("data-test-script-state") === "notRunning"
    && [...document.querySelectorAll("[data-testid='stVegaLiteChart']")].every(c => c.querySelector("canvas, svg"))"""


def _drawn(pg, title: str, t0: float) -> float:
    """Seconds from ``t0`` until page ``title`` is drawn (DRAWN holds, and still holds 300 ms later)."""
    pg.get_by_role("heading", name=title, level=1).wait_for()
    while True:
        pg.wait_for_function(DRAWN)
        done = time.perf_counter() - t0
        pg.wait_for_timeout(300)
        if pg.evaluate(DRAWN):
            break
    if pg.locator("[data-testid='stException']").count():
        raise SystemExit(f"{title}: {pg.locator('[data-testid=stException]').first.inner_text()}")
    return done


def measure_browser(db: Path, session_id: str | None, chromium: str) -> list[tuple[str, float, float, float]]:
    """Per page, in chromium against a fresh ``agentobs console``: cold (the first visit since the server started:
    the Overview opened by its URL in a new browser, the other pages by their sidebar link, as a user moves), warm
    (the sidebar link again: the server's cache is warm) and load (the page's URL opened in a new browser context,
    server cache warm: a reload or a shared link; the session timeline with ?session=). Seconds."""
    from playwright.sync_api import sync_playwright

    proc, base = _start_console(db)
    try:
        times: dict[str, list[float]] = {title: [] for _f, title, *_ in PAGES}
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
            ctx = b.new_context(viewport={"width": 1440, "height": 900})
            pg = ctx.new_page()
            pg.set_default_timeout(120_000)
            for _round in range(2):  # cold, then warm: every page through the sidebar, as a user moves
                for _file, title, url, _icon, _section in PAGES:
                    t = time.perf_counter()
                    if url == "overview" and not _round:
                        pg.goto(base + "/")  # the first visit: the default page, by its URL
                    else:
                        pg.locator("[data-testid='stSidebarNav'] a", has_text=title).first.click()
                    times[title].append(_drawn(pg, title, t))
            ctx.close()
            for _file, title, url, _icon, _section in PAGES:  # load: a new browser on the page's URL
                path = "" if url == "overview" else url + (f"?session={session_id}" if url == "session" and session_id
                                                           else "")
                ctx = b.new_context(viewport={"width": 1440, "height": 900})
                pg = ctx.new_page()
                pg.set_default_timeout(120_000)
                t = time.perf_counter()
                pg.goto(f"{base}/{path}")
                times[title].append(_drawn(pg, title, t))
                ctx.close()
            b.close()
        return [(title, *v) for title, v in times.items()]
    finally:
        _stop(proc)


def _start_console(db: Path):
    """``agentobs console`` on a free loopback port, in its own process group; (process, base URL) once healthy."""
    import subprocess
    import urllib.request

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentobs.cli", "console", "--db", str(db), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(base + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise SystemExit("agentobs console did not start")
        time.sleep(0.2)


def _stop(proc) -> None:
    import signal
    import subprocess

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(15)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def measure_first_visit(db: Path, chromium: str, arrive_after: float, repeat: int) -> list[float]:
    """The Overview's first render after a fresh start, the visitor arriving ``arrive_after`` s after the server
    answers (a person opening the printed URL), in a new chromium; once per fresh server, ``repeat`` times."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        for _ in range(repeat):
            proc, base = _start_console(db)
            try:
                time.sleep(arrive_after)
                ctx = b.new_context(viewport={"width": 1440, "height": 900})
                pg = ctx.new_page()
                pg.set_default_timeout(120_000)
                t = time.perf_counter()
                pg.goto(base + "/")
                out.append(_drawn(pg, "Overview", t))
                ctx.close()
            finally:
                _stop(proc)
        b.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", type=Path, help="measure an existing store instead of a synthetic one")
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--no-state", action="store_true",
                    help="build the synthetic store without the maintained session model (pages derive call_reuse)")
    ap.add_argument("--no-preload", action="store_true",
                    help="do not import the console's modules first (the first page pays for them)")
    ap.add_argument("--browser", action="store_true",
                    help="time the real server in chromium (Playwright) instead of AppTest")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="the chromium --browser drives")
    ap.add_argument("--first-visit", type=int, metavar="N", default=0,
                    help="with --browser: only the first Overview after a fresh start, N times")
    ap.add_argument("--arrive-after", type=float, default=5.0, metavar="S",
                    help="with --first-visit: open the Overview S seconds after the server answers (default 5)")
    ap.add_argument("--skip", default="", metavar="URLS",
                    help="AppTest: leave out these pages, by URL path, comma-separated (e.g. whatif: its cold render "
                         "replays the whole store); the Overview is always rendered first")
    args = ap.parse_args()
    skip = frozenset(u.strip() for u in args.skip.split(",") if u.strip())
    unknown = skip - {p[2] for p in PAGES}
    if unknown:
        ap.error(f"--skip: no page {', '.join(sorted(unknown))}; pages: {', '.join(p[2] for p in PAGES)}")
    tmp = None
    if args.db:
        db = args.db
    else:
        tmp = tempfile.TemporaryDirectory()
        db = Path(tmp.name) / "bench.duckdb"
        print(f"building a synthetic store of {args.calls:,} calls ...", flush=True)
        print(f"  built in {build(db, args.calls, not args.no_state):.1f} s ({db.stat().st_size / 1e6:.0f} MB)")
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    n_calls = con.execute("SELECT count(*) FROM llm_calls").fetchone()[0]
    sid = con.execute("SELECT session_id FROM sessions ORDER BY calls DESC, session_id LIMIT 1").fetchone()
    con.close()
    print(f"store: {db} — {n_calls:,} calls")
    if args.browser and args.first_visit:
        t = measure_first_visit(db, args.chromium, args.arrive_after, args.first_visit)
        print(f"first Overview after a fresh start, opened {args.arrive_after:g} s after the server answered, in "
              f"chromium: {', '.join(f'{x:.2f}' for x in t)} s")
    elif args.browser:
        rows = measure_browser(db, sid[0] if sid else None, args.chromium)
        print("in chromium, seconds until the page is drawn: cold = first visit since the server started (Overview by "
              "URL in a new browser, the rest by sidebar link), warm = by sidebar link again, load = the URL in a new "
              "browser context (warm server)")
        print(f"{'page':<22}{'cold (s)':>10}{'warm (s)':>10}{'load (s)':>10}")
        for title, cold, warm, load in rows:
            print(f"{title:<22}{cold:>10.2f}{warm:>10.2f}{load:>10.2f}")
        print(f"first Overview: {rows[0][1]:.2f} s; slowest warm page: {max(r[2] for r in rows):.2f} s; slowest "
              f"load: {max(r[3] for r in rows):.2f} s")
    else:
        rows = measure(db, sid[0] if sid else None, preload=not args.no_preload, skip=skip)
        print(f"{'page':<22}{'cold (s)':>10}{'warm (s)':>10}{'cold/warm':>11}")
        for title, cold, warm in rows:
            print(f"{title:<22}{cold:>10.2f}{warm:>10.2f}{cold / warm if warm else float('inf'):>10.1f}x")
        print(f"slowest cold page: {max(r[1] for r in rows):.2f} s; slowest warm page: {max(r[2] for r in rows):.2f} s")
        import resource

        print(f"peak memory (RSS) of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    if tmp:
        tmp.cleanup()

if __name__ == "__main__":
    main()
