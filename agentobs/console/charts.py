"""Altair charts of the console (Vega-Lite, shipped with Streamlit). Data in, chart out; no queries here."""

from __future__ import annotations

import altair as alt
import polars as pl

# one color per meaning, the same on every chart
CLASS_COLORS = {
    "hit": "#2e7d32",
    "partial": "#f9a825",
    "miss": "#c62828",
    "cold": "#78909c",
    "unknown": "#b0bec5",
    "error": "#6a1b9a",
    "tool": "#5c6bc0",
    "idle": "#e0e0e0",
}
TOOLS_LANE = "tool calls"
IDLE_LANE = "idle gaps"


def timeline_calls(calls: pl.DataFrame, reuse: pl.DataFrame | None) -> pl.DataFrame:
    """The session's calls with the metrics API's per-call reuse columns joined on call_id.

    ``kind`` is what colors the bar: the hit class when known, else ``error`` / ``unknown``."""
    out = calls
    if reuse is not None and reuse.height:
        keep = [c for c in ("call_id", "r_eff", "reprefill_tokens", "reprefill_low_tokens", "reprefill_high_tokens",
                            "hit_class", "miss_cause", "cause_evidence") if c in reuse.columns]
        out = out.join(reuse.select(keep), on="call_id", how="left")
    for c, dtype in (("hit_class", pl.String), ("miss_cause", pl.String), ("r_eff", pl.Int64),
                     ("reprefill_tokens", pl.Int64)):
        if c not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=dtype).alias(c))
    return out.with_columns(
        pl.when(pl.col("status") == "error").then(pl.lit("error"))
        .when(pl.col("hit_class").is_not_null()).then(pl.col("hit_class"))
        .when(pl.col("miss_cause") == "cold").then(pl.lit("cold"))
        .otherwise(pl.lit("unknown")).alias("kind"),
        pl.col("instance").fill_null("(unknown instance)").alias("lane"),
        pl.when(pl.col("reprefill_tokens") > 0)
        .then(pl.format("X={}", pl.col("reprefill_tokens")))
        .otherwise(pl.lit("")).alias("label"),
        (pl.col("instance") != pl.col("prev_instance")).fill_null(False).alias("instance_change"),
    )


def timeline(calls: pl.DataFrame, tools: pl.DataFrame) -> alt.LayerChart | alt.FacetChart:
    lanes = list(dict.fromkeys(calls["lane"].to_list()))
    call_bars = calls.select(
        "lane", "kind", "label", "call_id", "start_ts", "end_ts", "prompt_tokens", "cached_tokens", "reprefill_tokens",
        "miss_cause", "ttft_s", "instance_change", pl.col("model"))
    gaps = calls.filter(pl.col("gap_before_s").is_not_null()).select(
        pl.lit(IDLE_LANE).alias("lane"), pl.lit("idle").alias("kind"),
        pl.format("{} s", pl.col("gap_before_s").round(1)).alias("label"), pl.col("call_id"),
        (pl.col("start_ts") - pl.duration(microseconds=(pl.col("gap_before_s") * 1e6).cast(pl.Int64))).alias("start_ts"),
        pl.col("start_ts").alias("end_ts"))
    tool_bars = tools.select(pl.lit(TOOLS_LANE).alias("lane"), pl.lit("tool").alias("kind"),
                             pl.col("tool_name").alias("label"), pl.lit(None, pl.String).alias("call_id"),
                             "start_ts", "end_ts")
    segs = pl.concat([call_bars, gaps, tool_bars], how="diagonal_relaxed")
    order = lanes + [TOOLS_LANE, IDLE_LANE]
    color = alt.Color("kind:N", title="call / segment",
                      scale=alt.Scale(domain=list(CLASS_COLORS), range=list(CLASS_COLORS.values())))
    y = alt.Y("lane:N", sort=order, title=None, axis=alt.Axis(labelLimit=240))
    base = alt.Chart(segs)
    bars = base.mark_bar(height=22, cornerRadius=2).encode(
        x=alt.X("start_ts:T", title="time (UTC)"), x2="end_ts:T", y=y, color=color,
        tooltip=["lane", "kind", "call_id", "label", "start_ts:T", "end_ts:T", "prompt_tokens", "cached_tokens",
                 "reprefill_tokens", "miss_cause", "ttft_s"])
    text = base.transform_filter(alt.datum.label != "").mark_text(align="left", dx=3, dy=-16, fontSize=11).encode(
        x="start_ts:T", y=y, text="label:N")
    layers = [bars, text]
    changes = calls.filter(pl.col("instance_change")).select("start_ts", "lane")
    if changes.height:
        layers.append(alt.Chart(changes).mark_rule(color="#d32f2f", strokeDash=[4, 3], strokeWidth=2).encode(
            x="start_ts:T", tooltip=[alt.Tooltip("lane:N", title="moved to instance")]))
    return alt.layer(*layers).properties(height=60 + 42 * len(order))


# -- metric charts: the data is the metric's output rows (tests compare them), the chart only draws them ------
HIT_CLASSES = ("hit", "partial", "miss")
GAP_BUCKETS = ("[0,1)", "[1,5)", "[5,30)", "[30,120)", "[120,600)", "[600,inf)")
# categories that are not a hit class (instances, series) never take the hit/partial/miss colours
INSTANCE_PALETTE = ["#1565c0", "#00838f", "#6a1b9a", "#5d4037", "#546e7a", "#3949ab", "#ad1457", "#827717"]
TTFT_STATS = {"p50": "ttft_p50_s", "p90": "ttft_p90_s", "p99": "ttft_p99_s"}


def class_color(title: str = "hit class") -> alt.Color:
    return alt.Color("hit_class:N", title=title, sort=list(HIT_CLASSES),
                     scale=alt.Scale(domain=list(HIT_CLASSES), range=[CLASS_COLORS[c] for c in HIT_CLASSES]))


def ttft_by_gap_data(df: pl.DataFrame) -> pl.DataFrame:
    """The turn_resume_ttft rows a chart draws: every group × gap bucket × hit class row as the metric gave it
    (percentiles over the calls of that cell); the overall rows (gap_bucket 'all') are not bars."""
    return df.filter(pl.col("gap_bucket") != "all")


def ttft_by_gap(rows: pl.DataFrame, stat: str = "p50", height: int = 220, y_max: float | None = None,
                title: str | None = None) -> alt.Chart:
    """TTFT ``stat`` (p50/p90/p99) by idle-gap bucket, one bar per hit class (the metric's own percentile of
    the cell's calls: bars are never stacked or summed). ``rows``: ttft_by_gap_data of ONE group."""
    col = TTFT_STATS[stat]
    keep = [c for c in ("gap_bucket", "hit_class", "calls", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "miss_penalty")
            if c in rows.columns]
    y_scale = alt.Scale(domain=[0, y_max]) if y_max else alt.Undefined
    return alt.Chart(rows.select(keep)).mark_bar().encode(
        x=alt.X("gap_bucket:N", title="idle gap before the call (s)", sort=list(GAP_BUCKETS),
                axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("hit_class:N", sort=list(HIT_CLASSES), scale=alt.Scale(domain=list(HIT_CLASSES))),
        y=alt.Y(f"{col}:Q", title=f"TTFT {stat} (s)", scale=y_scale, axis=alt.Axis(format=",.3~g")),
        color=class_color(),
        tooltip=[alt.Tooltip("gap_bucket:N", title="idle gap (s)"), alt.Tooltip("hit_class:N", title="hit class"),
                 alt.Tooltip("calls:Q", format=","),
                 *[alt.Tooltip(f"{c}:Q", title=c.replace("ttft_", "TTFT ").replace("_s", " (s)"), format=",.3~g")
                   for c in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s") if c in keep],
                 *([alt.Tooltip("miss_penalty:Q", title="miss penalty (×)", format=",.3~g")]
                   if "miss_penalty" in keep else [])],
    ).properties(height=height, **({"title": title} if title else {}))


ITL_SERIES = {  # series → (p50 column, p99 column) of itl_tail's per-chunk rows
    "all gaps": ("p50_ms", "p99_ms"),
    "no long prefill overlapping": ("p50_without_long_prefill_ms", "p99_without_long_prefill_ms"),
    "a long prefill overlapping": ("p50_with_long_prefill_ms", "p99_with_long_prefill_ms"),
}
ITL_COLORS = {"all gaps": "#78909c", "no long prefill overlapping": "#1565c0", "a long prefill overlapping": "#d84315"}


def itl_long_prefill_data(df: pl.DataFrame, group: str) -> pl.DataFrame:
    """itl_tail's per-chunk rows as (group, series, percentile, ms): each value one of the metric's columns
    (ITL_SERIES), unchanged; coarse_histogram rows (no per-gap percentiles) and empty values are left out."""
    if "method" in df.columns:
        df = df.filter(pl.col("method") == "per_chunk")
    parts = []
    for series, (c50, c99) in ITL_SERIES.items():
        for pctl, col in (("p50", c50), ("p99", c99)):
            if col in df.columns:
                parts.append(df.select(pl.col(group).cast(pl.String).alias("group"), pl.lit(series).alias("series"),
                                       pl.lit(pctl).alias("percentile"), pl.col(col).cast(pl.Float64).alias("ms")))
    if not parts:
        return pl.DataFrame(schema={"group": pl.String, "series": pl.String, "percentile": pl.String, "ms": pl.Float64})
    return pl.concat(parts).filter(pl.col("ms").is_not_null() & ~pl.col("ms").is_nan())


def itl_long_prefill(rows: pl.DataFrame, height: int = 220, title: str | None = None) -> alt.Chart:
    """p50 and p99 inter-token gap, all gaps vs gaps with / without an overlapping long prefill (log scale: the
    p50 barely moves, the tail does). ``rows``: itl_long_prefill_data of ONE group."""
    order = list(ITL_SERIES)
    return alt.Chart(rows).mark_bar().encode(
        x=alt.X("percentile:N", title=None, sort=["p50", "p99"], axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("series:N", sort=order, scale=alt.Scale(domain=order)),
        # bars from 1 ms on a log scale (a log axis has no 0; unstacked: each bar is one of the metric's values)
        y=alt.Y("ms:Q", title="ITL (ms, log)", stack=None, scale=alt.Scale(type="log"),
                axis=alt.Axis(format=",.3~g", values=[1, 3, 10, 30, 100, 300, 1000, 3000, 10000])),
        y2=alt.datum(1),
        color=alt.Color("series:N", title="gaps", sort=order,
                        scale=alt.Scale(domain=order, range=[ITL_COLORS[s] for s in order])),
        tooltip=["group:N", "series:N", "percentile:N", alt.Tooltip("ms:Q", format=",.3~g")],
    ).properties(height=height, **({"title": title} if title else {}))


def instance_color(field: str = "instance:N", title: str = "instance") -> alt.Color:
    return alt.Color(field, title=title, scale=alt.Scale(range=INSTANCE_PALETTE))


# -- trace waterfall (agentobs.model.trace) ------------------------------------------------------------------
ROLE_COLORS = {"agent": "#546e7a", "gateway": "#1565c0", "engine": "#00838f", "tool": "#f9a825", "other": "#9e9e9e",
               "queue": "#d84315", "prefill": "#6a1b9a", "decode": "#26a69a"}


def waterfall_data(trace) -> pl.DataFrame:
    """One bar per span (row = its place in the tree) plus one per engine phase (queue, prefill, decode) on the
    engine span's row, thinner, over it."""
    rows = []
    for i, n in enumerate(trace.nodes):
        label = f"{i:>3} {n.prefix}{n.span.get('name') or ''}"
        dur = n.duration_s if n.duration_s is not None else 0.0
        rows.append({"row": label, "order": i, "span_id": n.span_id, "kind": n.role, "layer": "span",
                     "start_s": n.offset_s, "end_s": n.offset_s + dur, "duration_s": n.duration_s,
                     "detail": n.detail()})
        for name, off, d in n.phases():
            rows.append({"row": label, "order": i, "span_id": n.span_id, "kind": name, "layer": "phase",
                         "start_s": off, "end_s": off + d, "duration_s": d, "detail": f"{name} of {n.span_id}"})
    return pl.DataFrame(rows, schema={"row": pl.String, "order": pl.Int64, "span_id": pl.String, "kind": pl.String,
                                      "layer": pl.String, "start_s": pl.Float64, "end_s": pl.Float64,
                                      "duration_s": pl.Float64, "detail": pl.String})


def waterfall(df: pl.DataFrame, select=None) -> alt.LayerChart | alt.FacetChart:
    order = df.filter(pl.col("layer") == "span").sort("order")["row"].to_list()
    color = alt.Color("kind:N", title="span role / engine phase",
                      scale=alt.Scale(domain=list(ROLE_COLORS), range=list(ROLE_COLORS.values())),
                      legend=alt.Legend(orient="bottom", columns=len(ROLE_COLORS)))
    # every row labelled (Vega drops overlapping labels by default: half the tree would be unnamed)
    y = alt.Y("row:N", sort=order, title=None,
              axis=alt.Axis(labelLimit=360, labelFont="monospace", labelOverlap=False))
    x = alt.X("start_s:Q", title="seconds from the trace's start")
    tip = ["row", "kind", "span_id", alt.Tooltip("start_s:Q", format=".3f"), alt.Tooltip("duration_s:Q", format=".3f"),
           "detail"]
    spans = alt.Chart(df.filter(pl.col("layer") == "span")).mark_bar(height=14, cornerRadius=2).encode(
        x=x, x2="end_s:Q", y=y, color=color, tooltip=tip)
    if select is not None:
        spans = spans.add_params(select).encode(opacity=alt.condition(select, alt.value(1.0), alt.value(0.45)))
    phases = alt.Chart(df.filter(pl.col("layer") == "phase")).mark_bar(height=6).encode(
        x=x, x2="end_s:Q", y=y, color=color, tooltip=tip)
    return alt.layer(spans, phases).properties(height=alt.Step(22))


# -- distributions of many values -------------------------------------------------------------------------------
# A per-task (per-session) distribution at 10M calls is ~670k values: the chart gets the bins, not the values
# (Vega-Lite binning 670k points in the browser, and the page sending them, cost more than the rest of the page).
HIST_BINS = 40


def histogram_data(values: pl.Series, bins: int = HIST_BINS) -> pl.DataFrame:
    """``bins`` equal-width bins over [min, max] of ``values`` (nulls and NaNs left out): ``bin_start``,
    ``bin_end``, ``count``, one row per bin (empty bins included); each value in the bin [start, end), the
    maximum in the last bin. The counts sum to the number of non-null values. One bin when every value is equal;
    no rows when there is none."""
    if bins < 1:
        raise ValueError(f"histogram_data: bins must be ≥ 1, got {bins}")
    v = values.drop_nulls().cast(pl.Float64)
    v = v.filter(v.is_not_nan())
    if v.len() == 0:
        return pl.DataFrame(schema={"bin_start": pl.Float64, "bin_end": pl.Float64, "count": pl.Int64})
    lo, hi = float(v.min()), float(v.max())  # type: ignore[arg-type]
    if hi == lo:
        return pl.DataFrame({"bin_start": [lo], "bin_end": [hi], "count": [v.len()]},
                            schema={"bin_start": pl.Float64, "bin_end": pl.Float64, "count": pl.Int64})
    width = (hi - lo) / bins
    idx = ((v - lo) / width).floor().cast(pl.Int64).clip(0, bins - 1).alias("bin")
    counts = idx.to_frame().group_by("bin").agg(pl.len().cast(pl.Int64).alias("count"))
    return (pl.DataFrame({"bin": pl.int_range(0, bins, eager=True, dtype=pl.Int64)})
            .join(counts, on="bin", how="left")
            .select((lo + pl.col("bin") * width).alias("bin_start"),
                    pl.when(pl.col("bin") == bins - 1).then(pl.lit(hi))
                    .otherwise(lo + (pl.col("bin") + 1) * width).alias("bin_end"),
                    pl.col("count").fill_null(0)))


def histogram(bins: pl.DataFrame, title: str, count_title: str, fmt: str = "$,.3~g",
              color: str = "#1565c0") -> alt.Chart:
    """Bars of ``histogram_data``'s bins (already binned: Vega-Lite draws them as they are)."""
    return alt.Chart(bins).mark_bar(color=color).encode(
        x=alt.X("bin_start:Q", bin="binned", title=title, axis=alt.Axis(format=fmt)),
        x2="bin_end:Q",
        y=alt.Y("count:Q", title=count_title),
        tooltip=[alt.Tooltip("bin_start:Q", title="from", format=fmt), alt.Tooltip("bin_end:Q", title="to", format=fmt),
                 alt.Tooltip("count:Q", title=count_title, format=",d")])
