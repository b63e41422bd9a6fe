"""A new, empty store for a test: a file copy of the empty store ``agentobs.model.connect`` made once in this
process, opened with ``connect`` (the migrations are recorded, the model's views carry the current stamp: neither
is made again). Making the tables and binding the model's views on every new store cost a fifth of a CPU-second,
several hundred times per run; a copy costs a millisecond. What a store is made of is still made by the real code,
once per process (and by the tests that create stores through the CLI or the importers)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import duckdb

from agentobs.model import connect

_template: Path | None = None


def _empty() -> Path:
    global _template
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="agentobs-empty-store-"))
        atexit.register(shutil.rmtree, folder, True)
        path = folder / "empty.duckdb"
        connect(path).close()
        _template = path
    return _template


def new_store(path: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """A read-write connection (``agentobs.model.connect``) to a new store at ``path``; an existing file is opened
    as it is."""
    if str(path) != ":memory:" and not Path(path).exists():
        shutil.copyfile(_empty(), path)
    return connect(path)
