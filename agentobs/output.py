"""Rendering tables for the terminal and writing files atomically."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Literal, overload

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich import box
from rich.cells import cell_len, get_character_cell_size
from rich.console import Console
from rich.table import Table
from rich.text import Text

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
    """One value as the table shows it: integers with thousands separators, floats to 4 significant digits
    (whole numbers from 1,000 up), times to the millisecond."""
    if v is None:
        return "∅"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, decimal.Decimal):
        v = int(v) if v.is_finite() and v == v.to_integral_value() else float(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 1e-3 else f"{v:.4g}"
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ", timespec="milliseconds")
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, str):
        return _one_line(v)
    return _one_line(str(v))


def _one_line(s: str) -> str:
    """Line breaks, tabs and runs of blanks as one space: a cell is one line."""
    return " ".join(s.split()) if any(ch.isspace() and ch != " " for ch in s) or "  " in s else s


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


# -- the table format: one line per row, within the terminal's width ---------------------------------------
PIPE_WIDTH = 120  # the width of a table written to a pipe or a file when $COLUMNS is not set
ELLIPSIS = "…"
_GAP = 2  # blanks between two columns (rich: the divider and one left pad; see _rich_table)
# how narrow a column may get before it is dropped instead: prose and ids stop being readable below these
_TEXT_MIN, _ID_MIN, _HEADER_MIN = 24, 20, 10
# the shrinking steps, in order: (prose down to, ids down to, headers): "full" headers on one line, "wrap" on
# two lines split after a '_' (or blank, '-', '/', '.'), "abbrev" cut in the middle. Prose gives way first, then
# ids (whose both ends name things), then headers; within a step columns give way in proportion to their slack.
# When the last step does not fit, the rightmost column is dropped.
_STEPS = ((_TEXT_MIN, None, "full"), (_TEXT_MIN, 32, "full"), (_TEXT_MIN, 24, "full"), (_TEXT_MIN, 24, "wrap"),
          (_TEXT_MIN, _ID_MIN, "wrap"), (_TEXT_MIN, _ID_MIN, "abbrev"))
_SEPARATORS = "_ -/."
FULL_HINT = "--format csv|json"  # where the note under a shortened table sends the reader for the full values


def table_width(console: Console | None = None) -> int:
    """The width tables are fitted to: $COLUMNS when set, else the terminal's width, else (a pipe, a file)
    PIPE_WIDTH."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    console = console or Console()
    return console.width if console.is_terminal else PIPE_WIDTH


def _take(s: str, width: int, from_end: bool = False) -> str:
    """The longest head (or tail) of ``s`` that fits ``width`` terminal cells."""
    out, used = [], 0
    for ch in (reversed(s) if from_end else s):
        n = get_character_cell_size(ch)
        if used + n > width:
            break
        out.append(ch)
        used += n
    return "".join(reversed(out) if from_end else out)


def shorten(s: str, width: int, middle: bool = False) -> str:
    """``s`` cut to ``width`` cells with an ellipsis: at the end (prose), or in the middle (ids, whose both
    ends tell them apart: ``non_affine_rout…3.1-8B-Instruct``)."""
    if cell_len(s) <= width:
        return s
    if width <= 1:
        return ELLIPSIS[:max(width, 0)]
    if not middle or width < 5:
        return _take(s, width - 1) + ELLIPSIS
    tail = (width - 1) // 2
    return _take(s, width - 1 - tail) + ELLIPSIS + _take(s, tail, from_end=True)


def _kind(col: pa.ChunkedArray, cells: list[str]) -> str:
    """num (right-aligned, never cut), fixed (times, booleans: never cut), id (no blanks: cut in the middle) or
    text (prose: cut at the end)."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "num"
    if (pa.types.is_temporal(t) or pa.types.is_boolean(t) or pa.types.is_null(t)):
        return "fixed"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return "text" if any(" " in c for c in cells) else "id"
    return "text"


def _splits(h: str) -> list[tuple[str, str]]:
    """The ways to put a header on two lines: after each separator."""
    return [(h[:i + 1], h[i + 1:]) for i, ch in enumerate(h[:-1]) if ch in _SEPARATORS]


def _two_line_width(h: str) -> int:
    """The least width at which header ``h`` fits on two lines split after a separator (its width if none)."""
    return min((max(cell_len(a.rstrip()), cell_len(b)) for a, b in _splits(h)), default=cell_len(h))


def header_text(h: str, width: int) -> str:
    """The header as shown in ``width`` cells: whole; else on two lines split after a separator (the first
    line as long as fits); else cut in the middle."""
    if cell_len(h) <= width:
        return h
    fits = [(a.rstrip(), b) for a, b in _splits(h) if cell_len(a.rstrip()) <= width and cell_len(b) <= width]
    if fits:
        a, b = max(fits, key=lambda ab: cell_len(ab[0]))
        return f"{a}\n{b}"
    return shorten(h, width, middle=True)


def _shrink(w: list[int], lows: list[int], budget: int) -> list[int]:
    """``w`` narrowed toward ``lows`` until its sum is ``budget`` (or every column is at its low), each column
    giving way in proportion to its slack ``w − low`` (the widest give the most; rounding leftovers go to the
    columns with the most slack left, the rightmost among equals)."""
    excess = sum(w) - budget
    slack = [max(0, a - b) for a, b in zip(w, lows, strict=True)]
    if excess <= 0 or not any(slack):
        return w
    if sum(slack) <= excess:
        return [a - s for a, s in zip(w, slack, strict=True)]
    cut = [s * excess // sum(slack) for s in slack]
    for _ in range(excess - sum(cut)):
        k = max(range(len(w)), key=lambda j: (slack[j] - cut[j], j))
        cut[k] += 1
    return [a - c for a, c in zip(w, cut, strict=True)]


def fit_columns(headers: list[str], cells: list[list[str]], kinds: list[str],
                width: int) -> tuple[list[int], list[int]]:
    """Column widths for one line per row within ``width`` cells: (the indices of the columns shown, their
    widths). Numbers and times keep their full width; prose, ids and headers shrink step by step (_STEPS); when
    even the last step does not fit, the rightmost column (never the first) is
    dropped and the fitting starts again."""
    shown = list(range(len(headers)))
    while True:
        data = [max((cell_len(r[i]) for r in cells), default=0) for i in shown]
        head = [cell_len(headers[i]) for i in shown]
        wrap = [min(h, _two_line_width(headers[i])) for i, h in zip(shown, head, strict=True)]
        w = [max(d, h) for d, h in zip(data, head, strict=True)]
        budget = width - _GAP * (len(shown) - 1)
        for text_to, id_to, headers_as in _STEPS:
            lows = []
            for k, i in enumerate(shown):
                d = data[k]
                least = min(d, text_to) if kinds[i] == "text" else min(d, id_to or d) if kinds[i] == "id" else d
                hf = {"full": head[k], "wrap": wrap[k], "abbrev": min(wrap[k], _HEADER_MIN)}[headers_as]
                lows.append(min(w[k], max(least, hf)))
            w = _shrink(w, lows, budget)
        if sum(w) <= budget or len(shown) == 1:
            return shown, [min(x, width) for x in w]
        shown.pop()


def _render_table(table: pa.Table, title: str | None, console: Console, width: int | None = None,
                  full: str | None = FULL_HINT) -> None:
    width = width or table_width(console)
    names = [_one_line(str(c)) for c in table.column_names]
    cols = [c.to_pylist() for c in table.columns]  # by position: a query may repeat a column name
    cells = [[_fmt(c[n]) for c in cols] for n in range(table.num_rows)]
    kinds = [_kind(table.column(i), [r[i] for r in cells]) for i in range(len(names))]
    shown, widths = fit_columns(list(names), cells, kinds, width)
    out = Console(file=console.file, width=width, force_terminal=console.is_terminal,
                  color_system=console.color_system,  # type: ignore[arg-type]  # rich types the property str, the argument a Literal of the same names
                  no_color=console.no_color, highlight=False, soft_wrap=False)
    total = sum(widths) + _GAP * (len(widths) - 1)
    if title and cell_len(title) > total:  # rich would wrap a title wider than the table: one line of its own
        out.print(Text(shorten(title, width), style="italic"), no_wrap=True, overflow="ellipsis")
        title = None
    t = _rich_table(title)
    cut = False
    for i, w in zip(shown, widths, strict=True):
        t.add_column(Text(header_text(names[i], w)), width=w, no_wrap=True, overflow="ellipsis", vertical="bottom",
                     justify="right" if kinds[i] == "num" else "left")
    for r in cells:
        row = []
        for i, w in zip(shown, widths, strict=True):
            v = shorten(r[i], w, middle=kinds[i] != "text")
            cut = cut or v != r[i]
            row.append(Text(v))
        t.add_row(*row)
    out.print(t)
    hidden = [names[i] for i in range(len(names)) if i not in shown]
    notes = []
    if hidden:
        notes.append(f"{len(hidden)} column(s) not shown at width {width}: {', '.join(hidden)}")
    if cut:
        notes.append(f"{ELLIPSIS} marks shortened values")
    if notes:
        out.print(Text("; ".join(notes) + (f" (every column and full values: {full})" if full else ""), style="dim"))


def _rich_table(title: str | None) -> Table:
    # no outer border and no vertical lines: a header, a rule, one line per row; columns _GAP blanks apart
    return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1),
                 header_style="bold", expand=False)


def rel_err_column(col: str) -> str:
    """The column that states the relative error bound of a metric's estimated column ``col`` (a percentile read from
    a quantile sketch: ``ttft_p99_s`` → ``ttft_p99_rel_err``, ``miss_penalty`` → ``miss_penalty_rel_err``)."""
    return col.removesuffix("_s").removesuffix("_ms") + "_rel_err"


def bound_text(rel_err) -> str:
    """`` ±1%`` for a relative error bound of 0.01; empty when there is none (an exact value)."""
    if rel_err is None or (isinstance(rel_err, float) and math.isnan(rel_err)):
        return ""
    return f" ±{float(rel_err):.0%}"


def fold_bounds(table: pa.Table) -> pa.Table:
    """For display: each column with a stated bound (``rel_err_column``) as text with it (``2.31 ±1%``), the bound
    columns dropped. Tables without any are returned as they are (csv/json/parquet keep both columns)."""
    names = table.column_names
    pairs = {c: rel_err_column(c) for c in names if rel_err_column(c) != c and rel_err_column(c) in names}
    if not pairs:
        return table
    cols, out = {}, []
    for c in names:
        if c in pairs.values():
            continue
        if c in pairs:
            vals, errs = table.column(c).to_pylist(), table.column(pairs[c]).to_pylist()
            cols[c] = pa.array([None if v is None else f"{v:,.4g}{bound_text(e)}" for v, e in zip(vals, errs, strict=True)],
                               pa.string())
        else:
            cols[c] = table.column(c)
        out.append(c)
    return pa.table({c: cols[c] for c in out})


@overload
def render(table: pa.Table, fmt: Literal["csv", "json", "parquet"], title: str | None = ...,
           console: Console | None = ..., width: int | None = ..., full: str | None = ...) -> bytes: ...
@overload
def render(table: pa.Table, fmt: str = ..., title: str | None = ..., console: Console | None = ...,
           width: int | None = ..., full: str | None = ...) -> bytes | None: ...
def render(table: pa.Table, fmt: str = "table", title: str | None = None, console: Console | None = None,
           width: int | None = None, full: str | None = FULL_HINT) -> bytes | None:
    """Print a table (fitted to ``width``, default table_width: one line per row, long values shortened; ``full``
    names where the full values are, in the note under a shortened table), or return the bytes of
    csv/json/parquet output (every value in full)."""
    if fmt == "table":
        _render_table(fold_bounds(table), title, console or Console(), width, full)
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
