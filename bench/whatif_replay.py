"""What-if replay cost and calibration on a store (default: sample_data/fleet imported into a temp store).

    python bench/whatif_replay.py [--db STORE] [--sessions 200 400 753] [--change prefix_cache=on]

Prints, per replay size: sessions and calls replayed, seconds (preparing the metric run, building the replay,
simulating both sides), and the fleet calibration errors (unchanged replay vs observed, same sessions)."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from agentobs.config import Settings
from agentobs.findings.whatif import run
from agentobs.source import as_source

ROOT = Path(__file__).resolve().parent.parent


def sample_store(tmp: Path) -> Path:
    from agentobs.collect.bundle import import_bundle
    from agentobs.model import connect
    from agentobs.store.writer import Writer

    db = tmp / "sample.duckdb"
    con = connect(db)
    with Writer(con) as w:
        import_bundle(ROOT / "sample_data" / "fleet", w, Settings())
    con.close()
    return db


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db")
    ap.add_argument("--sessions", type=int, nargs="+", default=[200])
    ap.add_argument("--change", action="append", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = a.db or str(sample_store(Path(tmp)))
        for n in a.sessions:
            t0 = time.perf_counter()
            w = run(as_source(db), a.change or ["prefix_cache=on"], settings=Settings(), sessions=n)
            dt = time.perf_counter() - t0
            cal = {c.figure: c.error for c in w.calibration if c.scope == "fleet"}
            print(f"{w.sessions_replayed:5d} of {w.sessions_total} sessions, {w.calls_replayed:6d} calls: {dt:6.2f} s "
                  f"(report {w.computed_s:.2f} s); calibration " +
                  ", ".join(f"{k} {v:+.1%}" for k, v in cal.items() if v is not None))


if __name__ == "__main__":
    main()
