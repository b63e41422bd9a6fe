"""Tiny inline SVG charts for the report: a horizontal bar chart and a histogram.

Plain SVG text (no scripts, fonts or external references) so the HTML opens offline and in mail
clients that strip JavaScript. Values are drawn to scale from zero; labels are escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

FONT = "font-family:system-ui,-apple-system,Segoe UI,sans-serif;font-size:12px"
BAR = "#3b6fb6"


def _clip(s: str, n: int = 34) -> str:
    """At most ``n`` characters; a longer label keeps its head and tail (ids differ at the end)."""
    if len(s) <= n:
        return s
    head = (n - 1) // 2
    return s[:head] + "…" + s[-(n - 1 - head):]


def bars(labels: Sequence[str], values: Sequence[float | None], fmt: Callable[[float], str], title: str,
         width: int = 640) -> str:
    """Horizontal bars, one per label, largest first as given. ``None`` values draw no bar and say '–'."""
    row, top, left, right = 22, 26, 250, 90
    h = top + row * max(len(labels), 1) + 8
    vmax = max((v for v in values if v is not None and math.isfinite(v)), default=0.0)
    scale = (width - left - right) / vmax if vmax > 0 else 0.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{h}" '
           f'viewBox="0 0 {width} {h}" style="{FONT}"><title>{escape(title)}</title>',
           f'<text x="0" y="16" font-weight="600">{escape(title)}</text>']
    for i, (lab, v) in enumerate(zip(labels, values, strict=True)):
        y = top + i * row
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(_clip(str(lab)))}</text>')
        if v is not None and math.isfinite(v):
            w = max(v * scale, 0.0)
            out.append(f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{BAR}"/>')
            out.append(f'<text x="{left + w + 4:.1f}" y="{y + 14}">{escape(fmt(v))}</text>')
        else:
            out.append(f'<text x="{left + 4}" y="{y + 14}">–</text>')
    out.append("</svg>")
    return "".join(out)


def histogram(edges: Sequence[float], counts: Sequence[int], fmt: Callable[[float], str], title: str,
              width: int = 640, height: int = 200) -> str:
    """Columns for ``len(edges) - 1`` bins; x labels at the bin edges (first, middle, last)."""
    left, right, top, bottom = 40, 10, 26, 34
    n = len(counts)
    cmax = max(counts, default=0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" style="{FONT}"><title>{escape(title)}</title>',
           f'<text x="0" y="16" font-weight="600">{escape(title)}</text>']
    if n == 0 or cmax == 0:
        out.append(f'<text x="{left}" y="{height // 2}">no data</text></svg>')
        return "".join(out)
    plot_w, plot_h = width - left - right, height - top - bottom
    bw = plot_w / n
    for i, c in enumerate(counts):
        bh = plot_h * c / cmax
        x = left + i * bw
        out.append(f'<rect x="{x + 1:.1f}" y="{top + plot_h - bh:.1f}" width="{max(bw - 2, 1):.1f}" '
                   f'height="{bh:.1f}" fill="{BAR}"><title>{escape(fmt(edges[i]))}–{escape(fmt(edges[i + 1]))}: '
                   f'{c:,}</title></rect>')
    out.append(f'<text x="{left - 4}" y="{top + 10}" text-anchor="end">{cmax:,}</text>')
    out.append(f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>')
    for i in sorted({0, n // 2, n}):
        out.append(f'<text x="{left + i * bw:.1f}" y="{height - bottom + 16}" text-anchor="middle">'
                   f'{escape(fmt(edges[i]))}</text>')
    out.append("</svg>")
    return "".join(out)
