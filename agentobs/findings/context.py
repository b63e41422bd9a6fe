"""What every rule reads: one prepared metric run, the engine config per instance, the window.

Rules query the metric run's prepared tables (agentobs.metrics.MetricRun):

- ``m_calls``   ``call_reuse`` (METRICS.md §1/§4 per call: R_eff, X, miss cause, idle window,
                rent) joined with the cost model columns (usd_per_s, prefill_tps, g_star_s,
                reprefill_cost_usd); ``in_win`` marks calls starting in the window;
- ``m_cost``    the cost basis per instance;
- ``m_samples`` engine counters/gauges with reset-aware deltas;

plus the model view ``instance_config``. Values reach SQL only as named parameters.

Money is scaled from the observed window to a week (``× 604800 / window seconds``) when the window
is at least ``findings_min_window_s`` long; a shorter window reports the tax for the observed window
itself (``Tax.period = "window"``). Every :class:`Tax` says which next to its cost basis.

The window: ``[since, until)`` when given. When ``since`` is not given it is ``findings_default_window_s``
(7 days) before ``until``, or before the newest call's start when ``until`` is not given either, so one
old stray call cannot stretch the window (see :func:`default_since`). The length used for scaling is the
given ``[since, until)``; a defaulted end is the last in-window call's end and a defaulted start the first
in-window call's start.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import Settings
from ..metrics.usual import usual_cte
from .finding import Evidence, Tax

WEEK_S = 7 * 86400.0

# an instance's engine and model as its calls report them: the usual values (agentobs.metrics.usual), from one scan
# grouped by (instance, engine, model)
INSTANCES_SQL = """
WITH g AS MATERIALIZED (
    SELECT coalesce(instance, '') AS instance, engine, model, count(*) AS n, min(start_s) AS first_s,
           max(end_s) AS last_s
    FROM m_calls WHERE in_win GROUP BY ALL
),
""" + usual_cte("e", "instance", "engine", "g") + ",\n" + usual_cte("m", "instance", "model", "g") + """,
c AS (
    SELECT a.instance, e.engine, m.model, a.calls, a.first_s, a.last_s
    FROM (SELECT instance, sum(n) AS calls, min(first_s) AS first_s, max(last_s) AS last_s FROM g GROUP BY instance) a
    LEFT JOIN e ON e.instance = a.instance LEFT JOIN m ON m.instance = a.instance
)
SELECT c.instance, coalesce(ic.engine, c.engine) AS engine, coalesce(c.model, ic.model) AS model, c.calls,
       c.first_s, c.last_s,
       ic.engine IS NOT NULL AS config_known, ic.block_size, ic.prefix_caching, ic.hicache, ic.hicache_ratio,
       ic.hicache_write_policy, ic.schedule_policy, ic.kv_offloading, ic.cache_report, ic.chunked_prefill_size,
       k.kv_capacity_tokens, k.usd_per_s, k.prefill_tps, k.g_star_s, k.bytes_per_token, k.basis, k.rent_basis
FROM c
LEFT JOIN instance_config ic ON ic.instance = c.instance
LEFT JOIN m_cost k ON k.instance = c.instance
ORDER BY c.instance
"""


# when the store observed anything in the window: the in-window calls and the engine samples (a scraped engine
# with no traffic is observed too: its quiet hours count)
COVERAGE_SQL = """
SELECT (SELECT min(start_s) FROM m_calls WHERE in_win) AS calls_first_s,
       (SELECT max(end_s) FROM m_calls WHERE in_win) AS calls_last_s,
       (SELECT min(ts_s) FROM m_samples) AS samples_first_s,
       (SELECT max(ts_s) FROM m_samples) AS samples_last_s
"""


COVERAGE_SLACK_S = 300.0


def _least(*xs):
    xs = [x for x in xs if x is not None]
    return min(xs) if xs else None


def _greatest(*xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


@dataclass
class Context:
    cur: Any                       # a DuckDB cursor holding the metric run's temp tables
    settings: Settings
    since: float | None
    until: float | None
    clock: Callable[[], float] = time.time
    since_given: bool = True       # False: ``since`` is the default window start (see default_since)
    instances: dict[str, dict] = field(default_factory=dict)
    window_s: float = 0.0
    first_s: float | None = None
    last_s: float | None = None
    run: Any = None                # the MetricRun behind ``cur`` (its shared tables: itl_gaps), when known

    def __post_init__(self):
        self.instances = {r["instance"]: r for r in self.rows(INSTANCES_SQL)}
        cov = self.one(COVERAGE_SQL)
        lo = _least(cov.get("calls_first_s"), cov.get("samples_first_s"))
        hi = _greatest(cov.get("calls_last_s"), cov.get("samples_last_s"))
        # observed = [since, until) ∩ [first, last observation]: a week asked of a store that holds 2.3 h of data
        # is 2.3 h observed, so every surface scales the same window the same way (docs/findings.md)
        # a quiet edge shorter than COVERAGE_SLACK_S (a scrape interval or two) is not a gap in observation
        self.first_s = self.since if lo is None or (self.since is not None and lo - self.since <= COVERAGE_SLACK_S) \
            else _greatest(self.since, lo)
        self.last_s = self.until if hi is None or (self.until is not None and self.until - hi <= COVERAGE_SLACK_S) \
            else _least(self.until, hi)
        if self.first_s is not None and self.last_s is not None:
            self.window_s = max(self.last_s - self.first_s, 1.0)

    # -- queries ---------------------------------------------------------------------------------
    def with_itl_gaps(self, sql: str, params: dict, inline: bool = False) -> tuple[str, dict]:
        """``sql`` (a query starting with ``WITH`` that reads ``m_itl_gap``, agentobs/model/itl_gaps.sql) as it
        runs here: on the metric run's table when the run already made it for this window and the settings' ITL
        parameters (the weekly report computes ``itl_tail`` first: one tail gap × prefill join for both), else with
        the gaps as an inline CTE (the console's Overview runs the findings without ``itl_tail``; writing the
        table there cost more than the query). Returns the query and its parameters: ``params``, plus the gaps'
        (``itl_gap_params(settings)``) when they are inline. ``inline``: always the inline form (a finding's
        evidence: one query that runs on any metric run)."""
        from ..model.itl import itl_gap_params, itl_gaps_sql

        if not inline and self.run is not None and self.run.has_itl_gaps(self.settings):
            return sql, params
        body = sql.strip()
        if not body.upper().startswith("WITH "):
            raise ValueError("with_itl_gaps: the query must start with WITH")
        # another name than the run's table (a ClickHouse run maps m_itl_gap to its own table's name)
        inline_sql = ("WITH itl_gap_inline AS (\n" + itl_gaps_sql() + "\n),\n"
                      + re.sub(r"\bm_itl_gap\b", "itl_gap_inline", body[5:]))
        return inline_sql, {**params, **itl_gap_params(self.settings)}

    def rows(self, sql: str, params: dict | None = None) -> list[dict]:
        rel = self.cur.sql(sql, params=params or {})
        cols = rel.columns
        return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]

    def one(self, sql: str, params: dict | None = None) -> dict:
        rows = self.rows(sql, params)
        return rows[0] if rows else {}

    def setting(self, name: str):
        return getattr(self.settings, name)

    # -- scaling and grading ---------------------------------------------------------------------
    @property
    def scaled(self) -> bool:
        """Whether taxes are scaled to a week: only when the observed window is at least
        ``findings_min_window_s`` long."""
        return self.window_s >= float(self.setting("findings_min_window_s"))

    @property
    def week_scale(self) -> float:
        """Factor from the observed window to a week (the rate used for floors and severity)."""
        return WEEK_S / self.window_s if self.window_s else 0.0

    @property
    def tax_scale(self) -> float:
        """Factor applied to reported taxes: ``week_scale`` when scaled, else 1 (the observed window)."""
        return self.week_scale if self.scaled else 1.0

    def window_text(self) -> str:
        span = fmt_duration(self.window_s)
        if self.scaled:
            return f"observed window {span} scaled ×{self.week_scale:,.1f} to a week"
        return (f"observed window {span}, shorter than findings_min_window_s "
                f"({fmt_duration(float(self.setting('findings_min_window_s')))}): tax for the observed window, "
                f"not scaled to a week")

    def tax(self, tokens: float | None, usd: float | None, basis: str, method: str = "observed") -> Tax:
        """Amounts observed in the window, with their weekly figures (``× tax_scale``)."""
        s = self.tax_scale
        return Tax(
            tokens_week=None if tokens is None else float(tokens) * s,
            usd_week=None if usd is None else float(usd) * s,
            basis=f"{basis}; {self.window_text()}",
            method=method,
            period="week" if self.scaled else "window",
            tokens_window=None if tokens is None else float(tokens),
            usd_window=None if usd is None else float(usd),
            window_s=self.window_s,
            scale=s,
        )

    def weekly_rate(self, tax: Tax) -> float | None:
        """$ per week at the observed rate, whatever period the tax reports (floors and severity)."""
        if tax.usd_week is None:
            return None
        return tax.usd_week if tax.period == "week" else tax.usd_week * self.week_scale

    def severity(self, usd_week: float | Tax | None) -> str:
        """The one severity rule (every surface shows this grade): by $ per week at the observed rate (a
        :class:`Tax` of a short window is converted); a finding without a $ figure (latency, observability gaps)
        is ``info``."""
        if isinstance(usd_week, Tax):
            usd_week = self.weekly_rate(usd_week)
        if usd_week is None:
            return "info"
        if usd_week >= float(self.setting("findings_high_usd_week")):
            return "high"
        if usd_week >= float(self.setting("findings_medium_usd_week")):
            return "medium"
        return "low"

    def confidence(self, n: int, exact: bool = False, config_known: bool = True) -> str:
        """high: enough calls, exact block hashes, known config and a window of an hour or more;
        low: fewer than ``findings_min_calls`` calls; else medium."""
        if n < int(self.setting("findings_min_calls")):
            return "low"
        if exact and config_known and self.window_s >= 3600:
            return "high"
        return "medium"

    def at_stake(self, usd: float | None, tokens: float | None = None, share: float | None = None) -> bool:
        """Whether observed tax clears the floors: ``findings_min_usd_week`` (scaled) and
        ``findings_min_share`` (share of the scope's computed prefill)."""
        if usd is None or not usd > 0:
            return False
        if usd * self.week_scale < float(self.setting("findings_min_usd_week")):
            return False
        return not (share is not None and share < float(self.setting("findings_min_share")))

    def evidence(self, numbers: dict[str, Any], sql: str, params: dict | None = None) -> Evidence:
        def clean(v):
            if isinstance(v, float):
                return None if math.isnan(v) else round(v, 6)
            return v

        p = {"since": self.since, "until": self.until, **(params or {})}
        return Evidence(tuple((k, clean(v)) for k, v in numbers.items()), sql.strip(),
                        tuple(sorted(p.items())))


def ceil_to(x: float, step: float) -> float:
    return math.ceil(x / step - 1e-9) * step


def fmt_tokens(n: float | None) -> str:
    if n is None:
        return "unknown"
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:,.1f}{unit}"
    return f"{n:,.0f}"


def fmt_duration(s: float) -> str:
    """12 s, 45 min, 2.3 h, 3.5 d."""
    if s < 120:
        return f"{s:,.0f} s"
    if s < 3600:
        return f"{s / 60:,.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:,.1f} h"
    return f"{s / 86400:,.1f} d"


DEFAULT_SINCE_SQL = """
SELECT max(start_s) AS newest_s, count(*) AS calls FROM m_calls
WHERE in_filter AND ($until IS NULL OR start_s < $until)
"""


def default_since(run, until: float | None, window_s: float) -> float | None:
    """The default window start: ``window_s`` before ``until``, or before the newest call's start when
    ``until`` is not given; the metric run's ``in_win`` flags and engine samples are narrowed to it
    (``run``: an agentobs.metrics MetricRun)."""
    end = until
    if end is None:
        end = run.cur.sql(DEFAULT_SINCE_SQL, params={"until": None}).fetchall()[0][0]
        if end is None:
            return None
    since = float(end) - float(window_s)
    run.restrict_since(since)
    return since


def fmt_usd(x: float | None) -> str:
    return "unknown" if x is None else f"${x:,.2f}"
