"""Write a report directory atomically: every file goes into a hidden sibling folder first, which then
replaces ``out`` by rename, so a reader (a web server, a mail job) never sees a half-written report.

Layout::

    out/report.html        self-contained page (inline CSS + SVG; opens offline)
    out/summary.md         Markdown summary for chat or email
    out/manifest.json      period, figures, files, timings — for automation
    out/tables/NAME.csv    every attribution table, all rows and columns
    out/tables/NAME.parquet
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import AgentobsError
from ..output import atomic_write, render
from . import render as rr
from .build import Report


def _clean(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def manifest(report: Report, files: list[str]) -> dict:
    return {
        "period": {"label": report.period.label, "since": report.period.since, "until": report.period.until},
        "previous": {"label": report.previous.label, "since": report.previous.since, "until": report.previous.until},
        "generated_at": report.generated_at,
        "db": report.db,
        "has_data": report.has_data,
        "calls": report.calls,
        "figures": {f.key: {"label": f.label, "value": _clean(f.value), "previous": _clean(f.previous),
                            "unit": f.unit, "basis": f.basis}
                    for s in report.sections for f in s.figures},
        "notes": [n for s in report.sections for n in s.notes],
        "tables": {t.name: {"title": t.title, "basis": t.basis, "rows": t.data.num_rows} for t in report.tables()},
        "files": files,
        "timings_s": {k: round(v, 4) for k, v in report.timings.items()},
    }


def write(report: Report, out: str | os.PathLike) -> Path:
    """Write the report into directory ``out`` (replacing an earlier report there) and return it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AgentobsError(f"--out {str(out)!r} is a file; give a directory")
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.tmp-"))
    try:
        files: list[str] = []

        def put(rel: str, data: bytes) -> None:
            atomic_write(tmp / rel, data)
            files.append(rel)

        put("report.html", rr.html(report).encode())
        put("summary.md", rr.markdown(report).encode())
        for t in report.tables():
            put(f"tables/{t.name}.csv", render(t.data, "csv"))
            put(f"tables/{t.name}.parquet", render(t.data, "parquet"))
        put("manifest.json", (json.dumps(manifest(report, files + ["manifest.json"]), indent=1) + "\n").encode())
        os.chmod(tmp, 0o755)
        _swap(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _swap(new: Path, out: Path) -> None:
    """Put ``new`` at ``out``. A directory cannot be renamed over a non-empty one, so an existing
    report is first renamed aside (still complete), then the new one takes its name, then the old one goes."""
    if not out.exists():
        os.replace(new, out)
        return
    old = Path(tempfile.mkdtemp(dir=new.parent, prefix=f".{out.name}.old-"))
    os.rmdir(old)
    os.replace(out, old)
    try:
        os.replace(new, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
