"""The weekly cost-attribution report (docs/report.md).

    from agentobs.report import build, iso_week, write
    report = build(as_source("agentobs.duckdb"), iso_week("2026-W48"))  # agentobs.source.as_source
    write(report, "reports/2026-W48")    # report.html, summary.md, manifest.json, tables/*.csv|parquet
"""

from __future__ import annotations

from .build import Figure, Report, Section, Table, build, console_link
from .period import Period, iso_week, last_full_week, resolve
from .write import write

__all__ = ["Figure", "Period", "Report", "Section", "Table", "build", "console_link", "iso_week", "last_full_week",
           "resolve", "write"]
