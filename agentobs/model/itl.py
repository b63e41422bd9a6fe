"""ITL gap attribution (METRICS.md §6): the per-gap relation ``m_itl_gap`` (``itl_gaps.sql``) and its parameters."""

from __future__ import annotations

from ..config import Settings
from ..errors import QueryError


def itl_gap_params(s: Settings) -> dict:
    """The parameters of m_itl_gap (agentobs/model/itl_gaps.sql) from settings."""
    mode = str(s.itl_tail_threshold)
    if mode not in ("slo", "p99"):
        raise QueryError(f"setting itl_tail_threshold must be 'slo' or 'p99', got {mode!r}")
    return {"itl_tail_mode": mode, "itl_slo_ms": float(s.itl_slo_ms),
            "long_prefill_tokens": int(s.long_prefill_tokens)}


def itl_gaps_sql() -> str:
    """The SELECT of m_itl_gap (agentobs/model/itl_gaps.sql): MetricRun.itl_gaps stores it, Context.with_itl_gaps
    inlines it."""
    from importlib import resources

    return resources.files(__package__).joinpath("itl_gaps.sql").read_text()
