"""Rendering tables for the terminal and writing files atomically."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.markup import escape
from rich.table import Table

FORMATS = ("table", "csv", "json", "parquet")


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same folder, then rename: readers never see a partial file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fmt(v) -> str:
    if v is None:
        return "∅"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ", timespec="milliseconds")
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _jsonable(v):
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def render(table: pa.Table, fmt: str = "table", title: str | None = None, console: Console | None = None) -> bytes | None:
    """Print a table, or return the bytes of csv/json/parquet output."""
    if fmt == "table":
        console = console or Console()
        t = Table(title=title, show_lines=False, header_style="bold")
        for name in table.column_names:
            t.add_column(escape(name), overflow="fold")
        for row in table.to_pylist():
            t.add_row(*(escape(_fmt(row[c])) for c in table.column_names))
        console.print(t)
        return None
    if fmt == "csv":
        buf = io.BytesIO()
        simple = pa.table({n: (c if not (pa.types.is_list(c.type) or pa.types.is_map(c.type) or pa.types.is_struct(c.type))
                               else pa.array([json.dumps(_jsonable(x)) for x in c.to_pylist()]))
                           for n, c in zip(table.column_names, table.columns, strict=True)})
        pacsv.write_csv(simple, buf)
        return buf.getvalue()
    if fmt == "json":
        return (json.dumps([_jsonable(r) for r in table.to_pylist()], indent=1) + "\n").encode()
    if fmt == "parquet":
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
