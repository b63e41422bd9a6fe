"""What every rule reads: one prepared metric run, the engine config per instance, the window.

Rules query the metric run's prepared tables (agentobs.metrics.MetricRun):

- ``m_calls``   ``call_reuse`` (METRICS.md §1/§4 per call: R_eff, X, miss cause, idle window,
                rent) joined with the cost model columns (usd_per_s, prefill_tps, g_star_s,
                reprefill_cost_usd); ``in_win`` marks calls starting in the window;
- ``m_cost``    the cost basis per instance;
- ``m_samples`` engine counters/gauges with reset-aware deltas;

plus the model view ``instance_config``. Values reach SQL only as named parameters.

Money is scaled from the observed window to a week (``× 604800 / window seconds``); every
:class:`Tax` says so next to its cost basis.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import Settings
from .finding import Evidence, Tax

WEEK_S = 7 * 86400.0

INSTANCES_SQL = """
WITH c AS (
    SELECT coalesce(instance, '') AS instance,
           mode(engine) AS engine, mode(model) AS model, count(*) AS calls,
           min(start_s) AS first_s, max(end_s) AS last_s
    FROM m_calls WHERE in_win GROUP BY ALL
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


@dataclass
class Context:
    cur: Any                       # a DuckDB cursor holding the metric run's temp tables
    settings: Settings
    since: float | None
    until: float | None
    clock: Callable[[], float] = time.time
    instances: dict[str, dict] = field(default_factory=dict)
    window_s: float = 0.0
    first_s: float | None = None
    last_s: float | None = None

    def __post_init__(self):
        self.instances = {r["instance"]: r for r in self.rows(INSTANCES_SQL)}
        firsts = [r["first_s"] for r in self.instances.values() if r["first_s"] is not None]
        lasts = [r["last_s"] for r in self.instances.values() if r["last_s"] is not None]
        self.first_s = self.since if self.since is not None else (min(firsts) if firsts else None)
        self.last_s = self.until if self.until is not None else (max(lasts) if lasts else None)
        if self.first_s is not None and self.last_s is not None:
            self.window_s = max(self.last_s - self.first_s, 1.0)

    # -- queries ---------------------------------------------------------------------------------
    def rows(self, sql: str, params: dict | None = None) -> list[dict]:
        rel = self.cur.sql(sql, params=params or {})
        cols = rel.columns
        return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]

    def one(self, sql: str, params: dict | None = None) -> dict:
        rows = self.rows(sql, params)
        return rows[0] if rows else {}

    def setting(self, name: str):
        return self.settings.get(name)

    # -- scaling and grading ---------------------------------------------------------------------
    @property
    def week_scale(self) -> float:
        return WEEK_S / self.window_s if self.window_s else 0.0

    def window_text(self) -> str:
        h = self.window_s / 3600
        span = f"{h:.1f} h" if h >= 1 else f"{self.window_s / 60:.0f} min"
        return f"observed window {span} scaled ×{self.week_scale:,.1f} to a week"

    def tax(self, tokens: float | None, usd: float | None, basis: str, method: str = "observed") -> Tax:
        s = self.week_scale
        return Tax(
            tokens_week=None if tokens is None else float(tokens) * s,
            usd_week=None if usd is None else float(usd) * s,
            basis=f"{basis}; {self.window_text()}",
            method=method,
        )

    def severity(self, usd_week: float | None) -> str:
        if usd_week is None:
            return "medium"
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


def fmt_usd(x: float | None) -> str:
    return "unknown" if x is None else f"${x:,.2f}"
