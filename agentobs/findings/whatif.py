"""What-if replays of the observed window: the observed sessions through the simulator as configured and
with a configuration change, before/after, and the simulator's calibration error on the unchanged replay.

One replay path: :func:`run` builds the same :class:`agentobs.findings.replay.Replay` the findings' recoverable tax
is simulated on (same window, ``findings_sim_sessions`` / ``findings_sim_seed``), and a finding's fix is a list of
the same :class:`Change` objects resolved by :func:`resolve` (agentobs.findings.estimate). So ``prefix_cache=on``
asked here and the ``prefix_cache_off`` finding's recoverable are one simulation, one number.

Changes (``key=value``, optionally ``@instance``; without an instance: every replayed instance it applies to):

- ``prefix_cache=on|off``: vLLM prefix caching / SGLang radix cache;
- ``hicache=on|off`` (SGLang; on = ``write_through``), ``hicache_ratio=R`` (SGLang, host tier × GPU pool);
- ``offload_gib=N`` (vLLM CPU KV tier of N GiB; needs the instance's KV bytes per token; 0 = off);
- ``kv_capacity=×F`` (also ``xF``, ``Fx``: the GPU KV pool × F) or ``kv_capacity=TOKENS``;
- ``router=POLICY`` (``round_robin``, ``least_loaded``, ``cache_aware``, ``session_affinity``): the pools holding
  the instance(s);
- ``schedule_policy=fcfs|lpm``.

Figures (docs/whatif.md): per instance and for the fleet, before → after, over the replayed sessions scaled to the
window by prompt tokens (``Pool.scale``, as the findings) and to a week as the findings' tax (``Context.tax_scale``):
computed prefill Σ(P − C) and its GPU-time $ (the tax's cost basis: ``÷ prefill_tps × $/s``), re-prefill ΣX, and
turn-resume TTFT p50/p99 (TTFT of calls 2…n, METRICS.md §5; percentiles are not scaled). Calibration: the unchanged
replay against what was observed for the same sessions: Σ(P − C), ΣX and turn-resume TTFT p50/p99, error =
simulated ÷ observed − 1.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..config import Settings, load_settings
from ..errors import AgentobsError
from ..source import Source
from .context import Context, default_since, fmt_duration
from .replay import Fix, Pool, Replay, ReplayError, SimResult, build

KEYS = ("prefix_cache", "hicache", "hicache_ratio", "offload_gib", "kv_capacity", "router", "schedule_policy")
_ON = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}
_FACTOR = re.compile(r"^(?:[×x*]\s*(?P<a>\d+(?:\.\d+)?)|(?P<b>\d+(?:\.\d+)?)\s*[×x])$")


class WhatIfError(AgentobsError):
    """A change that cannot be parsed or applied (the message names the change and why)."""


@dataclass(frozen=True)
class Change:
    """One configuration change: ``key=value``, on ``scope`` (an instance) or every instance it applies to."""

    key: str
    value: str
    scope: str | None = None

    @classmethod
    def parse(cls, text: str) -> Change:
        raw = text.strip()
        key, sep, rest = raw.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep or not key:
            raise WhatIfError(f"--change {text!r}: expected KEY=VALUE[@INSTANCE], e.g. prefix_cache=on or "
                              f"kv_capacity=x2@10.0.0.1:8000; keys: {', '.join(KEYS)}")
        value, at, scope = rest.partition("@")
        ch = cls(key, value.strip(), scope.strip() or None if at else None)
        ch.check()
        return ch

    def text(self) -> str:
        return f"{self.key}={self.value}" + (f"@{self.scope}" if self.scope else "")

    def check(self) -> None:
        """Raise WhatIfError when the value does not fit the key."""
        k, v = self.key, self.value.lower()
        bad = None
        if k not in KEYS:
            raise WhatIfError(f"--change {self.text()!r}: unknown key {k!r}; keys: {', '.join(KEYS)}")
        if k in ("prefix_cache", "hicache") and v not in _ON:
            bad = "on or off"
        elif k == "hicache_ratio" and not _positive(v):
            bad = "a ratio > 0 (host tier ÷ GPU pool), e.g. 2"
        elif k == "offload_gib" and not (_number(v) and float(v) >= 0):
            bad = "GiB ≥ 0, e.g. 64"
        elif k == "kv_capacity" and _capacity(v) is None:
            bad = "a factor (×2, x2, 2x) or a token count (600000)"
        elif k == "router":
            from ..sim.router import POLICIES

            if v not in POLICIES:
                bad = "one of " + ", ".join(POLICIES)
        elif k == "schedule_policy" and v not in ("fcfs", "lpm"):
            bad = "fcfs or lpm"
        if bad:
            raise WhatIfError(f"--change {self.text()!r}: {k} takes {bad}")

    def label(self) -> str:
        v = self.value.lower()
        where = f" at {self.scope}" if self.scope else ""
        if self.key == "prefix_cache":
            return f"prefix caching {'on' if _ON[v] else 'off'}{where}"
        if self.key == "hicache":
            return f"HiCache {'on (write_through)' if _ON[v] else 'off'}{where}"
        if self.key == "kv_capacity":
            kind, x = _capacity_of(v)
            return f"KV pool {'×' + format(x, 'g') if kind == 'factor' else format(int(x), ',') + ' tokens'}{where}"
        if self.key == "offload_gib":
            return f"a {float(v):g} GiB CPU KV tier{where}" if float(v) > 0 else f"no CPU KV tier{where}"
        return f"{self.key} {self.value}{where}"


def _number(v: str) -> bool:
    try:
        return math.isfinite(float(v))
    except ValueError:
        return False


def _positive(v: str) -> bool:
    return _number(v) and float(v) > 0


def _capacity(v: str) -> tuple[str, float] | None:
    m = _FACTOR.match(v.strip())
    if m:
        f = float(m.group("a") or m.group("b"))
        return ("factor", f) if f > 0 else None
    if v.isdigit() and int(v) > 0:
        return ("tokens", float(v))
    return None


def _capacity_of(v: str) -> tuple[str, float]:
    """A kv_capacity value that parsing accepted (``Change`` checks it with ``_capacity``)."""
    c = _capacity(v)
    if c is None:
        raise ValueError(f"kv_capacity {v!r} is neither a factor nor a token count")
    return c


# -- resolving changes into a replay fix -------------------------------------------------------------------
def _spec_of(replay: Replay, inst: str):
    for p in replay.pools:
        if p.skip is None:
            for s in p.specs:
                if s.name == inst:
                    return p, s
    return None, None


def resolve(changes: Iterable[Change], replay: Replay, ctx: Context, label: str | None = None) -> tuple[Fix, list[str]]:
    """The replay :class:`Fix` the ``changes`` make (per-instance spec overrides, router policies) and notes on
    what was not applied (a change that does not fit an instance's engine, or that it already has). The fix's key
    is its content, so equal fixes share one simulation (``Replay.result`` memoises on it)."""
    from ..sim.presets import preset

    changes = list(changes)
    replayed = [s.name for p in replay.pools if p.skip is None for s in p.specs]
    over: dict[str, dict] = {}
    router: str | None = None
    router_insts: list[str] = []
    notes: list[str] = []
    offload: dict[str, float] = {}
    for ch in changes:
        if ch.scope is not None and ch.scope not in replayed:
            pool = replay.pool_of(ch.scope)
            why = pool.skip if pool is not None else "no calls in the window"
            raise WhatIfError(f"{ch.text()}: instance {ch.scope} not replayed ({why}); replayed: "
                              f"{', '.join(replayed) or 'none'}")
        targets = [ch.scope] if ch.scope else replayed
        v = ch.value.lower()
        if ch.key == "router":
            router, router_insts = v, sorted(set(router_insts) | set(targets))
            continue
        for inst in targets:
            _pool, spec = _spec_of(replay, inst)
            o = over.setdefault(inst, {})
            if ch.key == "prefix_cache":
                o["prefix_caching"] = _ON[v]
            elif ch.key in ("hicache", "hicache_ratio"):
                if spec.engine != "sglang":
                    notes.append(f"{ch.text()}: not applied to {inst} ({spec.engine}: HiCache is SGLang's; for vLLM "
                                 "see offload_gib)")
                    continue
                if ch.key == "hicache":
                    o["hicache"] = _ON[v]
                    if _ON[v]:
                        o["hicache_write_policy"] = "write_through"
                else:
                    o["hicache_ratio"] = float(v)
            elif ch.key == "offload_gib":
                if spec.engine != "vllm":
                    notes.append(f"{ch.text()}: not applied to {inst} ({spec.engine}: the CPU tier is vLLM's; for "
                                 "SGLang see hicache)")
                    continue
                offload[inst] = float(v)
            elif ch.key == "kv_capacity":
                kind, x = _capacity_of(v)
                cap = o.get("kv_capacity_tokens") or spec.kv_capacity_tokens or preset(spec.preset).kv_capacity_tokens
                o["kv_capacity_tokens"] = int(cap * x) if kind == "factor" else int(x)
            elif ch.key == "schedule_policy":
                o["schedule_policy"] = v
    # the CPU tier is sized in GiB: a ratio to the GPU pool the instance has after the other changes
    for inst, gib in offload.items():
        _pool, spec = _spec_of(replay, inst)
        cfg = ctx.instances.get(inst) or {}
        cap = over.get(inst, {}).get("kv_capacity_tokens") or cfg.get("kv_capacity_tokens") or spec.kv_capacity_tokens
        if gib > 0 and not (cfg.get("bytes_per_token") and cap):
            raise WhatIfError(f"--change offload_gib={gib:g}: the KV bytes per token of {inst} are unknown (no "
                              "model geometry / cache dtype in its config), so GiB cannot be turned into tokens")
        over.setdefault(inst, {})["offload_ratio"] = gib * 2**30 / cfg["bytes_per_token"] / cap if gib > 0 else 0.0
    # keep what differs from the instance as configured
    final: list[tuple[str, tuple]] = []
    for inst in sorted(over):
        _pool, spec = _spec_of(replay, inst)
        diff = tuple(sorted((k, val) for k, val in over[inst].items() if getattr(spec, k) != val))
        if diff:
            final.append((inst, diff))
        elif over[inst] and ch_scope_named(changes, inst):
            notes.append(f"{inst}: already configured so ({', '.join(f'{k}={val}' for k, val in over[inst].items())})")
    pools = [p for p in replay.pools if p.skip is None and any(i in p.instances for i in router_insts)]
    if router is not None and all(p.router == router for p in pools):
        notes.append(f"router={router}: the replayed pools already route so")
        router, router_insts = None, []
    key = repr((tuple(final), router, tuple(router_insts)))
    label = label or "; ".join(ch.label() for ch in changes)
    return Fix(key, label, tuple(final), router=router, router_instances=tuple(router_insts)), notes


def ch_scope_named(changes: list[Change], inst: str) -> bool:
    return any(c.scope == inst for c in changes)


# -- the report ---------------------------------------------------------------------------------------------
def quantile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between order statistics (DuckDB's ``quantile_cont``, the metrics' percentiles)."""
    if not xs:
        return None
    xs = sorted(xs)
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (h - lo)


@dataclass(frozen=True)
class Side:
    """One side (as configured, or with the change) of one scope, scaled to the reported period."""

    computed_tokens: float          # Σ(P − C)
    usd: float | None               # its GPU-time cost (None: an instance without a cost basis)
    reprefill_tokens: float         # ΣX
    ttft_p50_s: float | None        # turn-resume TTFT over the replayed calls 2…n
    ttft_p99_s: float | None
    calls: int                      # replayed calls served


@dataclass(frozen=True)
class Row:
    scope: str                      # "fleet" or an instance
    before: Side
    after: Side


@dataclass(frozen=True)
class Calibration:
    scope: str
    figure: str                     # computed_tokens, reprefill_tokens, ttft_p50_s, ttft_p99_s
    observed: float | None
    simulated: float | None

    @property
    def error(self) -> float | None:
        if self.observed is None or self.simulated is None or self.observed == 0:
            return None
        return self.simulated / self.observed - 1.0


@dataclass
class WhatIf:
    changes: tuple[Change, ...]
    label: str
    since: float | None
    until: float | None
    window_text: str
    period: str                     # "week" or "window"
    scale: float                    # window → period (the findings' tax_scale)
    sessions_total: int
    sessions_replayed: int
    calls_replayed: int
    seed: int
    rows: list[Row]                 # fleet first, then one per replayed instance
    calibration: list[Calibration]
    notes: list[str] = field(default_factory=list)
    computed_s: float = 0.0

    def row(self, scope: str) -> Row | None:
        return next((r for r in self.rows if r.scope == scope), None)

    @property
    def per(self) -> str:
        return "/week" if self.period == "week" else " in the window"

    def table(self):
        """Long form: scope × figure, before, after, change (what the CLI, the console and JSON print)."""
        import pyarrow as pa

        cols: dict[str, list] = {k: [] for k in ("scope", "figure", "before", "after", "change")}
        for r in self.rows:
            for name, attr in ((f"computed prefill tokens{self.per}", "computed_tokens"),
                               (f"computed prefill ${self.per}", "usd"),
                               (f"re-prefill tokens{self.per}", "reprefill_tokens"),
                               ("turn-resume TTFT p50 (s)", "ttft_p50_s"),
                               ("turn-resume TTFT p99 (s)", "ttft_p99_s")):
                a, b = getattr(r.before, attr), getattr(r.after, attr)
                cols["scope"].append(r.scope)
                cols["figure"].append(name)
                cols["before"].append(None if a is None else float(a))
                cols["after"].append(None if b is None else float(b))
                cols["change"].append(None if a is None or b is None or a == 0 else b / a - 1.0)
        return pa.table(cols, schema=pa.schema([("scope", pa.string()), ("figure", pa.string()),
                                                ("before", pa.float64()), ("after", pa.float64()),
                                                ("change", pa.float64())]))

    def calibration_table(self):
        import pyarrow as pa

        rows = [{"scope": c.scope, "figure": c.figure, "observed": c.observed, "simulated": c.simulated,
                 "error": c.error} for c in self.calibration]
        return pa.Table.from_pylist(rows, schema=pa.schema([("scope", pa.string()), ("figure", pa.string()),
                                                            ("observed", pa.float64()), ("simulated", pa.float64()),
                                                            ("error", pa.float64())]))

    def headline(self) -> list[str]:
        f = self.row("fleet")
        lines = [f"what-if: {self.label}",
                 f"replay: {self.sessions_replayed} of {self.sessions_total} sessions ({self.calls_replayed} calls, "
                 f"seed {self.seed}) of the {self.window_text}"]
        if f is not None:
            b, a = f.before, f.after
            usd = "" if b.usd is None or a.usd is None else f", ${b.usd:,.2f} → ${a.usd:,.2f}{self.per}"
            lines.append(f"fleet: computed prefill {_tok(b.computed_tokens)} → {_tok(a.computed_tokens)} tokens"
                         f"{self.per}{usd}; turn-resume TTFT p50 {_s(b.ttft_p50_s)} → {_s(a.ttft_p50_s)}, p99 "
                         f"{_s(b.ttft_p99_s)} → {_s(a.ttft_p99_s)}")
        cal = [c for c in self.calibration if c.scope == "fleet" and c.error is not None]
        if cal:
            lines.append("calibration (unchanged replay vs observed, same sessions): " +
                         ", ".join(f"{c.figure} {c.error:+.1%}" for c in cal))
        lines += [f"note: {n}" for n in self.notes]
        return lines

    def to_dict(self) -> dict:
        def side(s: Side) -> dict:
            return {k: getattr(s, k) for k in Side.__dataclass_fields__}

        return {"changes": [c.text() for c in self.changes], "label": self.label, "since": self.since,
                "until": self.until, "window": self.window_text, "period": self.period, "scale": self.scale,
                "sessions_total": self.sessions_total, "sessions_replayed": self.sessions_replayed,
                "calls_replayed": self.calls_replayed, "seed": self.seed,
                "rows": [{"scope": r.scope, "before": side(r.before), "after": side(r.after)} for r in self.rows],
                "calibration": [{"scope": c.scope, "figure": c.figure, "observed": c.observed,
                                 "simulated": c.simulated, "error": c.error} for c in self.calibration],
                "notes": self.notes}


def _tok(n: float) -> str:
    from .context import fmt_tokens

    return fmt_tokens(n)


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g} s"


def _side(replay: Replay, pools: list[Pool], insts: list[str], fix: Fix | None, ctx: Context, scale: float) -> Side:
    comp = rep = 0.0
    usd: float | None = 0.0
    ttft: list[float] = []
    calls = 0
    for p in pools:
        res: SimResult = replay.result(p, fix)
        for i in p.instances:
            if i not in insts:
                continue
            c = res.computed(i) * p.factor * scale
            comp += c
            rep += res.reprefill[i] * p.factor * scale
            ttft += res.resume_ttft[i]
            calls += res.calls[i]
            cfg = ctx.instances.get(i) or {}
            if usd is not None and cfg.get("usd_per_s") and cfg.get("prefill_tps"):
                usd += c / cfg["prefill_tps"] * cfg["usd_per_s"]
            else:
                usd = None
    return Side(comp, usd, rep, quantile(ttft, 0.5), quantile(ttft, 0.99), calls)


def _observed(pools: list[Pool], insts: list[str]) -> dict:
    rows = [c for p in pools for c in p.observed if c["instance"] in insts]
    ttft = [float(c["ttft"]) for c in rows if c["follow_up"] and c["ttft"] is not None]
    known = [c for c in rows if c["c"] is not None]
    return {"computed_tokens": sum(float(c["p"]) - float(c["c"]) for c in known) if len(known) == len(rows) else None,
            "reprefill_tokens": float(sum(c["x"] or 0 for c in rows)),
            "ttft_p50_s": quantile(ttft, 0.5), "ttft_p99_s": quantile(ttft, 0.99)}


def _simulated_unscaled(replay: Replay, pools: list[Pool], insts: list[str]) -> dict:
    """The unchanged replay's figures over the replayed sessions themselves (what was observed of them)."""
    res = [(replay.result(p), i) for p in pools for i in p.instances if i in insts]
    ttft = [t for r, i in res for t in r.resume_ttft[i]]
    return {"computed_tokens": float(sum(r.computed(i) for r, i in res)),
            "reprefill_tokens": float(sum(r.reprefill[i] for r, i in res)),
            "ttft_p50_s": quantile(ttft, 0.5), "ttft_p99_s": quantile(ttft, 0.99)}


def report(replay: Replay, ctx: Context, changes: list[Change], label: str | None = None) -> WhatIf:
    """The before/after and calibration of ``changes`` on ``replay`` (built on ``ctx``'s window)."""
    t0 = time.perf_counter()
    fix, notes = resolve(changes, replay, ctx, label)
    pools = [p for p in replay.pools if p.skip is None]
    notes += [f"pool {' + '.join(p.instances)} not replayed: {p.skip}" for p in replay.pools if p.skip is not None]
    if not fix.overrides and fix.router is None:
        notes.append("the change leaves every replayed instance as configured: after = before")
    insts = [i for p in pools for i in p.instances]
    scale = ctx.tax_scale
    rows = [Row("fleet", _side(replay, pools, insts, None, ctx, scale), _side(replay, pools, insts, fix, ctx, scale))]
    rows += [Row(i, _side(replay, pools, [i], None, ctx, scale), _side(replay, pools, [i], fix, ctx, scale))
             for i in insts]
    cal: list[Calibration] = []
    for scope, ii in [("fleet", insts)] + [(i, [i]) for i in insts]:
        obs = _observed(pools, ii)
        sim = _simulated_unscaled(replay, pools, ii)
        cal += [Calibration(scope, k, obs[k], sim[k]) for k in ("computed_tokens", "reprefill_tokens", "ttft_p50_s",
                                                                "ttft_p99_s")]
    return WhatIf(tuple(changes), fix.label, ctx.since, ctx.until, ctx.window_text(),
                  "week" if ctx.scaled else "window", scale, replay.sessions_total, replay.sessions_replayed,
                  replay.calls_replayed, replay.seed, rows, cal, notes, time.perf_counter() - t0)


def run(db: Source, changes: Iterable[Change | str], since=None, until=None, filters: dict | None = None,
        settings: Settings | None = None, *, sessions: int | None = None, seed: int | None = None,
        clock: Callable[[], float] = time.time) -> WhatIf:
    """Replay the sessions of ``[since, until)`` (the findings' window rules: default 7 days before the newest call)
    as configured and with ``changes`` (``Change`` objects or ``key=value[@instance]`` strings). ``sessions``: most
    sessions replayed (default ``findings_sim_sessions``), ``seed``: which slice (default ``findings_sim_seed``) —
    the findings' replay unless given otherwise."""
    from ..metrics import prepare

    chs = [c if isinstance(c, Change) else Change.parse(c) for c in changes]
    if not chs:
        raise WhatIfError("no change given: pass --change KEY=VALUE (e.g. prefix_cache=on); keys: " + ", ".join(KEYS))
    settings = settings if settings is not None else load_settings()
    n = int(sessions if sessions is not None else settings.findings_sim_sessions)
    if n <= 0:
        raise WhatIfError(f"--sessions {n}: replay at least one session")
    s = int(seed if seed is not None else settings.findings_sim_seed)
    mrun, close = prepare(db, since, until, filters=filters, settings=settings, clock=clock)
    try:
        given = mrun.since is not None
        start = mrun.since if given else default_since(mrun, mrun.until, float(settings.findings_default_window_s))
        ctx = Context(mrun.cur, settings, start, mrun.until, clock, since_given=given, run=mrun)
        try:
            replay = build(ctx, n, s)
        except ReplayError as e:
            raise WhatIfError(f"cannot replay this window: {e}") from None
        return report(replay, ctx, chs)
    finally:
        try:
            mrun.reset_window()
        finally:
            close()


__all__ = ["KEYS", "Calibration", "Change", "Row", "Side", "WhatIf", "WhatIfError", "fmt_duration", "report",
           "resolve", "run"]
