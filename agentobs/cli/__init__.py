"""The ``agentobs`` command line: one module per command group, each thin over the library.

Every command takes ``--db PATH`` (default: the setting ``db``) and ``--config``.
Errors print one line and exit non-zero; ``--debug`` shows the traceback. ``base`` holds the group, the
shared options and the output helpers; importing this package registers every command on ``cli``.
"""

from __future__ import annotations

from . import (  # noqa: F401 - registers every command
    clickhouse,
    collect,
    console,
    findings,
    ingest,
    loadgen,
    metrics,
    query,
    report,
    sim,
    trace,
    whatif,
)
from .base import _filters, cli, main
from .sim import HEADLINE_SQL

__all__ = ["HEADLINE_SQL", "_filters", "cli", "main"]
