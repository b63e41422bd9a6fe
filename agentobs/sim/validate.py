"""Estimate mode against the simulator's ground truth (issue 20's acceptance; docs/metrics.md, "Miss causes
from evidence"): a bundle imported into a store, its ``call_reuse`` rows joined with ``truth/calls.parquet``.

``compare(con, truth)`` returns the figures the tests assert and ``bench/causes_vs_truth.py`` prints: true hits
flagged as evictions, re-prefill tokens by cause (truth and the model), every session's truth against the model's
band [X_low, X_high], and the idle rent wasted and paid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# the model's causes grouped as the truth names them (the truth has one eviction cause per call, full or partial)
GROUP = {"evicted_full": "evicted", "evicted_partial": "evicted", "routed_away": "routed_away",
         "cache_disabled": "cache_disabled", "unexplained": "unexplained"}

_SQL = """
WITH t AS (SELECT * FROM read_parquet($truth)),
j AS (
    SELECT t.session_id, t.cause AS t_cause, t.first_call, t.rejected,
           CASE WHEN t.first_call OR t.rejected THEN 0 ELSE coalesce(t.reprefill_tokens, 0) END AS tx,
           t.rent_wasted_tok_s AS t_wasted, t.rent_paid_tok_s AS t_paid,
           r.miss_cause, r.mode, coalesce(r.reprefill_tokens, 0) AS x, coalesce(r.reprefill_low_tokens, 0) AS lo,
           coalesce(r.reprefill_high_tokens, 0) AS hi, r.rent_wasted_token_s AS wasted, r.rent_paid_token_s AS paid
    FROM t JOIN call_reuse r USING (call_id)
)
"""


@dataclass
class Comparison:
    calls: int
    modes: dict[str, int]
    hits_flagged_evicted: int            # truth: no re-prefill; model: evicted_full / evicted_partial
    truth_by_cause: dict[str, int]       # tokens
    model_by_cause: dict[str, int]       # tokens (point estimate X)
    band_low: int
    band_high: int
    sessions: int
    outside_band: list[tuple[str, int, int, int]] = field(default_factory=list)  # (session, truth, low, high)
    rent_wasted_truth: float = 0.0
    rent_wasted_model: float = 0.0
    rent_paid_truth: float = 0.0
    rent_paid_model: float = 0.0
    evicted_calls_model: int = 0

    @property
    def hits_flagged_share(self) -> float:
        return self.hits_flagged_evicted / self.calls if self.calls else 0.0

    def rows(self) -> list[tuple[str, int, int]]:
        """(cause, truth tokens, model tokens), every cause either side names."""
        keys = sorted(set(self.truth_by_cause) | set(self.model_by_cause))
        return [(k, self.truth_by_cause.get(k, 0), self.model_by_cause.get(k, 0)) for k in keys]


def compare(con, truth: str | Path) -> Comparison:
    """``con``: a store with the bundle imported (read-only is fine); ``truth``: its truth/calls.parquet."""
    p = {"truth": str(truth)}
    one = con.execute(_SQL + """
        SELECT count(*), count(*) FILTER (WHERE tx = 0 AND miss_cause IN ('evicted_full', 'evicted_partial')),
               CAST(sum(lo) AS BIGINT), CAST(sum(hi) AS BIGINT), count(DISTINCT session_id),
               coalesce(sum(t_wasted), 0), coalesce(sum(wasted), 0), coalesce(sum(t_paid), 0), coalesce(sum(paid), 0),
               count(*) FILTER (WHERE miss_cause IN ('evicted_full', 'evicted_partial'))
        FROM j""", p).fetchall()[0]
    modes = dict(con.execute(_SQL + "SELECT coalesce(mode, 'none'), count(*) FROM j GROUP BY 1", p).fetchall())
    truth_by = dict(con.execute(_SQL + "SELECT t_cause, CAST(sum(tx) AS BIGINT) FROM j WHERE tx > 0 GROUP BY 1",
                                p).fetchall())
    model_rows = con.execute(_SQL + "SELECT miss_cause, CAST(sum(x) AS BIGINT) FROM j WHERE x > 0 GROUP BY 1",
                             p).fetchall()
    model_by: dict[str, int] = {}
    for cause, n in model_rows:
        k = GROUP.get(cause, cause)
        model_by[k] = model_by.get(k, 0) + int(n)
    truth_g: dict[str, int] = {}
    for cause, n in truth_by.items():
        k = GROUP.get(cause, cause)
        truth_g[k] = truth_g.get(k, 0) + int(n)
    outside = con.execute(_SQL + """
        SELECT session_id, CAST(sum(tx) AS BIGINT) AS tx, CAST(sum(lo) AS BIGINT) AS lo, CAST(sum(hi) AS BIGINT) AS hi
        FROM j GROUP BY 1 HAVING sum(tx) < sum(lo) OR sum(tx) > sum(hi) ORDER BY 1""", p).fetchall()
    return Comparison(calls=one[0], modes=modes, hits_flagged_evicted=one[1], truth_by_cause=truth_g,
                      model_by_cause=model_by, band_low=int(one[2] or 0), band_high=int(one[3] or 0),
                      sessions=one[4], outside_band=[tuple(r) for r in outside], rent_wasted_truth=float(one[5]),
                      rent_wasted_model=float(one[6]), rent_paid_truth=float(one[7]), rent_paid_model=float(one[8]),
                      evicted_calls_model=one[9])
