"""Which engine a command reads: the DuckDB store (``--db``) or ClickHouse (``--clickhouse-url``).

``open_source(settings, backend, url, db)`` yields what agentobs.metrics.prepare, agentobs.findings.run,
agentobs.report.build and agentobs.exporter take as ``db``: the DuckDB path, or an open
agentobs.backends.clickhouse ``ClickHouse`` connection (closed on exit). The metric SQL is the same for
both: on ClickHouse it is transpiled (agentobs/backends/clickhouse/dialect.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..config import Settings
from ..errors import ConfigError

BACKENDS = ("duckdb", "clickhouse")


def is_clickhouse(db) -> bool:
    """Whether ``db`` (what open_source yields, or what the metrics API takes) is a ClickHouse connection.
    agentobs.backends.clickhouse.conn imports no ClickHouse client at module level, so this is cheap."""
    from .clickhouse.conn import ClickHouse

    return isinstance(db, ClickHouse)


def resolve(settings: Settings, backend: str | None = None, url: str | None = None) -> tuple[str, str]:
    """(backend, ClickHouse URL): the flag when given, else the setting (``backend``, ``clickhouse_url``;
    environment ``AGENTOBS_BACKEND`` / ``AGENTOBS_CLICKHOUSE_URL``, or the settings file)."""
    name = (backend or settings.backend or "duckdb").strip().lower()
    if name not in BACKENDS:
        raise ConfigError(f"backend {name!r}: choose duckdb or clickhouse (--backend, setting backend, $AGENTOBS_BACKEND)")
    return name, url or str(settings.clickhouse_url)


@contextmanager
def open_source(settings: Settings, backend: str | None = None, url: str | None = None,
                db: str | None = None) -> Iterator:
    name, ch_url = resolve(settings, backend, url)
    if name == "duckdb":
        yield db if db is not None else settings.db
        return
    from .clickhouse.conn import ClickHouse

    ch = ClickHouse(ch_url)
    try:
        yield ch
    finally:
        ch.close()
