"""What-if: the view's sessions replayed through the simulator as configured and with a configuration change
(agentobs.findings.whatif, the replay the findings' recoverable tax is simulated on): before → after, and the
simulator's calibration error on the unchanged replay."""

from __future__ import annotations

import importlib

import streamlit as st

from agentobs.console import data, ui
from agentobs.console.findings import money

ctx = ui.page("What-if", "The sessions of the view's window and filters (at most findings_sim_sessions, a contiguous "
              "slice chosen by findings_sim_seed: the findings' replay) run through agentobs.sim as configured and with "
              "the change. Tokens and $ are scaled to the window by prompt tokens and to a week as the findings' tax; "
              "$ = computed prefill ÷ prefill tokens/s × $/s (the tax's GPU-time basis). Turn-resume TTFT = TTFT of "
              "calls 2…n (METRICS.md §5). Calibration: the unchanged replay vs what was observed of the same sessions.")

PRESETS = ["prefix_cache=on", "hicache=on", "router=session_affinity", "kv_capacity=x2", "offload_gib=64",
           "schedule_policy=lpm"]


@st.cache_data(show_spinner="replaying the observed sessions through the simulator…", max_entries=32, ttl=3600)
def _whatif(stamp, since, until, filters: tuple, changes: tuple, sessions: int | None):
    mod = importlib.import_module("agentobs.findings.whatif")
    return mod.run(data.source(stamp), list(changes), since=since, until=until, filters=dict(filters) or None,
                   sessions=sessions)


# the URL's changes pick the changes when the page is opened with them (a link, a reload); afterwards the widget
# writes them into the URL — a URL that differs from what this page last wrote is a new link to follow
url = st.query_params.get_all("change")
ss = st.session_state
if url and url != ss.get("_whatif_url"):
    ss["whatif_pick"] = list(url)
ss.setdefault("whatif_pick", ["prefix_cache=on"])
left, right = st.columns([3, 1])
picked = left.multiselect("Changes (applied together)", sorted(set(PRESETS) | set(url) | set(ss["whatif_pick"])),
                          key="whatif_pick",
                          help="key=value[@instance]: prefix_cache=on|off, hicache=on|off, hicache_ratio=R, "
                               "offload_gib=N, kv_capacity=x2 (or tokens), router=POLICY, schedule_policy=fcfs|lpm")
extra = left.text_input("More changes (comma-separated, e.g. kv_capacity=x2@10.0.0.1:8000)", key="whatif_extra")
sessions = right.number_input("Sessions replayed (0 = setting)", min_value=0, value=0, step=50, key="whatif_sessions")
changes = tuple(picked) + tuple(c.strip() for c in extra.split(",") if c.strip())
st.query_params["change"] = list(changes)
ss["_whatif_url"] = list(changes)
if not changes:
    st.info("Pick at least one change.")
    st.stop()

flt = tuple(sorted((k, tuple(v)) for k, v in ctx.filters.lists().items()))
try:
    w = _whatif(ctx.stamp, ctx.since, ctx.until, flt, changes, int(sessions) or None)
except Exception as e:  # noqa: BLE001 - a change that cannot be applied is shown with its message
    st.error(str(e))
    st.stop()

for line in w.headline()[:2]:
    st.caption(ui.md(line))
f = w.row("fleet")


def _delta(a, b, fmt):
    """after − before as the metric's delta, none when either is unknown or they are equal."""
    return None if a is None or b is None or a == b else fmt(b - a)


c = st.columns(4)
c[0].metric(f"computed prefill{w.per}", ui.n(f.after.computed_tokens),
            delta=_delta(f.before.computed_tokens, f.after.computed_tokens, lambda d: f"{ui.n(d)} tokens"),
            delta_color="inverse")
c[1].metric(f"computed prefill ${w.per}", money(f.after.usd),
            delta=_delta(f.before.usd, f.after.usd, lambda d: ("-" if d < 0 else "") + money(abs(d))),
            delta_color="inverse")
c[2].metric("turn-resume TTFT p50", ui.secs(f.after.ttft_p50_s),
            delta=_delta(f.before.ttft_p50_s, f.after.ttft_p50_s, ui.secs), delta_color="inverse")
c[3].metric("turn-resume TTFT p99", ui.secs(f.after.ttft_p99_s),
            delta=_delta(f.before.ttft_p99_s, f.after.ttft_p99_s, ui.secs), delta_color="inverse")
for n in w.notes:
    st.warning(n)
st.subheader("Before → after")
# one column mixes tokens, $ and seconds: four significant digits with thousands separators reads for all three
ui.table(w.table(), column_config={"before": st.column_config.NumberColumn("before", format="%,.4g"),
                                   "after": st.column_config.NumberColumn("after", format="%,.4g"),
                                   "change": st.column_config.NumberColumn("change", format="percent")})
st.subheader("Calibration")
st.caption("The unchanged replay against what was observed of the same sessions (not scaled): error = simulated ÷ "
           "observed − 1. A large error on a figure says how far to trust that figure's change.")
ui.table(w.calibration_table(), column_config={
    "observed": st.column_config.NumberColumn("observed", format="%,.4g"),
    "simulated": st.column_config.NumberColumn("simulated", format="%,.4g"),
    "error": st.column_config.NumberColumn("error", format="percent")})
