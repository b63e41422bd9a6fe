"""``agentobs loadgen --compare A.duckdb B.duckdb``: two runs side by side, with the difference B − A and its
bootstrap confidence interval over sessions.

Every figure is a metric of the catalogue (agentobs/metrics/defs), run by ``MetricRun.compute`` — never a second
formula. The bootstrap resamples whole sessions with replacement: the calls of the resampled sessions (each copy
a session of its own) go into a temp table with m_calls' columns, the replicate number in ``task_type``, and the
metric's own SQL reads that table grouped by task type, so one query gives every replicate. Replicate 0 is the
sample itself (each session once): the point estimate, equal to the metric over the whole store. When both stores
ran the same workload sessions (load-generator session ids ``lg-<run>-<name>``, same names), every replicate draws
the same sessions on both sides (a paired bootstrap: the interval is of the configuration's effect, not of the
sessions' spread).

Quantities:

- turn-resume TTFT p50 / p99 per idle-gap bucket (``turn_resume_ttft``; the hit class set to one value so that a
  bucket's percentiles are over all its calls, whatever their hit class) and over every gap;
- session hit rate ΣC/ΣP (``reuse``: ``hit_rate``);
- re-prefill share of the computed prefill ΣX/Σ(P − C) (``reprefill``: ``share_of_computed_prefill``);
- computed prompt tokens Σ(P − C) and GPU-time $ per task (``task_cost``: ``computed_prompt_tokens``, ``cost_usd``
  over the group's ``sessions``; one task per session in a load-generator run).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from ..errors import ConfigError

_LG = re.compile(r"^lg-[0-9a-f]+-(.+)$")
GAP_BUCKETS = ("[0,1)", "[1,5)", "[5,30)", "[30,120)", "[120,600)", "[600,inf)")


@dataclass
class Row:
    quantity: str
    unit: str
    a: float | None
    b: float | None
    diff: float | None
    ci_lo: float | None
    ci_hi: float | None
    n_a: int | None = None   # calls (TTFT rows) or sessions behind the figure
    n_b: int | None = None

    def as_dict(self) -> dict:
        return {"quantity": self.quantity, "unit": self.unit, "a": self.a, "b": self.b, "diff": self.diff,
                "ci_lo": self.ci_lo, "ci_hi": self.ci_hi, "n_a": self.n_a, "n_b": self.n_b}


@dataclass
class Comparison:
    a: str
    b: str
    reps: int
    level: float
    sessions_a: int
    sessions_b: int
    rows: list[Row]
    paired: bool = False  # the same workload sessions on both sides: each replicate draws the same sessions

    def table(self) -> pa.Table:
        return pa.Table.from_pylist([r.as_dict() for r in self.rows])


def _replicates(sessions: list[str], reps: int, rng: random.Random) -> pa.Table:
    """(rep, sid, k): replicate 0 = every session once, then ``reps`` resamples with replacement."""
    rep, sid, k = [], [], []
    n = len(sessions)
    for s_i, s in enumerate(sessions):
        rep.append("0")
        sid.append(s)
        k.append(s_i)
    for r in range(1, reps + 1):
        for j in range(n):
            rep.append(str(r))
            sid.append(sessions[rng.randrange(n)])
            k.append(j)
    return pa.table({"rep": rep, "sid": sid, "k": pa.array(k, pa.int32())})


def workload_key(session_id: str) -> str:
    """A load-generator session's name in its workload (``lg-<run>-<name>`` → ``<name>``), else the id itself."""
    m = _LG.match(session_id)
    return m.group(1) if m else session_id


def measure(db, reps: int = 200, seed: int = 0, settings=None) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Per replicate ('0' = the sample), every quantity: {rep: {quantity: value}}; and the sessions' workload keys
    in resampling order. Two runs of the same workload get the same draws with the same seed (paired)."""
    from ..metrics.run import prepare
    from ..source import as_source  # compare's inputs are two runs' stores (paths), or Sources

    if isinstance(db, str | Path) and not Path(db).exists():
        raise ConfigError(f"--compare: no store at {db}")
    run, close = prepare(as_source(str(db) if isinstance(db, Path) else db), settings=settings)
    try:
        cur = run.cur
        sessions = sorted((r[0] for r in cur.sql("SELECT DISTINCT session_id FROM m_calls WHERE in_win AND "
                                                 "session_id IS NOT NULL").fetchall()), key=workload_key)
        if not sessions:
            raise ConfigError(f"--compare: {db} has no sessions")
        cur.register("lg_boot_arrow", _replicates(sessions, reps, random.Random(seed)))
        cur.execute("""
            CREATE OR REPLACE TEMP TABLE m_boot AS
            SELECT c.* REPLACE (r.rep AS task_type, c.session_id || '#' || CAST(r.k AS VARCHAR) AS session_id,
                                coalesce(c.task_id, c.session_id) || '#' || CAST(r.k AS VARCHAR) AS task_id,
                                CASE WHEN c.hit_class IS NOT NULL THEN 'any' END AS hit_class)
            FROM m_calls c JOIN lg_boot_arrow r ON r.sid = c.session_id
            WHERE c.in_win
        """)
        cur.unregister("lg_boot_arrow")
        out: dict[str, dict[str, float]] = {str(r): {} for r in range(reps + 1)}

        def put(rep, key, v):
            if v is not None and not (isinstance(v, float) and math.isnan(v)):
                out[str(rep)][key] = float(v)

        for r in run.compute("turn_resume_ttft", by="task_type", calls="m_boot").iter_rows(named=True):
            g = r["gap_bucket"]
            put(r["task_type"], f"ttft_p50[{g}]", r["ttft_p50_s"])
            put(r["task_type"], f"ttft_p99[{g}]", r["ttft_p99_s"])
            put(r["task_type"], f"calls[{g}]", r["calls"])
        for r in run.compute("reuse", by="task_type", calls="m_boot").iter_rows(named=True):
            put(r["task_type"], "hit_rate", r["hit_rate"])
        for r in run.compute("reprefill", by="task_type", calls="m_boot").iter_rows(named=True):
            put(r["task_type"], "reprefill_share", r["share_of_computed_prefill"])
        for r in run.compute("task_cost", by="task_type", calls="m_boot").iter_rows(named=True):
            n = r["sessions"] or 0
            if n:
                put(r["task_type"], "computed_per_task", r["computed_prompt_tokens"] / n)
                if r["cost_usd"] is not None:
                    put(r["task_type"], "usd_per_task", r["cost_usd"] / n)
        return out, [workload_key(x) for x in sessions]
    finally:
        close()


def _interval(a_reps: list[float | None], b_reps: list[float | None], level: float) -> tuple[float | None, ...]:
    d = sorted(b - a for a, b in zip(a_reps, b_reps, strict=True) if a is not None and b is not None)
    if len(d) < 10:
        return None, None
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2

    def q(p):
        pos = p * (len(d) - 1)
        i = int(math.floor(pos))
        j = min(i + 1, len(d) - 1)
        return d[i] + (d[j] - d[i]) * (pos - i)

    return q(lo_q), q(hi_q)


def compare(a_db, b_db, reps: int = 200, seed: int = 0, level: float = 0.95, settings=None) -> Comparison:
    if not 0 < level < 1:
        raise ConfigError(f"--level must be between 0 and 1, got {level}")
    if reps < 0:
        raise ConfigError(f"--bootstrap must be ≥ 0, got {reps}")
    a, ka = measure(a_db, reps, seed, settings)
    b, kb = measure(b_db, reps, seed, settings)
    na, nb = len(ka), len(kb)
    keys: list[tuple[str, str, str, str | None]] = []  # (key, label, unit, count key)
    for g in ("all", *GAP_BUCKETS):
        if f"ttft_p50[{g}]" in a["0"] or f"ttft_p50[{g}]" in b["0"]:
            label = "every gap" if g == "all" else f"gap {g} s"
            keys.append((f"ttft_p50[{g}]", f"turn-resume TTFT p50, {label}", "s", f"calls[{g}]"))
            keys.append((f"ttft_p99[{g}]", f"turn-resume TTFT p99, {label}", "s", f"calls[{g}]"))
    keys += [("hit_rate", "session hit rate ΣC/ΣP", "ratio", None),
             ("reprefill_share", "re-prefill share of computed prefill", "ratio", None),
             ("computed_per_task", "computed prompt tokens per task", "tokens", None),
             ("usd_per_task", "GPU-time $ per task", "USD", None)]
    rows = []
    for key, label, unit, count in keys:
        va, vb = a["0"].get(key), b["0"].get(key)
        lo, hi = _interval([a[str(r)].get(key) for r in range(1, reps + 1)],
                           [b[str(r)].get(key) for r in range(1, reps + 1)], level) if reps else (None, None)
        n_a = int(a["0"][count]) if count and count in a["0"] else (na if not count else 0)
        n_b = int(b["0"][count]) if count and count in b["0"] else (nb if not count else 0)
        rows.append(Row(label, unit, va, vb, None if va is None or vb is None else vb - va, lo, hi, n_a, n_b))
    return Comparison(str(a_db), str(b_db), reps, level, na, nb, rows, paired=ka == kb)


def fmt_value(v: float | None, unit: str, signed: bool = False) -> str:
    """One figure as the CLI table and the console page print it."""
    if v is None:
        return "–"
    sign = "+" if signed and v > 0 else ""
    if unit == "s":
        return f"{sign}{v * 1000:.1f} ms"
    if unit == "ratio":
        return f"{sign}{v * 100:.1f} %" if not signed else f"{sign}{v * 100:.1f} pp"
    if unit == "tokens":
        return f"{sign}{v:,.0f}"
    if unit == "USD":
        return f"{sign}${v:.4g}" if v >= 0 else f"-${-v:.4g}"
    return f"{sign}{v:.4g}"


def display_table(c: Comparison) -> pa.Table:
    """The comparison with its figures formatted (ms, %, tokens, $): what the CLI and the console page show."""
    pct = f"{c.level:.0%} interval"
    rows = []
    for r in c.rows:
        ci = "–" if r.ci_lo is None else f"[{fmt_value(r.ci_lo, r.unit, True)}, {fmt_value(r.ci_hi, r.unit, True)}]"
        rows.append({"quantity": r.quantity, "A": fmt_value(r.a, r.unit), "B": fmt_value(r.b, r.unit),
                     "B − A": fmt_value(r.diff, r.unit, True), pct: ci,
                     "n (A / B)": f"{r.n_a} / {r.n_b}" if r.n_a is not None else ""})
    return pa.Table.from_pylist(rows)
