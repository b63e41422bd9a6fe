"""The recompute-tax ledger: the findings of one (window, filters), computed once, that every surface renders.

``build(db, since, until, filters)`` runs the rules over one metric run and settles what they claim:

- **Ownership.** A re-prefill finding claims calls (its :class:`~agentobs.findings.finding.Claim`); a call claimed
  by several findings belongs to the first in rule order (``rules.RULES``: cache off, routing, FCFS queueing, the
  second-tier rules, retention). A finding's tax is the re-prefill of the calls it owns, so the tax of all
  findings together never exceeds the fleet's re-prefill (``Ledger.fleet``). A finding whose owned tax no longer
  clears the floors is dropped; its calls stay unattributed.
- **Recoverable ≤ tax.** What a fix recovers of its own finding's tax is at most that tax; a simulated saving
  beyond it (a fix that also removes re-prefill other findings own or no finding owns) is ``also_recovers``.
- **One severity** (``Context.severity``: the weekly $ rate; unpriced findings are ``info``) and **one order**:
  $/week at stake, then severity, then id.
- **Sessions affected**: the sessions with a call the finding owns, with their calls, tokens and $
  (``Ledger.affected``), so a finding leads to its sessions.

The fleet's recompute tax (every re-prefill token of the window, by miss cause, and over time) is in the same
result, so the headline, the findings and the trend come from one metric run. The CLI (``agentobs findings``),
the console's Overview and Findings pages, the weekly report and the exporter render a Ledger; none recomputes,
re-filters or re-scales. docs/findings.md states the definitions.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import Settings, load_settings
from ..source import Source
from .acks import active
from .context import Context, default_since, fmt_duration, fmt_usd
from .finding import SEVERITIES, Finding, Tax

# the kinds whose claims are settled against each other (a call's re-prefill has one owner; rent, another $, too)
OWNED_KINDS = ("reprefill", "rent", "observability")

# by cause: every cause with a re-prefill or a band (a hit within the tolerance, a prompt edit: X = 0, X_high > 0)
FLEET_SQL = """
SELECT coalesce(CAST(miss_cause AS VARCHAR), 'none') AS cause, count(*) AS calls,
       count(DISTINCT session_id) AS sessions,
       CAST(coalesce(sum(reprefill_tokens), 0) AS BIGINT) AS tokens,
       coalesce(sum(reprefill_cost_usd), 0) AS usd,
       CAST(coalesce(sum(reprefill_low_tokens), 0) AS BIGINT) AS tokens_low,
       CAST(coalesce(sum(reprefill_high_tokens), 0) AS BIGINT) AS tokens_high,
       coalesce(sum(reprefill_cost_low_usd), 0) AS usd_low,
       coalesce(sum(reprefill_cost_high_usd), 0) AS usd_high
FROM m_calls
WHERE in_win AND (reprefill_tokens > 0 OR reprefill_high_tokens > 0)
GROUP BY ALL
ORDER BY usd DESC, usd_high DESC, cause
"""

TOTALS_SQL = """
SELECT count(*) AS calls, count(DISTINCT session_id) AS sessions,
       count(DISTINCT session_id) FILTER (WHERE reprefill_tokens > 0) AS sessions_with_reprefill,
       CAST(coalesce(sum(prompt_tokens), 0) AS BIGINT) AS prompt_tokens,
       CAST(coalesce(sum(reprefill_tokens), 0) AS BIGINT) AS reprefill_tokens,
       coalesce(sum(reprefill_cost_usd), 0) AS reprefill_usd,
       CAST(coalesce(sum(reprefill_low_tokens), 0) AS BIGINT) AS reprefill_low_tokens,
       CAST(coalesce(sum(reprefill_high_tokens), 0) AS BIGINT) AS reprefill_high_tokens,
       coalesce(sum(reprefill_cost_low_usd), 0) AS reprefill_low_usd,
       coalesce(sum(reprefill_cost_high_usd), 0) AS reprefill_high_usd,
       CASE WHEN count(*) FILTER (WHERE reprefill_high_tokens > 0 AND mode = 'estimate') = 0 THEN 'exact'
            WHEN count(*) FILTER (WHERE reprefill_high_tokens > 0 AND mode = 'exact') = 0 THEN 'estimate'
            ELSE 'mixed' END AS mode
FROM m_calls WHERE in_win
"""

# the tax over time by cause: buckets of $bucket_s seconds by call start
TREND_SQL = """
SELECT CAST(floor(start_s / $bucket_s) * $bucket_s AS DOUBLE) AS t_s, CAST(miss_cause AS VARCHAR) AS cause,
       CAST(sum(reprefill_tokens) AS BIGINT) AS tokens, sum(reprefill_cost_usd) AS usd
FROM m_calls
WHERE in_win AND reprefill_tokens > 0
GROUP BY ALL
ORDER BY t_s, cause
"""


@dataclass(frozen=True)
class CauseTax:
    cause: str
    calls: int
    sessions: int
    tokens_window: float
    usd_window: float
    tokens_week: float
    usd_week: float
    # the band (docs/metrics.md, "Miss causes from evidence"): X_low / X_high of the cause's calls, in the window
    tokens_low_window: float = 0.0
    tokens_high_window: float = 0.0
    usd_low_window: float = 0.0
    usd_high_window: float = 0.0


@dataclass(frozen=True)
class Affected:
    """One session a finding owns calls of."""

    session_id: str | None
    calls: int
    tokens: float
    usd: float


@dataclass(frozen=True)
class Ledger:
    findings: tuple[Finding, ...]
    since: float | None          # the window asked (resolved; the default start when none was given)
    until: float | None
    first_s: float | None        # observed: [since, until) ∩ [first, last observation]
    last_s: float | None
    window_s: float
    scale: float                 # weekly figure ÷ window figure (1 when the window is too short to scale)
    period: str                  # week | window (Tax.period)
    window_text: str
    filters: tuple[tuple[str, tuple[str, ...]], ...]
    calls: int
    sessions: int
    prompt_tokens: float
    tokens_window: float         # the fleet's re-prefill in the window (every cause)
    usd_window: float
    by_cause: tuple[CauseTax, ...]
    trend: tuple[tuple[float, str, float, float], ...]  # (bucket start s, cause, tokens, usd)
    trend_bucket_s: float
    affected: dict[str, tuple[Affected, ...]] = field(default_factory=dict, compare=False)
    sessions_with_reprefill: int = 0
    computed_s: float = 0.0
    # the band of the fleet's re-prefill in the window (X_low: with evidence of its cause; X_high: every shortfall)
    # and the mode of the calls behind it: exact | estimate | mixed
    tokens_low_window: float = 0.0
    tokens_high_window: float = 0.0
    usd_low_window: float = 0.0
    usd_high_window: float = 0.0
    mode: str = "exact"

    def band_text(self) -> str:
        """The fleet tax's band as every surface prints it ('' in exact mode, or when both ends print alike)."""
        if self.mode == "exact":
            return ""
        low, high = fmt_usd(self.usd_low_window * self.scale), fmt_usd(self.usd_high_window * self.scale)
        return "" if low == high else f"{self.mode}: {low}–{high}{self.per}"

    # -- the fleet's figures, scaled as every finding's --------------------------------------------
    @property
    def tokens_week(self) -> float:
        return self.tokens_window * self.scale

    @property
    def usd_week(self) -> float:
        return self.usd_window * self.scale

    @property
    def per(self) -> str:
        return "/week" if self.period == "week" else " in the observed window"

    def owned(self, kind: str = "reprefill") -> tuple[float, float]:
        """(tokens, $) per week that the findings of ``kind`` own together."""
        fs = [f for f in self.findings if f.kind == kind]
        return (sum(f.tax.tokens_week or 0.0 for f in fs), sum(f.tax.usd_week or 0.0 for f in fs))

    @property
    def unattributed_usd_week(self) -> float:
        """Re-prefill $ per week no finding owns (below the floors, or no rule for its cause)."""
        return max(self.usd_week - self.owned("reprefill")[1], 0.0)

    def sessions_of(self, finding_id: str) -> list[dict[str, Any]]:
        """The sessions a finding owns calls of, most $ first: calls, their re-prefill tokens, $ in the window and
        per week (× the ledger's scale) — what `agentobs findings sessions` and the console's Sessions page list."""
        return [{"session_id": a.session_id, "calls": a.calls, "reprefill_tokens": a.tokens, "usd_window": a.usd,
                 "usd_week": a.usd * self.scale} for a in self.affected.get(finding_id, ())]

    def get(self, finding_id: str) -> Finding | None:
        return next((f for f in self.findings if f.id == finding_id), None)

    def top_fixes(self, n: int = 3) -> list[Finding]:
        """The findings with a $ figure, in ledger order."""
        return [f for f in self.findings if f.tax.usd_week is not None and f.tax.usd_week > 0][:n]

    def to_dict(self) -> dict[str, Any]:
        owned_tok, owned_usd = self.owned("reprefill")
        return {
            "window": {"since": self.since, "until": self.until, "observed_first_s": self.first_s,
                       "observed_last_s": self.last_s, "window_s": self.window_s, "scale": self.scale,
                       "period": self.period, "text": self.window_text, "filters": dict(self.filters)},
            "fleet": {"calls": self.calls, "sessions": self.sessions,
                      "sessions_with_reprefill": self.sessions_with_reprefill,
                      "prompt_tokens": self.prompt_tokens,
                      "tax": {"tokens_window": self.tokens_window, "usd_window": self.usd_window,
                              "tokens_week": self.tokens_week, "usd_week": self.usd_week, "mode": self.mode,
                              "band": {"tokens_low_window": self.tokens_low_window,
                                       "tokens_high_window": self.tokens_high_window,
                                       "usd_low_week": self.usd_low_window * self.scale,
                                       "usd_high_week": self.usd_high_window * self.scale}},
                      "owned_by_findings": {"tokens_week": owned_tok, "usd_week": owned_usd},
                      "unattributed_usd_week": self.unattributed_usd_week,
                      "by_cause": [dataclasses.asdict(c) for c in self.by_cause]},
            "findings": [f.to_dict() for f in self.findings],
            "trend": {"bucket_s": self.trend_bucket_s,
                      "rows": [{"t_s": t, "cause": c, "tokens": k, "usd": u} for t, c, k, u in self.trend]},
        }

    def to_json(self) -> bytes:
        from ..output import _jsonable

        return (json.dumps(_jsonable(self.to_dict()), indent=2, ensure_ascii=False) + "\n").encode()


def order_key(f: Finding):
    """The one order every surface lists findings in: $/week at stake (unpriced last), then severity, then id."""
    usd = f.tax.usd_week
    return (usd is None, -(usd or 0.0), SEVERITIES.index(f.severity), f.id)


_BUCKETS_S = (60.0, 300.0, 900.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 12 * 3600.0, 86400.0)


def _bucket_s(window_s: float) -> float:
    """The trend's bucket: the smallest of 1 min … 1 d that keeps the window to at most 48 buckets."""
    return next((b for b in _BUCKETS_S if window_s / b <= 48), _BUCKETS_S[-1])


_PARAM = re.compile(r"\$([A-Za-z_]\w*)")


def _claims_sql(found: list[tuple[int, Finding]]) -> tuple[str, dict]:
    """One query settling the claims of ``found`` ((rank, finding) pairs): per finding rank and session, the
    calls it owns (the first rank claiming a call owns it), their tokens and $."""
    ctes, parts, params = [], [], {}
    for k, f in found:
        claim = f.claim
        if claim is None:  # _settle passes claiming findings only
            continue
        own = dict(claim.params)
        sql = _PARAM.sub(f"$c{k}_\\1", claim.sql.strip().rstrip(";"))  # $name → $c<k>_name
        params.update({f"c{k}_{n}": v for n, v in own.items()})
        ctes.append(f"c{k} AS (\n{sql}\n)")
        parts.append(f"SELECT {k} AS k, call_id, session_id, CAST(tokens AS DOUBLE) AS tokens, "
                     f"CAST(usd AS DOUBLE) AS usd FROM c{k}")
    # the band of an owned call's $: its claimed $ scaled by X_low / X and X_high / X (a call's claim is its
    # re-prefill, or for the retention rule re-prefill less rent: the same share of it is in doubt)
    sql = ("WITH " + ",\n".join(ctes) + ",\nclaims AS (\n" + "\nUNION ALL\n".join(parts) + "\n),\n"
           "firsts AS (SELECT call_id, min(k) AS k FROM claims GROUP BY call_id),\n"
           "band AS (SELECT call_id, any_value(mode) AS mode,\n"
           "         any_value(CAST(reprefill_low_tokens AS DOUBLE) / nullif(reprefill_tokens, 0)) AS lo,\n"
           "         any_value(CAST(reprefill_high_tokens AS DOUBLE) / nullif(reprefill_tokens, 0)) AS hi\n"
           "  FROM m_calls WHERE in_win AND call_id IN (SELECT call_id FROM firsts) GROUP BY call_id)\n"
           "SELECT c.k, c.session_id, count(*) AS calls, coalesce(sum(c.tokens), 0) AS tokens, "
           "coalesce(sum(c.usd), 0) AS usd,\n"
           "coalesce(sum(c.usd * coalesce(b.lo, 1.0)), 0) AS usd_low, coalesce(sum(c.usd * coalesce(b.hi, 1.0)), 0) "
           "AS usd_high,\ncount(*) FILTER (WHERE b.mode = 'estimate') AS estimate_calls\n"
           "FROM claims c JOIN firsts f ON f.call_id = c.call_id AND f.k = c.k\n"
           "LEFT JOIN band b ON b.call_id = c.call_id\n"
           "GROUP BY c.k, c.session_id\nORDER BY c.k, usd DESC, c.session_id")
    return sql, params


def _settle(found: list[Finding], ctx: Context) -> tuple[list[Finding], dict[str, tuple[Affected, ...]]]:
    """Each claiming finding's tax from the calls it owns; drops those that no longer clear the floors."""
    affected: dict[str, tuple[Affected, ...]] = {}
    out = list(found)
    for kind in OWNED_KINDS:
        ranked = [(i, f) for i, f in enumerate(out) if f.kind == kind and f.claim is not None]
        if not ranked:
            continue
        sql, params = _claims_sql(ranked)
        per: dict[int, list[Affected]] = {i: [] for i, _ in ranked}
        band: dict[int, list[float]] = {i: [0.0, 0.0, 0, 0] for i, _ in ranked}  # usd low, usd high, est., calls
        for r in ctx.rows(sql, params):
            per[r["k"]].append(Affected(r["session_id"], int(r["calls"]), float(r["tokens"]), float(r["usd"])))
            b = band[r["k"]]
            b[0] += float(r["usd_low"])
            b[1] += float(r["usd_high"])
            b[2] += int(r["estimate_calls"])
            b[3] += int(r["calls"])
        for i, f in ranked:
            rows = per[i]
            affected[f.id] = tuple(rows)
            if kind == "observability":
                out[i] = dataclasses.replace(f, sessions=len({a.session_id for a in rows}))
                continue
            tok, usd = sum(a.tokens for a in rows), sum(a.usd for a in rows)
            before = f.tax.usd_window
            tax = _rescale(f.tax, tok, usd, ctx)
            if kind == "reprefill":
                lo, hi, est, n = band[i]
                mode = "exact" if est == 0 else "estimate" if est == n else "mixed"
                tax = dataclasses.replace(tax, usd_low_week=lo * ctx.tax_scale, usd_high_week=hi * ctx.tax_scale,
                                          mode=mode)
            if before is not None and usd < before - 1e-9:
                shared = before - usd
                tax = dataclasses.replace(tax, basis=f"{tax.basis}; owned calls only: ${shared:,.2f} of the observed "
                                                     f"${before:,.2f} belongs to a finding listed before it")
            out[i] = dataclasses.replace(f, tax=tax, sessions=len({a.session_id for a in rows}))
    keep = []
    for f in out:
        if f.kind in ("reprefill", "rent") and f.claim is not None and not ctx.at_stake(f.tax.usd_window,
                                                                                       f.tax.tokens_window):
            affected.pop(f.id, None)
            continue
        keep.append(f)
    return keep, affected


def _rescale(tax: Tax, tokens: float | None, usd: float | None, ctx: Context) -> Tax:
    s = ctx.tax_scale
    return dataclasses.replace(
        tax, tokens_window=tokens, usd_window=usd, tokens_week=None if tokens is None else tokens * s,
        usd_week=None if usd is None else usd * s, window_s=ctx.window_s, scale=s)


def _cap(f: Finding, ctx: Context) -> Finding:
    """Recoverable ≤ tax: an analytical estimate is the owned tax itself; a simulated saving above the tax
    moves its surplus to ``also_recovers``."""
    rec, tax = f.recoverable, f.tax
    if f.kind not in ("reprefill", "rent") or rec.usd_week is None and rec.tokens_week is None:
        return f
    if rec.method == "analytical":
        rec = _rescale(rec, tax.tokens_window, tax.usd_window, ctx)
        return dataclasses.replace(f, recoverable=rec)

    def over(a, b):
        return a is not None and b is not None and a > b + 1e-9

    if not (over(rec.usd_window, tax.usd_window) or over(rec.tokens_window, tax.tokens_window)):
        return f
    ex_tok = max((rec.tokens_window or 0.0) - (tax.tokens_window or 0.0), 0.0)
    ex_usd = None if rec.usd_window is None or tax.usd_window is None else max(rec.usd_window - tax.usd_window, 0.0)
    capped = _rescale(rec, min(rec.tokens_window or 0.0, tax.tokens_window or 0.0),
                      None if rec.usd_window is None or tax.usd_window is None else min(rec.usd_window, tax.usd_window),
                      ctx)
    capped = dataclasses.replace(capped, basis=f"{rec.basis}; capped at this finding's tax (the rest is "
                                                 "'also recovers')")
    also = _rescale(dataclasses.replace(
        rec, basis="simulated saving beyond this finding's own tax: re-prefill the same fix also removes that "
                   "other findings own or that no finding owns (not part of this finding's tax or recoverable)"),
        ex_tok, ex_usd, ctx)
    return dataclasses.replace(f, recoverable=capped, also_recovers=also)


def _graded(f: Finding, ctx: Context) -> Finding:
    """The one severity (on the band's lower end when the tax has a band: what the evidence proves) and the
    confidence, lowered by the band's spread: X_high more than twice X_low makes it low, more than 1.25× at most
    medium (docs/findings.md)."""
    t = f.tax
    if t.mode in ("estimate", "mixed") and t.usd_low_week is not None:
        sev = ctx.severity(dataclasses.replace(t, usd_week=t.usd_low_week))  # same period conversion as the tax
        conf = f.confidence
        hi, lo = t.usd_high_week or 0.0, t.usd_low_week
        if hi > 2.0 * lo:
            conf = "low"
        elif hi > 1.25 * lo and conf == "high":
            conf = "medium"
        return dataclasses.replace(f, severity=sev, confidence=conf)
    return dataclasses.replace(f, severity=ctx.severity(t))


def _coverage_text(ctx: Context, since_given: bool) -> str:
    base = ctx.window_text()
    if since_given and ctx.since is not None and ctx.until is not None and ctx.window_s + 1 < ctx.until - ctx.since:
        return f"{base} (data covers {fmt_duration(ctx.window_s)} of the {fmt_duration(ctx.until - ctx.since)} asked)"
    return base


def build(db: Source, since=None, until=None, filters: dict | None = None, settings: Settings | None = None, *,
          include_acked: bool = False, simulate: bool = True, clock: Callable[[], float] = time.time,
          run=None) -> Ledger:
    """The ledger of calls starting in ``[since, until)`` under the attribute ``filters`` (as agentobs.metrics
    takes them). Without ``since`` the window is ``findings_default_window_s`` (7 days) ending at ``until`` or at
    the newest call. ``db``: a Source (agentobs.source). Acknowledged findings
    are left out unless ``include_acked``. ``simulate``: recoverable tax by replaying the observed sessions through
    the simulator (agentobs.findings.estimate), else the analytical estimate. ``run``: a prepared
    agentobs.metrics MetricRun already on this window (and these filters) to read instead of preparing one — the
    weekly report's run moved to the week before; it stays open."""
    from ..metrics import prepare
    from .estimate import refine
    from .rules import RULES

    t0 = time.perf_counter()
    settings = settings if settings is not None else load_settings()
    if run is not None:
        mrun, close = run, (lambda: None)
    else:
        mrun, close = prepare(db, since, until, filters=filters, settings=settings, clock=clock)
    try:
        given = mrun.since is not None
        start = mrun.since if given else default_since(mrun, mrun.until,
                                                       float(settings.findings_default_window_s))
        ctx = Context(mrun.cur, settings, start, mrun.until, clock, since_given=given, run=mrun)
        found: list[Finding] = []
        for rule in RULES:
            found.extend(rule.check(ctx))
        found, affected = _settle(found, ctx)
        found = refine(found, ctx, simulate=simulate)
        found = [_cap(f, ctx) for f in found]
        found = [_graded(f, ctx) for f in found]
        acks = active(mrun.cur, clock)
        totals = ctx.one(TOTALS_SQL)
        by_cause = [CauseTax(r["cause"], int(r["calls"]), int(r["sessions"]), float(r["tokens"]), float(r["usd"]),
                             float(r["tokens"]) * ctx.tax_scale, float(r["usd"]) * ctx.tax_scale,
                             float(r["tokens_low"]), float(r["tokens_high"]), float(r["usd_low"] or 0.0),
                             float(r["usd_high"] or 0.0))
                    for r in ctx.rows(FLEET_SQL)]
        bucket = _bucket_s(ctx.window_s)
        trend = tuple((float(r["t_s"]), r["cause"], float(r["tokens"]), float(r["usd"] or 0.0))
                      for r in ctx.rows(TREND_SQL, {"bucket_s": bucket}))
        window_text = _coverage_text(ctx, given)
    finally:
        try:
            mrun.reset_window()  # the run may be shared (agentobs.metrics.prepare): give it back with its window
        finally:
            close()
    out = []
    for f in found:
        a = acks.get(f.id)
        if a is not None:
            if not include_acked:
                affected.pop(f.id, None)
                continue
            f = dataclasses.replace(f, acked=tuple((k, a[k]) for k in ("reason", "until", "created_by")))
        out.append(f)
    out.sort(key=order_key)
    flt = tuple(sorted((k, tuple([v] if isinstance(v, str) else v)) for k, v in (filters or {}).items()))
    return Ledger(
        findings=tuple(out), since=start, until=mrun.until, first_s=ctx.first_s, last_s=ctx.last_s,
        window_s=ctx.window_s, scale=ctx.tax_scale, period="week" if ctx.scaled else "window",
        window_text=window_text, filters=flt, calls=int(totals.get("calls") or 0),
        sessions=int(totals.get("sessions") or 0), prompt_tokens=float(totals.get("prompt_tokens") or 0),
        tokens_window=float(totals.get("reprefill_tokens") or 0), usd_window=float(totals.get("reprefill_usd") or 0),
        by_cause=tuple(by_cause), trend=trend, trend_bucket_s=bucket, affected=affected,
        sessions_with_reprefill=int(totals.get("sessions_with_reprefill") or 0),
        computed_s=time.perf_counter() - t0,
        tokens_low_window=float(totals.get("reprefill_low_tokens") or 0),
        tokens_high_window=float(totals.get("reprefill_high_tokens") or 0),
        usd_low_window=float(totals.get("reprefill_low_usd") or 0),
        usd_high_window=float(totals.get("reprefill_high_usd") or 0), mode=totals.get("mode") or "exact")
