"""Render a built Report as one self-contained HTML page (inline CSS and SVG, no scripts, no external
references) and as a Markdown summary for chat or email."""

from __future__ import annotations

import datetime as dt
import math
from html import escape

import pyarrow as pa

from ..output import bound_text, rel_err_column
from . import svg
from .build import Chart, Figure, Report, Table

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1100px;color:#1d2330;
padding:0 1rem;line-height:1.4}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{margin-top:2.2rem;border-bottom:1px solid #dde3ec;padding-bottom:.3rem}
h3{margin-top:1.4rem;font-size:1.05rem}.basis{color:#5b6578;font-size:.85rem}.note{background:#fff7e0;
padding:.4rem .6rem;border-left:3px solid #e0b400;margin:.4rem 0}.empty{background:#eef3fb;padding:1rem;
border-left:4px solid #3b6fb6;font-size:1.1rem}
table{border-collapse:collapse;font-size:.82rem;margin:.4rem 0 1rem}th,td{border-bottom:1px solid #e6e9ef;
padding:.25rem .5rem;text-align:right;vertical-align:top}th{background:#f4f6fa}td.t,th.t{text-align:left;white-space:pre-wrap}
.kpis{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:.6rem}.kpi{border:1px solid #dde3ec;
border-radius:6px;padding:.5rem .7rem}.kpi .v{font-size:1.3rem;font-weight:600}.kpi .l{font-size:.85rem}
.up{color:#b3261e}.down{color:#1e7b34}.kpi .b{color:#5b6578;font-size:.72rem}svg{display:block;margin:.5rem 0}
"""

# figure keys for which an increase is bad (red) — for the others a change is shown neutral
UP_IS_BAD = {"cost_usd", "gpu_s", "reprefill_tokens", "reprefill_share_of_cache_tokens",
             "reprefill_share_of_computed_prefill", "reprefill_cost_usd", "reprefill_cost_share", "rent_wasted_usd",
             "retries"}
UP_IS_GOOD = {"hit_rate", "reuse_hit_rate"}


def fmt_value(v, unit: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if unit == "usd":
        return f"${v:,.2f}" if abs(v) >= 0.01 or v == 0 else f"${v:.2g}"
    if unit == "ratio":
        return f"{100 * v:.1f} %"
    if unit == "ratio_x":
        return f"{v:.2f}×"
    if unit in ("tokens", "count"):
        return f"{v:,.0f}"
    if unit == "gpu_seconds":
        return f"{v / 3600:,.1f} GPU-h" if v >= 3600 else f"{v:,.1f} GPU-s"
    if unit == "seconds":
        return f"{v:.3g} s"
    if unit == "bytes":
        for u, d in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if abs(v) >= d:
                return f"{v / d:,.1f} {u}"
        return f"{v:,.0f} B"
    return f"{v:,.4g}" if isinstance(v, float) else str(v)


def column_unit(name: str) -> str:
    """The display unit of a metric column, from its name (the metrics' naming conventions)."""
    if name.endswith(("_usd", "usd_per_week", "usd_week", "usd_window")):
        return "usd"
    if name.endswith("_bytes"):
        return "bytes"
    if "rate" in name and not name.endswith("_per_s") or "share" in name:
        return "ratio"
    if name in ("amplification", "miss_penalty"):
        return "ratio_x"
    if name == "gpu_s":
        return "gpu_seconds"
    if name.endswith("_s"):
        return "seconds"
    return ""


def fmt_cell(v, col: str) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        u = column_unit(col)
        if u:
            return fmt_value(float(v), u)
        return f"{v:,}" if isinstance(v, int) else f"{v:,.4g}"
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    return str(v)


def delta_text(f: Figure) -> tuple[str, str]:
    """('+12.0 % vs W47', css class)."""
    if f.previous is None and f.value is None:
        return "", ""
    if f.previous is None:
        return "no data the week before", ""
    d = f.delta
    if d is None:
        return f"week before: {fmt_value(f.previous, f.unit)}", ""
    if f.unit == "ratio":
        txt = f"{100 * d:+.1f} pp"
    elif f.delta_rel is not None:
        txt = f"{100 * f.delta_rel:+.1f} %"
    else:
        txt = f"{d:+,.4g}"
    cls = ""
    if d > 0:
        cls = "up" if f.key in UP_IS_BAD else ("down" if f.key in UP_IS_GOOD else "")
    elif d < 0:
        cls = "down" if f.key in UP_IS_BAD else ("up" if f.key in UP_IS_GOOD else "")
    return f"{txt} (week before: {fmt_value(f.previous, f.unit)})", cls


def _shown(t: Table) -> list[str]:
    cols = t.show if t.show else t.data.column_names
    return [c for c in cols if c in t.data.column_names]


def _chart_svg(c: Chart, t: Table | None) -> str:
    if c.kind == "histogram":
        return svg.histogram(c.edges, c.counts, lambda v: fmt_value(v, c.unit), c.title)
    rows = t.data.select([c.label_col, c.value_col]).to_pylist()[:15] if t is not None else []
    labels = ["(none)" if r[c.label_col] is None else str(r[c.label_col]) for r in rows]
    values = [r[c.value_col] for r in rows]
    return svg.bars(labels, values, lambda v: fmt_value(v, c.unit), c.title)


def _table_html(t: Table, period_label: str) -> str:
    cols = _shown(t)
    out = [f"<h3>{escape(t.title)}</h3>"]
    if t.chart is not None and t.data.num_rows:
        out.append(_chart_svg(t.chart, t))
    n = t.data.num_rows
    if t.show_rows == 0 or not cols:
        out.append(f'<p class="basis">{n:,} rows in tables/{escape(t.name)}.csv and .parquet.</p>')
        return "".join(out)
    if n == 0:
        out.append('<p class="basis">No rows.</p>')
        return "".join(out)
    rows = t.data.slice(0, t.show_rows).to_pylist()
    head = "".join(f'<th class="{"t" if _is_text(t.data, c) else ""}">{escape(c)}</th>' for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            txt = escape(fmt_cell(r[c], c) + (bound_text(r.get(rel_err_column(c))) if r[c] is not None else ""))
            url = r.get(t.links[c]) if c in t.links else None
            if url:
                txt = f'<a href="{escape(url, quote=True)}">{txt}</a>'
            cells.append(f'<td class="{"t" if _is_text(t.data, c) else ""}">{txt}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f" Showing {len(rows)} of {n:,} rows;" if n > len(rows) else ""
    out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    out.append(f'<p class="basis">{more} all rows and columns in tables/{escape(t.name)}.csv and .parquet.</p>')
    return "".join(out)


def _is_text(data: pa.Table, col: str) -> bool:
    typ = data.schema.field(col).type
    return pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def html(report: Report) -> str:
    p = report.period
    title = f"agentobs weekly report — {p.label}"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{escape(title)}</h1>",
           f'<p class="basis">Period {escape(p.describe())}; compared with {escape(report.previous.label)}. '
           f"Store {escape(report.db)}; generated {_utc(report.generated_at)}. Every $ figure is GPU-time cost unless "
           "it says list price; each figure states its basis.</p>"]
    if not report.has_data:
        out.append(f'<p class="empty" id="no-data">No model calls in {escape(p.describe())}: there is no data for '
                   "this week in the store, so there is nothing to attribute. Check that the collectors were "
                   "running and that the store path is right.</p>")
    for s in report.sections:
        out.append(f'<section id="{escape(s.key)}"><h2>{escape(s.title)}</h2>')
        if s.basis:
            out.append(f'<p class="basis">Basis: {escape(s.basis)}</p>')
        if s.figures:
            out.append('<div class="kpis">')
            for f in s.figures:
                dtxt, cls = delta_text(f) if s.key == "headline" or (s.key == "answer" and f.previous is not None) \
                    else ("", "")
                out.append(f'<div class="kpi" data-key="{escape(f.key)}"><div class="l">{escape(f.label)}</div>'
                           f'<div class="v">{escape(fmt_value(f.value, f.unit))}</div>'
                           + (f'<div class="{cls}">{escape(dtxt)}</div>' if dtxt else "")
                           + f'<div class="b">{escape(f.basis)}</div></div>')
            out.append("</div>")
        for c in s.charts:
            out.append(_chart_svg(c, None))
        for n in s.notes:
            out.append(f'<p class="note">{escape(n)}</p>')
        for t in s.tables:
            out.append(_table_html(t, p.label))
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out)


def _md_cell(v, col: str) -> str:
    return fmt_cell(v, col).replace("|", "\\|").replace("\n", " ")


def markdown(report: Report, max_rows: int = 5) -> str:
    """A short summary: the headline with week-over-week deltas, the top rows of the main tables, findings."""
    p = report.period
    out = [f"# agentobs weekly report — {p.label}", "",
           f"Period {p.describe()}, compared with {report.previous.label}. GPU-time cost basis unless stated.", ""]
    if not report.has_data:
        out += [f"**No model calls in {p.describe()}** — no data for this week in the store.", ""]
    ans = next((s for s in report.sections if s.key == "answer"), None)
    if ans is not None:  # the answer first: the week's tax, its change, the top fixes
        out += [f"## {ans.title}", ""]
        for f in ans.figures:
            d, _ = delta_text(f)
            out.append(f"- {f.label}: **{fmt_value(f.value, f.unit)}**"
                       + (f" ({d} vs the week before)" if d and f.previous is not None else "")
                       + f" — {f.basis}")
        out.append("")
        for n in ans.notes:
            out += [f"> {n}", ""]
        fixes = next((t for t in ans.tables if t.name == "top_fixes"), None)
        if fixes is not None and fixes.data.num_rows:
            out.append("Top fixes:")
            for i, r in enumerate(fixes.data.to_pylist(), 1):
                rec = "" if r["recoverable_usd_week"] is None else \
                    f", recovers {fmt_value(r['recoverable_usd_week'], 'usd')}"
                ses = "" if r["sessions"] is None else f", [{r['sessions']:,} sessions]({r['console_url']})"
                out.append(f"{i}. **{fmt_value(r['usd_week'], 'usd')}/week**{rec}{ses} — {r['fix']} (`{r['id']}`)")
            out.append("")
    head = next(s for s in report.sections if s.key == "headline")
    out += ["| figure | this week | change | basis |", "|---|---|---|---|"]
    for f in head.figures:
        d, _ = delta_text(f)
        out.append(f"| {f.label} | {fmt_value(f.value, f.unit)} | {d} | {f.basis.replace('|', '/')} |")
    out.append("")
    wanted = {"spend_by_task_type", "spend_by_tenant", "reprefill_by_cause", "idle_kv_rent_by_instance", "top_sessions",
              "top_tasks"}
    for s in report.sections:
        if s.key in ("headline", "answer"):
            continue
        tables = [t for t in s.tables if t.name in wanted or s.key == "findings"]
        if not tables and not s.notes and not s.figures:
            continue
        out += [f"## {s.title}", ""]
        for f in s.figures:
            out.append(f"- {f.label}: **{fmt_value(f.value, f.unit)}** ({f.basis})")
        if s.figures:
            out.append("")
        for n in s.notes:
            out += [f"> {n}", ""]
        for t in tables:
            cols = _shown(t)
            if not cols or t.data.num_rows == 0:
                continue
            lim = 10 if s.key == "findings" else max_rows
            out += [f"**{t.title}** (top {min(lim, t.data.num_rows)} of {t.data.num_rows:,})", "",
                    "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            for r in t.data.slice(0, lim).to_pylist():
                cells = []
                for c in cols:
                    txt = _md_cell(r[c], c) + (bound_text(r.get(rel_err_column(c))) if r[c] is not None else "")
                    url = r.get(t.links[c]) if c in t.links else None
                    cells.append(f"[{txt}]({url})" if url else txt)
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    out.append("Full report: report.html; every table as CSV and Parquet under tables/.")
    return "\n".join(out) + "\n"
