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
        keep = [c for c in ("call_id", "r_eff", "reprefill_tokens", "hit_class", "miss_cause") if c in reuse.columns]
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


def timeline(calls: pl.DataFrame, tools: pl.DataFrame) -> alt.Chart:
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
