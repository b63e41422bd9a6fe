"""The native decoder's CPU per span with and without its C extension, alternated in one process.

    python bench/decode_native.py [--rounds 5] [--repeat 10] [--requests 8] [--spans 512]

Each round decodes the same loader batch (``--requests`` bench requests of ``--spans`` spans each, as the
loader batches them: ``otlp_native.decode_bodies``, then ``loader.decode_records`` over a spool of the same
bodies — spool read, decode, in-batch dedupe, Arrow IPC) ``--repeat`` times with the C extension
(agentobs/collect/_native_json.c) and as often with the Arrow path it replaces (``use_c_ext(False)``),
alternated batch by batch (so both see the same machine load), and prints the process CPU per span of each
and their ratio; the last line is the medians over the rounds (``ratio``: the median of the rounds' C ÷ Arrow,
each pair measured under the same load):
``decode_c_us=<µs> decode_arrow_us=<µs> ratio=<c÷arrow> records_c_us=<µs> records_arrow_us=<µs>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _spans import payload  # noqa: E402

from agentobs.collect import otlp_native  # noqa: E402
from agentobs.collect.loader import decode_records  # noqa: E402
from agentobs.collect.spool import Spool  # noqa: E402
from agentobs.config import load_settings  # noqa: E402


def _cpu(fn) -> float:
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=10, help="decodes of the batch per measurement")
    ap.add_argument("--requests", type=int, default=8, help="requests per loader batch (the loader's default: 8)")
    ap.add_argument("--spans", type=int, default=512, help="spans per request")
    a = ap.parse_args()
    if otlp_native.C_EXT is None:
        sys.exit("the C extension is not built: python setup.py build_ext --inplace")
    settings = load_settings(env={})
    bodies = [payload(a.spans, seed) for seed in range(a.requests)]
    sources = ["otlp-http"] * a.requests
    total = a.requests * a.spans
    with tempfile.TemporaryDirectory() as tmp:
        sp = Spool(Path(tmp) / "spool", fsync=False)
        for b in bodies:
            sp.append(b, "protobuf", "http")
        items = [(str(sp.path(r.seq)), r.offset, r.length, r.fmt, r.transport, r.seq)
                 for r in sp.read_from(0, 0, 10**6, 1 << 40)]

        def decode():
            res = otlp_native.decode_bodies(bodies, sources, settings)
            assert res.fallback_requests == [] and sum(res.accepted) == total

        def records():
            assert decode_records(items, settings).accepted == total

        for on in (True, False):  # warm-up: imports, kernels, ptars' handlers
            otlp_native.use_c_ext(on)
            decode()
            records()
        rows: dict[str, list[float]] = {"decode_c": [], "decode_arrow": [], "records_c": [], "records_arrow": []}
        print(f"{total} spans a batch ({a.requests} requests × {a.spans}), {a.repeat} batches of each way a round, "
              f"the two ways alternated batch by batch; load average {os.getloadavg()[0]:.2f}")
        for r in range(a.rounds):
            cpu = dict.fromkeys(rows, 0.0)
            for k in range(a.repeat):
                for on, name in ((True, "c"), (False, "arrow")) if (r + k) % 2 == 0 else ((False, "arrow"), (True, "c")):
                    otlp_native.use_c_ext(on)
                    cpu[f"decode_{name}"] += _cpu(decode)
                    cpu[f"records_{name}"] += _cpu(records)
            for key in rows:
                rows[key].append(cpu[key] / (a.repeat * total) * 1e6)
            print(f"round {r + 1}: decode_bodies µs CPU/span C {rows['decode_c'][-1]:.2f} / Arrow "
                  f"{rows['decode_arrow'][-1]:.2f} (ratio {rows['decode_c'][-1] / rows['decode_arrow'][-1]:.2f}); "
                  f"decode_records C {rows['records_c'][-1]:.2f} / Arrow {rows['records_arrow'][-1]:.2f}; "
                  f"load {os.getloadavg()[0]:.2f}")
        sp.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratio = statistics.median(c / b for c, b in zip(rows["decode_c"], rows["decode_arrow"], strict=True))
    print(f"decode_c_us={med['decode_c']:.2f} decode_arrow_us={med['decode_arrow']:.2f} "
          f"ratio={ratio:.2f} records_c_us={med['records_c']:.2f} records_arrow_us={med['records_arrow']:.2f}")


if __name__ == "__main__":
    main()
