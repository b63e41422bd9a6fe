"""The finding: a small typed value object with equality, so tests compare whole lists.

A finding's ``id`` is ``<rule>/<scope>`` (e.g. ``hicache_off/instance=10.0.0.1:30000``): stable
across runs, so an acknowledgement (``agentobs findings ack ID``) keeps applying to it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("high", "medium", "low", "info")
CONFIDENCES = ("high", "medium", "low")


@dataclass(frozen=True)
class Scope:
    """Where the finding applies. All ``None`` = the whole fleet."""

    instance: str | None = None
    model: str | None = None
    task_type: str | None = None

    def key(self) -> str:
        parts = [f"{k}={v}" for k, v in (("instance", self.instance), ("model", self.model),
                                         ("task_type", self.task_type)) if v is not None]
        return ",".join(parts) or "fleet"

    def primary(self) -> str:
        """The most specific part (instance > model > task type): what a finding id is keyed on, so
        the id survives a model rename on the same instance."""
        for k, v in (("instance", self.instance), ("model", self.model), ("task_type", self.task_type)):
            if v is not None:
                return f"{k}={v}"
        return "fleet"

    def __str__(self) -> str:
        return self.key()


@dataclass(frozen=True)
class Evidence:
    """The numbers behind a finding and the SQL (with its parameters) that produced them."""

    numbers: tuple[tuple[str, Any], ...]
    sql: str
    params: tuple[tuple[str, Any], ...] = ()

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.numbers).get(name, default)


KINDS = ("reprefill", "rent", "latency", "observability")


@dataclass(frozen=True)
class Tax:
    """Recompute tax per week (``period="week"``), or for the observed window itself when that is
    shorter than ``findings_min_window_s`` (``period="window"``; the ``*_week`` fields then hold the
    window's figures). ``tokens`` / ``usd`` are ``None`` when they cannot be measured.

    ``tokens_window`` / ``usd_window`` are the amounts observed in the window (``window_s`` seconds of
    observation); ``*_week = *_window × scale`` — the scaling every surface shows next to the weekly figure."""

    tokens_week: float | None
    usd_week: float | None
    basis: str            # cost model basis and the scaling of the observed window to a week
    method: str = "observed"  # observed | analytical | "simulation (N sessions replayed)"
    period: str = "week"  # week | window
    tokens_window: float | None = None
    usd_window: float | None = None
    window_s: float | None = None
    scale: float | None = None  # *_week ÷ *_window: 604800 ÷ window_s, or 1 (period "window")
    # the band of a re-prefill tax (docs/metrics.md, "Miss causes from evidence"): the $ of the owned calls' X_low and
    # X_high, per week as usd_week; None when not a re-prefill tax. mode: exact | estimate | mixed
    usd_low_week: float | None = None
    usd_high_week: float | None = None
    mode: str | None = None

    def band_text(self) -> str:
        """The band as every surface prints it, or '' (exact, no band, or both ends print as the same amount)."""
        if self.usd_low_week is None or self.usd_high_week is None or self.mode in (None, "exact"):
            return ""
        from .context import fmt_usd  # the one $ format of every surface

        low, high = fmt_usd(self.usd_low_week), fmt_usd(self.usd_high_week)
        return "" if low == high else f"{self.mode}: {low}–{high}{self.per}"

    @property
    def per(self) -> str:
        """Suffix for an amount: ``/week`` or `` in the observed window``."""
        return "/week" if self.period == "week" else " in the observed window"


@dataclass(frozen=True)
class Claim:
    """The calls a finding owns in the tax ledger (agentobs.findings.ledger): ``sql`` selects
    ``call_id, session_id, tokens, usd`` from the metric run's tables (one row per call, ``in_win`` calls
    only), with ``params``. For a re-prefill finding ``tokens`` / ``usd`` are the call's re-prefill and
    its part of the tax; a call claimed by several findings belongs to the first in rule order."""

    sql: str
    params: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Finding:
    rule: str
    title: str
    severity: str
    scope: Scope
    evidence: Evidence
    tax: Tax
    recoverable: Tax
    confidence: str
    remediation: str
    summary: str = ""
    fix: str = ""  # the exact change in one line (flags as spelled in remediation), for headlines
    acked: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    kind: str = "reprefill"  # what the tax is: re-prefill $, idle KV rent $, latency or an observability gap
    claim: Claim | None = field(default=None, compare=False, repr=False)
    sessions: int | None = None  # sessions with a call the finding owns (ledger); None: not counted
    also_recovers: Tax | None = None  # what the fix recovers beyond this finding's own tax (ledger)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} not in {SEVERITIES}")
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"confidence {self.confidence!r} not in {CONFIDENCES}")
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r} not in {KINDS}")

    @property
    def id(self) -> str:
        return f"{self.rule}/{self.scope.primary()}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d = {"id": self.id, **d}
        d["scope"] = {k: v for k, v in d["scope"].items() if v is not None}
        d["evidence"] = {"numbers": dict(self.evidence.numbers), "sql": self.evidence.sql,
                         "params": dict(self.evidence.params)}
        d["acked"] = dict(self.acked) or None
        d.pop("claim", None)
        return d
