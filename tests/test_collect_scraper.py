"""Fleet scraper against a real HTTP server on port 0 serving fixture scrapes and /server_info."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentobs.collect.fleet import Target, parse_fleet
from agentobs.collect.health import Health
from agentobs.collect.prom import parse_text
from agentobs.collect.promcache import SeriesParser
from agentobs.collect.scraper import Scraper
from agentobs.config import load_settings
from agentobs.errors import ConfigError, InputError
from agentobs.model import connect
from agentobs.store.writer import Writer

FIX = Path(__file__).parent / "fixtures"
VLLM = (FIX / "vllm" / "metrics_sample.txt").read_text()
SGLANG = (FIX / "sglang" / "metrics_sample.txt").read_text()
INFO = json.dumps({**json.loads((FIX / "sglang" / "server_info.json").read_text()), "api_key": "sk-live-123"})


class Site:
    """A real HTTP server; ``pages[path] = (status, body)``, changeable while it runs."""

    def __init__(self):
        self.pages: dict[str, tuple[int, bytes]] = {}
        site = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                status, body = site.pages.get(self.path, (404, b"not found"))
                if status == 0:  # hang past the client's timeout
                    threading.Event().wait(1.0)
                    status = 200
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        # a 0.05 s poll: close() (shutdown) waits for it, 0.5 s by default
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def site():
    s = Site()
    yield s
    s.close()


@pytest.fixture()
def store(tmp_path):
    con = connect(tmp_path / "s.duckdb")
    w = Writer(con, flush_s=0)
    yield con, w
    w.close()
    con.close()


def _norm(rows):
    return [{**r, "value": "nan" if math.isnan(r["value"]) else r["value"]} for r in rows]


@pytest.mark.parametrize("path", ["vllm/metrics_sample.txt", "sglang/metrics_sample.txt",
                                  "vllm_real/ample/metrics_after.txt"])
def test_series_parser_equals_prometheus_client_parse(path):
    text = (FIX / path).read_text()
    sp = SeriesParser("h:1")
    full = parse_text(text, "h:1", 100.0)
    want = _norm(full.samples.to_pylist())
    first = sp.parse(text, 100.0)
    assert _norm(first.samples.to_pylist()) == want  # first scrape: every line learnt
    # the same engine config (vLLM: cache_config_info labels + served_model_name from the model_name label)
    assert sorted(first.config or []) == sorted(zip(full.config.column("key").to_pylist(),
                                                    full.config.column("value").to_pylist(), strict=True))
    # second scrape from the cache, values changed: only the value column differs
    bumped = "\n".join(ln if ln.startswith("#") or not ln else ln.rsplit(" ", 1)[0] + " 7" for ln in text.split("\n"))
    got = sp.parse(bumped, 100.0).samples.to_pylist()
    assert [r["value"] for r in got] == [7.0] * len(want)
    assert [{**r, "value": 0} for r in got] == [{**r, "value": 0} for r in want]


def test_series_parser_malformed_lines():
    sp = SeriesParser("h:1")
    sp.parse('vllm:num_requests_running{engine="0"} 1\n', 0)
    # a known series with a value that is not a number goes to prometheus_client, which refuses it
    with pytest.raises(InputError, match=r"line 1: .*'vllm:num_requests_running\{engine=\"0\"\} abc'"):
        sp.parse('vllm:num_requests_running{engine="0"} abc\n', 0)
    with pytest.raises(InputError, match="line 2"):
        sp.parse('vllm:num_requests_running{engine="0"} 1\nvllm:x{engine="0" 2\n', 0)
    # a line with a timestamp is never cached by its "series value" prefix
    t1 = sp.parse('vllm:y 1 1700000000000\n', 0).samples.column("value").to_pylist()
    t2 = sp.parse('vllm:y 1 1700000001000\n', 0).samples.column("value").to_pylist()
    assert t1 == t2 == [1.0]


def test_scrape_round_stores_samples_config_and_records(site, store):
    con, w = store
    site.pages["/v/metrics"] = (200, VLLM.encode())
    site.pages["/s/metrics"] = (200, SGLANG.encode())
    site.pages["/server_info"] = (200, INFO.encode())
    site.pages["/bad/metrics"] = (200, b"this is { not prometheus\n")
    targets = [
        Target(site.url("/v/metrics"), "vllm-0:8000", "auto", {"pool": "a"}),
        Target(site.url("/s/metrics"), "sglang-0:30000", "sglang"),
        Target(site.url("/missing/metrics"), "gone:1", "auto"),
        Target(site.url("/bad/metrics"), "bad:1", "auto"),
        Target("http://127.0.0.1:1/metrics", "refused:1", "auto", timeout_s=2),
    ]
    health = Health()
    clock = iter([1000.0, 1000.0, 1000.0, 1000.0, 1000.0, 1015.0, 1015.0, 1015.0, 1015.0, 1015.0])
    sc = Scraper(targets, w, health, clock=lambda: next(clock), concurrency=1)
    res = {r.instance: r for r in sc.scrape_all()}
    assert {k: (r.ok, r.reason) for k, r in res.items()} == {
        "vllm-0:8000": (True, None), "sglang-0:30000": (True, None), "gone:1": (False, "http_404"),
        "bad:1": (False, "parse_error"), "refused:1": (False, "connection_refused")}
    assert res["vllm-0:8000"].config_stored and res["sglang-0:30000"].info_stored
    res2 = {r.instance: r for r in sc.scrape_all()}  # second round: nothing changed, no new config rows
    assert not res2["vllm-0:8000"].config_stored and not res2["sglang-0:30000"].info_stored
    w.flush()
    # 465 vLLM samples and 527 SGLang samples per scrape: the *_created series are not stored but the two of
    # prom.KEPT_CREATED vLLM has (prefix_cache_hits/queries_created; the fixture has no gpu_ ones)
    assert con.execute("SELECT instance, count(*) FROM metric_samples GROUP BY 1 ORDER BY 1").fetchall() == [
        ("sglang-0:30000", 2 * 527), ("vllm-0:8000", 2 * 465)]
    assert con.execute("SELECT DISTINCT metric FROM metric_samples WHERE metric LIKE '%created' "
                       "ORDER BY 1").fetchall() == [("vllm:prefix_cache_hits_created",),
                                                    ("vllm:prefix_cache_queries_created",)]
    # the target's extra label is on every sample, the engine detected from the names
    assert con.execute("SELECT count(*), min(engine) FROM metric_samples WHERE instance = 'vllm-0:8000' "
                       "AND labels['pool'] = 'a'").fetchone() == (930, "vllm")
    assert con.execute("SELECT value FROM engine_config WHERE instance = 'vllm-0:8000' "
                       "AND key = 'block_size'").fetchall() == [("16",)]
    assert con.execute("SELECT value FROM engine_config WHERE instance = 'sglang-0:30000' "
                       "AND key = 'api_key'").fetchall() == [("<redacted>",)]
    assert con.execute("SELECT count(*) FROM engine_config WHERE value LIKE '%sk-live-123%'").fetchone() == (0,)
    assert con.execute("SELECT count(DISTINCT ts) FROM engine_config").fetchone() == (1,)
    rows = con.execute("SELECT instance, ok, split_part(error, ':', 1), samples FROM scrapes "
                       "WHERE ts = TIMESTAMP '1970-01-01 00:16:40' ORDER BY instance").fetchall()
    assert rows == [("bad:1", False, "parse_error", 0), ("gone:1", False, "http_404", 0),
                    ("refused:1", False, "connection_refused", 0), ("sglang-0:30000", True, None, 527),
                    ("vllm-0:8000", True, None, 465)]
    assert health.value("agentobs_scrape_errors_total", {"target": "gone:1", "reason": "http_404"}) == 2
    assert health.value("agentobs_scrapes_total", {"outcome": "ok"}) == 4


def test_config_change_is_stored_and_timeout_counted(site, store):
    con, w = store
    site.pages["/v/metrics"] = (200, VLLM.encode())
    site.pages["/slow/metrics"] = (0, b"")
    clock = iter(range(10**6))
    sc = Scraper([Target(site.url("/v/metrics"), "v:1", "vllm"),
                  Target(site.url("/slow/metrics"), "slow:1", "auto", timeout_s=0.2)], w,
                 clock=lambda: float(next(clock)), concurrency=2)
    sc.scrape_all()
    site.pages["/v/metrics"] = (200, VLLM.replace('block_size="16"', 'block_size="32"').encode())
    res = {r.instance: r for r in sc.scrape_all()}
    assert res["v:1"].config_stored and res["slow:1"].reason == "timeout"
    w.flush()
    assert [r[0] for r in con.execute("SELECT value FROM engine_config WHERE key = 'block_size' "
                                      "ORDER BY ts").fetchall()] == ["16", "32"]


def test_scrape_loop_runs_and_stops(site, store):
    con, w = store
    site.pages["/v/metrics"] = (200, VLLM.encode())
    sc = Scraper([Target(site.url("/v/metrics"), "v:1", "vllm", interval_s=0.2)], w, jitter=0.1)
    stop = threading.Event()
    t = threading.Thread(target=sc.run, args=(stop,))
    t.start()
    stop.wait(1.0)
    stop.set()
    t.join(5)
    assert not t.is_alive()
    w.flush()
    (n,) = con.execute("SELECT count(*) FROM scrapes WHERE ok").fetchone()
    assert 2 <= n <= 6  # 1 s at a 0.2 s interval (+ up to 10% jitter), first one within 0.2 s


FLEET_ERRORS = [
    ({"scrape": {"targets": [{"url": "ftp://x/metrics"}]}}, "scrape.targets[0]: 'ftp://x/metrics' is not an http(s) URL"),
    ({"scrape": {"targets": [{"url": "http://a:1/metrics", "engin": "vllm"}]}}, "unknown key 'engin' (did you mean 'engine'?)"),
    ({"scrape": {"targets": [{"url": "http://a:1/m", "engine": "tgi"}]}}, "engine 'tgi' must be one of auto, vllm, sglang"),
    ({"scrape": {"targets": ["http://a:1/m", "http://a:1/m2"]}}, "instance 'a:1' is listed twice"),
    ({"scrape": {"interval_s": 0}}, "scrape.interval_s: must be a positive number, got 0"),
    ({"kv_events": [{"endpoint": "tcp://*:5557", "instance": "a:1"}]}, "has a wildcard"),
    ({"kv_events": [{"endpoint": "tcp://h:5557"}]}, "kv_events[0]: 'instance' is required"),
    ({"receiver": {"http": "4318"}}, "receiver.http: '4318' must be host:port"),
    ({"recevier": {}}, "unknown key 'recevier' (did you mean 'receiver'?)"),
]


@pytest.mark.parametrize("doc,msg", FLEET_ERRORS, ids=[m for _, m in FLEET_ERRORS])
def test_fleet_file_errors(doc, msg):
    with pytest.raises(ConfigError) as ei:
        parse_fleet(doc, load_settings(env={}), "fleet.yaml")
    assert msg in str(ei.value) and str(ei.value).startswith("fleet.yaml: ")


def test_example_fleet_file_parses():
    from agentobs.collect.fleet import load_fleet

    f = load_fleet(Path(__file__).parents[1] / "collectors" / "fleet.yaml", load_settings(env={}))
    assert {t.engine for t in f.targets} == {"vllm", "sglang", "auto"} and f.kv and f.grpc and f.http
    assert json.dumps([t.instance for t in f.targets])  # every target got an instance


def _page(n: int) -> bytes:
    """n distinct series of one gauge (each new to the parser: the slow path)."""
    return ("# TYPE vllm:num_requests_running gauge\n"
            + "".join(f'vllm:num_requests_running{{engine="{i}"}} {i}\n' for i in range(n))).encode()


def test_too_many_series_is_a_scrape_error_and_stores_none(store):
    """300 series against a cap of 100: the scrape is refused as too_many_series (no samples stored), recorded in
    `scrapes`; a page of 100 is stored."""
    from agentobs.collect.scraper import Response

    con, w = store
    pages = {"big": _page(300), "ok": _page(100)}
    sc = Scraper([Target("http://big:1/metrics", "big:1", "vllm", max_series=100),
                  Target("http://ok:1/metrics", "ok:1", "vllm", max_series=100)], w,
                 fetch=lambda url, timeout: Response(200, pages[url[7:-10]]), clock=lambda: 1000.0, concurrency=1)
    res = {r.instance: r for r in sc.scrape_all()}
    assert (res["big:1"].ok, res["big:1"].reason, res["big:1"].samples) == (False, "too_many_series", 0)
    assert (res["ok:1"].ok, res["ok:1"].samples) == (True, 100)
    w.flush()
    assert con.execute("SELECT instance, count(*) FROM metric_samples GROUP BY 1").fetchall() == [("ok:1", 100)]
    (err,) = con.execute("SELECT error FROM scrapes WHERE instance = 'big:1'").fetchone()
    assert err == "too_many_series: more than 100 series (scrape_max_series); none stored"  # stopped at line 256
    assert sc.health.value("agentobs_scrape_errors_total", {"target": "big:1", "reason": "too_many_series"}) == 1


def test_timeout_covers_the_parse(store):
    """A page that is fetched at once but takes far longer to parse than the target's 1 ms timeout (20,000 new
    series through prometheus_client, tens of µs each): a timeout, nothing stored, the row says so."""
    from agentobs.collect.scraper import Response

    con, w = store
    sc = Scraper([Target("http://slow:1/metrics", "slow:1", "vllm", timeout_s=0.001)], w,
                 fetch=lambda url, timeout: Response(200, _page(20_000)), clock=lambda: 1000.0)
    (res,) = sc.scrape_all()
    assert (res.ok, res.reason) == (False, "timeout")
    w.flush()
    assert con.execute("SELECT count(*) FROM metric_samples").fetchone() == (0,)
    assert con.execute("SELECT split_part(error, ':', 1), samples FROM scrapes").fetchall() == [("timeout", 0)]


def test_a_refused_target_keeps_its_schedule(site, store):
    """A target over its series cap, every 0.2 s for 1 s: it is scraped (and refused) on schedule, never skipped."""
    con, w = store
    site.pages["/big/metrics"] = (200, _page(300))
    sc = Scraper([Target(site.url("/big/metrics"), "big:1", "vllm", interval_s=0.2, max_series=100)], w, jitter=0.1)
    stop = threading.Event()
    t = threading.Thread(target=sc.run, args=(stop,))
    t.start()
    stop.wait(1.0)
    stop.set()
    t.join(5)
    w.flush()
    (n,) = con.execute("SELECT count(*) FROM scrapes WHERE error LIKE 'too_many_series:%'").fetchone()
    assert 2 <= n <= 6  # as test_scrape_loop_runs_and_stops: 1 s at a 0.2 s interval
    assert sc.health.value("agentobs_scrape_drops_total", {"reason": "overrun"}) == 0


def test_fleet_file_series_cap():
    f = parse_fleet({"scrape": {"max_series": 500, "targets": ["http://a:1/m", {"url": "http://b:1/m",
                                                                                "max_series": 7}]}},
                    load_settings(env={}), "fleet.yaml")
    assert [t.max_series for t in f.targets] == [500, 7]
    assert parse_fleet({"scrape": {"targets": ["http://a:1/m"]}}, load_settings(env={})).targets[0].max_series \
        == load_settings(env={}).scrape_max_series == 50_000
