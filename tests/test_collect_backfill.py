"""Prometheus HTTP API backfill against a real HTTP server on port 0 answering like Prometheus."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from agentobs.collect.backfill import backfill, engine_metric_names, parse_duration
from agentobs.errors import InputError
from agentobs.model import connect
from agentobs.store.writer import Writer

NAMES = ["up", "vllm:prompt_tokens_total", "vllm:prompt_tokens_created", "sglang_cached_tokens_total",
         "node_cpu_seconds_total"]


class FakePrometheus:
    """Serves /api/v1/label/__name__/values and /api/v1/query_range from an in-memory series set;
    every query_range call is recorded."""

    def __init__(self, series):
        self.series = series  # name -> list of (labels, {ts: value})
        self.queries: list[dict] = []
        me = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                u = urlsplit(self.path)
                q = {k: v[0] for k, v in parse_qs(u.query).items()}
                if u.path == "/api/v1/label/__name__/values":
                    body = {"status": "success", "data": NAMES}
                elif u.path == "/api/v1/query_range":
                    me.queries.append(q)
                    name = q["query"].split('"')[1]
                    start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
                    if name == "broken":
                        return self._send(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})
                    result = []
                    for labels, points in me.series.get(name, []):
                        vals = [[ts, str(v)] for ts, v in sorted(points.items()) if start <= ts <= end
                                and (ts - start) % step == 0]
                        if vals:
                            result.append({"metric": {"__name__": name, **labels}, "values": vals})
                    body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
                else:
                    return self._send(404, {"status": "error", "error": "not found"})
                self._send(200, body)

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # a 0.05 s poll: close() (shutdown) waits for it, 0.5 s by default
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_backfill_maps_instance_names_and_windows(tmp_path):
    t0 = 1_791_900_000
    prom = FakePrometheus({
        "vllm:prompt_tokens_total": [
            ({"instance": "10.0.0.1:8000", "job": "vllm", "engine": "0", "model_name": "q"},
             {t0 + 15 * i: 100.0 * i for i in range(40)}),
        ],
        "sglang_cached_tokens_total": [
            ({"instance": "10.0.0.2:30000", "job": "sglang", "model_name": "l"}, {t0: 5.0, t0 + 15: "NaN"}),
        ],
    })
    con = connect(tmp_path / "b.duckdb")
    try:
        assert engine_metric_names(prom.url) == ["sglang_cached_tokens_total", "vllm:prompt_tokens_total"]
        with Writer(con, flush_s=0) as w:
            # 10 minutes at 15 s; windows of 10,000 steps → one query per metric
            res = backfill(prom.url, 600, 15, w, end=t0 + 585)
        assert (res.names, res.series, res.samples, res.inserted, res.errors) == (2, 2, 42, 42, [])
        assert len(prom.queries) == 2
        assert prom.queries[0]["query"] == '{__name__="sglang_cached_tokens_total"}'
        rows = con.execute("SELECT instance, metric, labels_key, count(*), max(value), min(engine) FROM metric_samples "
                           "GROUP BY ALL ORDER BY 1").fetchall()
        # Prometheus' instance label became the instance; job dropped; sglang_ stored as sglang:
        assert rows[0][:4] == ("10.0.0.1:8000", "vllm:prompt_tokens_total", "engine=0,model_name=q", 40)
        assert rows[0][4:] == (3900.0, "vllm")
        assert rows[1][:4] == ("10.0.0.2:30000", "sglang:cached_tokens_total", "model_name=l", 2)
        # idempotent: a second run inserts nothing
        with Writer(con, flush_s=0) as w:
            again = backfill(prom.url, 600, 15, w, end=t0 + 585)
        assert again.samples == 42 and again.inserted == 0
        # a long range is split into windows of at most 10,000 steps: 30 days at 60 s = 43,200 steps → 5
        prom.queries.clear()
        with Writer(con, flush_s=0) as w:
            backfill(prom.url, 30 * 86400, 60, w, end=t0, names=["vllm:prompt_tokens_total"])
        assert len(prom.queries) == 5
        assert all((float(q["end"]) - float(q["start"])) / 60 <= 10_000 for q in prom.queries)
    finally:
        con.close()
        prom.close()


def test_backfill_errors_are_reported_per_query(tmp_path):
    prom = FakePrometheus({})
    con = connect(tmp_path / "b.duckdb")
    try:
        with Writer(con, flush_s=0) as w:
            res = backfill(prom.url, 60, 15, w, end=1_791_900_000, names=["broken", "vllm:x"])
        assert res.samples == 0 and len(res.errors) == 1
        assert "HTTP 400: bad_data parse error" in res.errors[0]
        with pytest.raises(InputError, match="connection_refused"):
            engine_metric_names("http://127.0.0.1:1")
    finally:
        con.close()
        prom.close()


@pytest.mark.parametrize("text,seconds", [("15s", 15), ("5m", 300), ("7d", 604800), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text, "--since") == seconds


@pytest.mark.parametrize("text", ["7", "d", "-1d", "1y", "0s"])
def test_bad_durations(text):
    with pytest.raises(InputError, match="--since"):
        parse_duration(text, "--since")
