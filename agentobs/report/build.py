"""Build the weekly report's content from the metrics API: sections of figures and tables, each with its basis.

One ``agentobs.metrics`` preparation (``prepare``) serves every section. The attribution tables are the
metrics' own outputs (``reprefill``, ``task_cost``, ``idle_kv_rent``, …); the few figures no metric groups
that way — the fleet totals, spend by tenant/agent, and the week before for the deltas — are sums over the
same per-call table ``m_calls`` the metrics read (the same cost columns, the same formulas), so they add up
to the metric tables. The week before comes from the same preparation (``m_calls`` holds every call; only
the window differs), which is what a separate run of the week before would compute.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlencode

import polars as pl
import pyarrow as pa

from ..config import Settings, load_settings
from ..metrics import prepare
from ..metrics.usual import usual_cte
from ..source import Source, require
from .period import Period
from .query_files import load

TOP_N = 20
FINDINGS_LEFT_OUT = "findings were left out of this report (findings=None); no findings were evaluated."
# dimensions of "spend and compute by …": report name -> m_calls column (names come only from here)
SPEND_DIMENSIONS = {"task_type": "task_type", "agent": "agent_name", "tenant": "tenant", "model": "model",
                    "instance": "instance"}


@dataclass
class Figure:
    key: str
    label: str
    value: float | None
    unit: str  # usd | ratio | tokens | count | seconds | gpu_seconds | ratio_x
    basis: str
    previous: float | None = None

    @property
    def delta(self) -> float | None:
        if self.value is None or self.previous is None:
            return None
        return self.value - self.previous

    @property
    def delta_rel(self) -> float | None:
        if self.delta is None or not self.previous:
            return None
        return self.delta / abs(self.previous)


@dataclass
class Chart:
    kind: str  # bars | histogram
    title: str
    label_col: str = ""
    value_col: str = ""
    unit: str = "usd"
    edges: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)


@dataclass
class Table:
    name: str  # file stem under tables/
    title: str
    basis: str
    data: pa.Table
    show: list[str] | None = None  # columns shown in HTML/Markdown (all are in CSV/Parquet)
    chart: Chart | None = None
    links: dict[str, str] = field(default_factory=dict)  # shown column -> column holding its URL
    show_rows: int = TOP_N


@dataclass
class Section:
    key: str
    title: str
    basis: str
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)


@dataclass
class Report:
    period: Period
    previous: Period
    generated_at: float
    db: str
    calls: int
    sections: list[Section]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def has_data(self) -> bool:
        return self.calls > 0

    def tables(self) -> list[Table]:
        return [t for s in self.sections for t in s.tables]

    def figure(self, key: str) -> Figure:
        for s in self.sections:
            for f in s.figures:
                if f.key == key:
                    return f
        raise KeyError(key)


# -- the report's own SQL (agentobs/report/queries/*.sql, each with a checked header: agentobs.report.query_files)
TOTALS_SQL = load("totals").render()
SPEND_SQL = load("spend").render(
    cols=", ".join(SPEND_DIMENSIONS.values()),
    sets=", ".join(f"({c})" for c in SPEND_DIMENSIONS.values()),
    dim="CASE " + " ".join(f"WHEN GROUPING({c}) = 0 THEN '{n}'" for n, c in SPEND_DIMENSIONS.items()) + " END",
    value="CASE " + " ".join(f"WHEN GROUPING({c}) = 0 THEN CAST({c} AS VARCHAR)" for c in SPEND_DIMENSIONS.values())
          + " END")
TASK_TYPES_SQL = load("task_types").render()


def about_sql(key: str) -> str:
    """What the sessions or tasks (``key``: session_id or task_id) of a top list are (queries/about.sql)."""
    usual = ",\n".join(usual_cte(f"u_{c}", "id", c, "g") for c in ("task_type", "tenant", "agent_name", "model"))
    return load("about").render(key=key, usual=usual)


def _fmt_ts(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def console_link(base: str, page: str, period: Period, **params: str) -> str:
    """A link into the console (docs/console.md): ``{base}/{page}?since=…&until=…&session=…``."""
    qp = {"since": _fmt_ts(period.since), "until": _fmt_ts(period.until), **params}
    return f"{base.rstrip('/')}/{page}?{urlencode(qp)}"


def _row(df: pl.DataFrame) -> dict:
    return df.row(0, named=True) if df.height else {}


def _num(v) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


class _Builder:
    def __init__(self, run, period: Period, settings: Settings, db_label: str, findings_fn, db):
        self.run, self.period, self.settings, self.db_label = run, period, settings, db_label
        self.findings_fn, self.db = findings_fn, db
        self.timings: dict[str, float] = {}
        self.cache: dict[tuple[str, str | None], pl.DataFrame] = {}
        self.base_url = str(settings.console_url)
        self.failures: list[str] = []

    def sql(self, q: str, params: dict | None = None) -> pl.DataFrame:
        return self.run.cur.sql(q, params=params or {}).pl()

    def metric(self, name: str, by: str | None = None) -> pl.DataFrame:
        """The metrics API's table (computed once per name and grouping)."""
        key = (name, by)
        if key not in self.cache:
            t0 = time.perf_counter()
            self.cache[key] = self.run.compute(name, by)
            self.timings[f"metric {name}" + (f" by {by}" if by else "")] = time.perf_counter() - t0
        return self.cache[key]

    # -- sections --------------------------------------------------------------------------------------
    def totals(self, p: Period) -> dict:
        t0 = time.perf_counter()
        r = _row(self.sql(TOTALS_SQL, {"lo": p.since, "hi": p.until}))
        self.timings[f"totals {p.label}"] = time.perf_counter() - t0
        return r

    def cost_basis(self) -> tuple[str, pa.Table]:
        df = self.metric("cost_model")
        bases = sorted({b for b in df["basis"].to_list() if b})
        short = bases[0] if len(bases) == 1 else f"{len(bases)} per-instance bases (table cost_basis)"
        return f"GPU-time cost model (METRICS.md §8): {short}", df.to_arrow()

    def headline(self, cur: dict, prev: dict, cost_basis: str) -> Section:
        p, q = self.period, self.period.previous()
        wk = f"calls starting in {p.describe()}; previous: {q.label}"
        rent_basis = "KV slot opportunity cost = instance $/s ÷ KV capacity (METRICS.md §4)"
        spec = [
            ("cost_usd", "Spend (GPU time)", "usd", cost_basis),
            ("gpu_s", "GPU time", "gpu_seconds", "Σ (P − C)/prefill_tps + O/decode_tps instance-seconds (§8)"),
            ("calls", "Model calls", "count", "llm_calls"),
            ("sessions", "Sessions", "count", "distinct session_id"),
            ("tasks", "Tasks", "count", "distinct task_id"),
            ("retries", "Retries", "count", "attempt > 1, or the same prompt re-sent after an error (§7)"),
            ("prompt_tokens", "Prompt tokens ΣP", "tokens", "gateway/engine usage"),
            ("computed_prompt_tokens", "Computed prompt tokens Σ(P − C)", "tokens", "prompt tokens not served from cache"),
            ("output_tokens", "Output tokens ΣO", "tokens", "gateway/engine usage"),
            ("hit_rate", "Session hit rate H = ΣC/ΣP", "ratio", "session calls whose C is known (§2)"),
            ("reuse_hit_rate", "Reuse hit rate U = ΣC/ΣR_eff", "ratio",
             "calls 2…n of sessions; R_eff exact from block hashes or append-only estimate (§1–2)"),
            ("reprefill_tokens", "Re-prefill tokens ΣX", "tokens", "X = max(0, R_eff − C) (§1)"),
            ("reprefill_share_of_cache_tokens", "Re-prefill share ΣX/(ΣX + ΣC)", "ratio", "§3 token share"),
            ("reprefill_share_of_computed_prefill", "Re-prefill share of computed prefill ΣX/Σ(P − C)", "ratio", "§3"),
            ("reprefill_cost_usd", "Recompute tax (re-prefill $)", "usd", "X ÷ prefill_tps × $/s (§8); " + cost_basis),
            ("reprefill_cost_share", "Recompute tax share of spend", "ratio", "cost(X) ÷ total cost (§3)"),
            ("rent_paid_usd", "Idle KV rent paid", "usd", "retained idle windows K·g token-s × $/token-s; " + rent_basis),
            ("rent_wasted_usd", "Idle KV rent wasted", "usd",
             "evicted windows with KV events K·(t_evict − t2); " + rent_basis),
        ]
        had = bool(prev.get("calls"))  # no calls the week before: no deltas (not "+100 %")
        figs = [Figure(k, label, _num(cur.get(k)), unit, basis, _num(prev.get(k)) if had else None)
                for k, label, unit, basis in spec]
        return Section("headline", "This week at a glance", f"{wk}. Deltas are against the week before.", figs)

    def spend(self) -> Section:
        sec = Section("spend", "Spend and compute by task type, agent, tenant, model and instance",
                      "GPU-time cost per call = ((P − C)/prefill_tps + O/decode_tps) × instance $/s (METRICS.md §8); "
                      "list-price $ only when [cost.list_price] is set")
        show = ["calls", "sessions", "tasks", "computed_prompt_tokens", "output_tokens", "gpu_s", "cost_usd",
                "share_of_spend", "reprefill_cost_usd"]
        t0 = time.perf_counter()
        every = self.sql(SPEND_SQL)
        self.timings["spend by " + ", ".join(SPEND_DIMENSIONS)] = time.perf_counter() - t0
        for name in SPEND_DIMENSIONS:
            # most spend first (no cost last), then by name
            df = (every.filter(pl.col("dimension") == name).drop("dimension").rename({"value": name})
                  .sort(["cost_usd", name], descending=[True, False], nulls_last=True))
            sec.tables.append(Table(f"spend_by_{name}", f"By {name.replace('_', ' ')}", sec.basis, df.to_arrow(),
                                    show=[name, *show],
                                    chart=Chart("bars", f"Spend by {name.replace('_', ' ')}", name, "cost_usd", "usd")))
        return sec

    def tasks(self) -> Section:
        sec = Section("tasks", "Per-task cost, retries and amplification",
                      "task_cost metric (METRICS.md §7–8): amplification = computed tokens of all calls ÷ computed "
                      "tokens of the final successful path; retries = attempt > 1 or a re-sent prompt after an error")
        per_task = self.metric("task_cost", "task")
        by_type = self.metric("task_cost", "task_type")
        cost = per_task["cost_usd"].drop_nulls()
        if cost.len():
            def q(x):
                return _num(cost.quantile(x, "linear"))
            sec.figures += [
                Figure("task_cost_p50", "Cost per task, p50", q(0.5), "usd", "task_cost by task"),
                Figure("task_cost_p90", "Cost per task, p90", q(0.9), "usd", "task_cost by task"),
                Figure("task_cost_p99", "Cost per task, p99", q(0.99), "usd", "task_cost by task"),
                Figure("task_cost_max", "Cost per task, max", _num(cost.max()), "usd", "task_cost by task"),
            ]
            sec.charts.append(_histogram(cost.to_list(), "Cost per task (USD), tasks per bin"))
        retried = per_task.filter(pl.col("retries") > 0)
        total = _num(per_task["cost_usd"].sum()) or 0.0
        sec.figures += [
            Figure("tasks_with_retries", "Tasks with retries", float(retried.height), "count", "task_cost: retries > 0"),
            Figure("retried_tasks_spend_share", "Spend share of tasks with retries",
                   (_num(retried["cost_usd"].sum()) or 0.0) / total if total else None, "ratio", "task_cost"),
            Figure("amplification_p50", "Amplification, p50 over tasks",
                   _num(per_task["amplification"].quantile(0.5, "linear")), "ratio_x", "task_cost by task"),
            Figure("amplification_p90", "Amplification, p90 over tasks",
                   _num(per_task["amplification"].quantile(0.9, "linear")), "ratio_x", "task_cost by task"),
        ]
        dist = self.sql(TASK_TYPES_SQL)  # a task's type: the type of most of its calls (queries/task_types.sql)
        by_type = by_type.join(dist, on="task_type", how="left")
        sec.tables.append(Table("task_cost_by_task_type", "By task type", sec.basis, by_type.to_arrow(),
                                show=["task_type", "tasks", "calls", "retries", "failed_calls", "amplification",
                                      "wasted_tokens", "cost_usd", "cost_p50_usd", "cost_p90_usd", "cost_max_usd",
                                      "reprefill_cost_share"],
                                chart=Chart("bars", "Cost by task type (USD)", "task_type", "cost_usd")))
        sec.tables.append(Table("task_cost_by_task", "Every task", sec.basis, per_task.to_arrow(), show=[], show_rows=0))
        return sec

    def reprefill(self) -> Section:
        sec = Section("reprefill", "Re-prefill tax by cause and instance",
                      "reprefill metric (METRICS.md §1, §3): X = max(0, R_eff − C); cost = X ÷ prefill_tps × $/s")
        show = ["calls", "calls_with_reprefill", "reprefill_tokens", "share_of_cache_tokens", "share_of_computed_prefill",
                "reprefill_cost_usd", "fleet_cost_share", "mode"]
        for by in ("cause", "instance", "task_type"):
            df = self.metric("reprefill", by)
            col = {"cause": "cause", "instance": "instance", "task_type": "task_type"}[by]
            sec.tables.append(Table(f"reprefill_by_{by}", f"By {by.replace('_', ' ')}", sec.basis, df.to_arrow(),
                                    show=[col, *show],
                                    chart=Chart("bars", f"Recompute tax by {by.replace('_', ' ')} (USD)", col,
                                                "reprefill_cost_usd", "usd")))
        return sec

    def rent(self) -> Section:
        sec = Section("rent", "Idle KV rent",
                      "idle_kv_rent metric (METRICS.md §4): rent = K·g token-seconds × instance $/s ÷ KV capacity "
                      "(the opportunity cost of a KV slot); g* = KV capacity ÷ prefill throughput")
        df = self.metric("idle_kv_rent", "instance")
        show = ["instance", "windows", "retained", "evicted", "routed_away", "rent_paid_usd", "rent_wasted_usd",
                "abandoned", "abandoned_kv_bytes", "gap_p50_s", "g_star_s", "share_over_g_star", "idle_kv_share",
                "rent_mode"]
        sec.tables.append(Table("idle_kv_rent_by_instance", "By instance", sec.basis, df.to_arrow(), show=show,
                                chart=Chart("bars", "Idle KV rent paid by instance (USD)", "instance", "rent_paid_usd")))
        if "note" in df.columns:
            sec.notes += [f"{i}: {n}" for i, n in zip(df["instance"].to_list(), df["note"].to_list(), strict=True) if n]
        if "rent_basis" in df.columns:
            sec.notes += sorted({f"Basis: {b}" for b in df["rent_basis"].to_list() if b})
        by_type = self.metric("idle_kv_rent", "task_type")
        sec.tables.append(Table("idle_kv_rent_by_task_type", "By task type", sec.basis, by_type.to_arrow(),
                                show=["task_type", *show[1:-1]],
                                chart=Chart("bars", "Idle KV rent paid by task type (USD)", "task_type",
                                            "rent_paid_usd")))
        return sec

    def latency(self) -> Section:
        sec = Section("latency", "Turn-resume TTFT and ITL tails",
                      "turn_resume_ttft (METRICS.md §5): TTFT of calls 2…n by idle-gap bucket and hit class; "
                      "miss penalty = miss p50 ÷ hit p50. itl_tail (§6): tail gaps attributed to co-scheduled prefills")
        df = self.metric("turn_resume_ttft", "instance")
        sec.tables.append(Table("turn_resume_ttft_by_instance", "Turn-resume TTFT by instance", sec.basis,
                                df.to_arrow(), show=["instance", "gap_bucket", "hit_class", "calls", "ttft_p50_s",
                                                     "ttft_p90_s", "ttft_p99_s", "miss_penalty"], show_rows=40))
        overall = df.filter(pl.col("gap_bucket") == "all") if "gap_bucket" in df.columns else df.head(0)
        if overall.height:
            sec.tables.append(Table("turn_resume_ttft_overall", "Turn-resume TTFT p99 by instance", sec.basis,
                                    overall.to_arrow(), show=["instance", "calls", "ttft_p50_s", "ttft_p90_s",
                                                              "ttft_p99_s"],
                                    chart=Chart("bars", "Turn-resume TTFT p99 by instance (s)", "instance",
                                                "ttft_p99_s", "seconds")))
        pen = df["miss_penalty"].drop_nulls().drop_nans() if df.height else df["miss_penalty"]
        if pen.len():
            sec.figures.append(Figure("miss_penalty_max", "Largest miss penalty (miss p50 ÷ hit p50 TTFT)",
                                      _num(pen.max()), "ratio_x", "turn_resume_ttft, same instance and gap bucket"))
        itl = self.metric("itl_tail")
        sec.tables.append(Table("itl_tail", "ITL tail attribution", sec.basis, itl.to_arrow(),
                                chart=Chart("bars", "Share of tail gaps next to a long prefill", "instance",
                                            "tail_long_prefill_share", "ratio") if "instance" in itl.columns else None))
        fleet = self.metric("fleet_hit_rate")
        if fleet.height:
            sec.tables.append(Table("fleet_hit_rate", "Engine-counter hit rate vs spans (cross-check)",
                                    "fleet_hit_rate (§2): engine counter deltas over the window, next to span ΣC/ΣP",
                                    fleet.to_arrow(), show=["instance", "engine", "hit_rate", "span_hit_rate", "basis",
                                                            "scrapes", "restarts"],
                                    chart=Chart("bars", "Engine-counter prefix-cache hit rate", "instance", "hit_rate",
                                                "ratio")))
        return sec

    def top(self) -> Section:
        sec = Section("top", f"Top {TOP_N} costliest sessions and tasks",
                      "reprefill metric by session and task_cost by task (GPU-time $, METRICS.md §8); links open "
                      "the console on the same week")
        for key, metric, by, col in (("session", "reprefill", "session", "session_id"),
                                     ("task", "task_cost", "task", "task_id")):
            df = self.metric(metric, by)
            df = df.filter(pl.col(col).is_not_null()).sort("cost_usd", descending=True, nulls_last=True).head(TOP_N)
            about = self.sql(about_sql(col), {"ids": df[col].to_list()})
            df = df.join(about.rename({"id": col}), on=col, how="left")
            sess = df[col] if key == "session" else df["first_session_id"]
            links = [console_link(self.base_url, "session", self.period, session=s) if s else None
                     for s in sess.to_list()]
            if key == "task":
                links = [console_link(self.base_url, "session", self.period, session=s, task=t) if s else None
                         for s, t in zip(sess.to_list(), df[col].to_list(), strict=True)]
            df = df.with_columns(pl.Series("console_url", links, dtype=pl.String))
            show = [col, "task_type", "tenant", "calls", "cost_usd", "reprefill_cost_usd"]
            show += ["retries", "amplification"] if key == "task" else ["reprefill_tokens", "hit_rate"]
            sec.tables.append(Table(f"top_{key}s", f"Top {TOP_N} {key}s by spend", sec.basis, df.to_arrow(),
                                    show=show, links={col: "console_url"},
                                    chart=Chart("bars", f"Top {key}s by spend (USD)", col, "cost_usd")))
        return sec

    def ledger(self, period: Period, simulate: bool = True):
        """The tax ledger of ``period`` (agentobs.findings.build: the same result `agentobs findings --since
        START --until END` prints); None when findings are left out or failed (the failure is kept for the notes).
        The week before is read from the report's own run moved to that week (its working set holds it), not
        from a second preparation."""
        if self.findings_fn is None:
            return None
        t0 = time.perf_counter()
        own = (self.run.since, self.run.until)
        moved = (period.since, period.until) != own
        try:
            if moved:
                self.run.set_window(period.since, period.until)
                return self.findings_fn(self.db, since=period.since, until=period.until, settings=self.settings,
                                        simulate=simulate, run=self.run)
            return self.findings_fn(self.db, since=period.since, until=period.until, settings=self.settings,
                                    simulate=simulate)
        except Exception as e:  # noqa: BLE001 - another module's failure must not lose the report
            self.failures.append(f"findings for {period.label} failed: {type(e).__name__}: {e}")
            return None
        finally:
            if moved:
                self.run.set_window(*own)
            self.timings[f"ledger {period.label}"] = time.perf_counter() - t0

    def answer(self, ledger, before) -> Section:
        """The first screen: the week's recompute tax (with its scaling), the change against the week before,
        and the top fixes with their $ and the sessions they affect."""
        if ledger is None:
            sec = Section("answer", "The recompute tax this week", "")
            sec.notes += self.failures or [FINDINGS_LEFT_OUT]
            return sec
        from ..findings.context import fmt_usd  # the ledger's $ as the CLI prints them
        from ..findings.render import short_fix

        prev_usd = before.usd_week if before is not None and before.calls else None
        owned_tok, owned_usd = ledger.owned("reprefill")
        sec = Section(
            "answer", f"The recompute tax this week: {fmt_usd(ledger.usd_week)}{ledger.per}",
            f"agentobs.findings ledger over {self.period.describe()} ({ledger.window_text}); the same ids and $ as "
            f"`agentobs findings --since {_fmt_ts(self.period.since)}Z --until {_fmt_ts(self.period.until)}Z`. Every "
            "re-prefill token is owned by at most one finding (docs/findings.md).")
        sec.figures += [
            Figure("recompute_tax_usd_week", "Recompute tax " + _per_text(ledger.per), ledger.usd_week, "usd",
                   f"Σ re-prefill GPU-time cost, observed {fmt_usd(ledger.usd_window)} × {ledger.scale:,.2f}; "
                   "previous: the week before on the same scaling rule", prev_usd),
            Figure("recompute_tax_usd_window", "Observed in the window", ledger.usd_window, "usd",
                   ledger.window_text),
            Figure("recompute_tax_low_usd_week", "Lower end " + _per_text(ledger.per),
                   ledger.usd_low_window * ledger.scale, "usd",
                   f"re-prefill with evidence of its cause ({ledger.mode} mode; band {ledger.band_text() or 'none'})"),
            Figure("recompute_tax_high_usd_week", "Upper end " + _per_text(ledger.per),
                   ledger.usd_high_window * ledger.scale, "usd", "every shortfall R_eff − C, explained or not"),
            Figure("owned_by_findings_usd_week", "Owned by findings " + _per_text(ledger.per), owned_usd, "usd",
                   "Σ of the findings' tax; each call's re-prefill counted once"),
            Figure("unattributed_usd_week", "Not attributed " + _per_text(ledger.per), ledger.unattributed_usd_week,
                   "usd",
                   "re-prefill below the findings' floors or of a cause no rule covers"),
            Figure("sessions_with_reprefill", "Sessions that paid it", float(ledger.sessions_with_reprefill),
                   "count", f"of {ledger.sessions:,} sessions in the window"),
        ]
        fixes = ledger.top_fixes(5)
        sec.tables.append(Table(
            "top_fixes", "Top fixes", "the ledger's findings with a $ figure, most $ first", pa.table({
                "id": [f.id for f in fixes], "fix": [short_fix(f) for f in fixes],
                "usd_week": [f.tax.usd_week for f in fixes],
                "recoverable_usd_week": [f.recoverable.usd_week for f in fixes],
                "sessions": [f.sessions for f in fixes], "severity": [f.severity for f in fixes],
                "console_url": [console_link(self.base_url, "sessions", self.period, finding=f.id) for f in fixes],
            }, schema=pa.schema([("id", pa.string()), ("fix", pa.string()), ("usd_week", pa.float64()),
                                 ("recoverable_usd_week", pa.float64()), ("sessions", pa.int64()),
                                 ("severity", pa.string()), ("console_url", pa.string())])),
            show=["fix", "usd_week", "recoverable_usd_week", "sessions", "id"], links={"sessions": "console_url"},
            chart=Chart("bars", "Top fixes: recompute tax they own (USD/week)", "id", "usd_week")))
        causes = pa.table({
            "cause": [c.cause for c in ledger.by_cause], "calls": [c.calls for c in ledger.by_cause],
            "sessions": [c.sessions for c in ledger.by_cause],
            "reprefill_tokens": [c.tokens_window for c in ledger.by_cause],
            "usd_window": [c.usd_window for c in ledger.by_cause], "usd_week": [c.usd_week for c in ledger.by_cause],
            "usd_low_week": [c.usd_low_window * ledger.scale for c in ledger.by_cause],
            "usd_high_week": [c.usd_high_window * ledger.scale for c in ledger.by_cause]},
            schema=pa.schema([("cause", pa.string()), ("calls", pa.int64()), ("sessions", pa.int64()),
                              ("reprefill_tokens", pa.float64()), ("usd_window", pa.float64()),
                              ("usd_week", pa.float64()), ("usd_low_week", pa.float64()),
                              ("usd_high_week", pa.float64())]))
        sec.tables.append(Table("tax_by_cause", "Recompute tax by miss cause", "METRICS.md §1 miss causes", causes,
                                chart=Chart("bars", "Recompute tax by miss cause (USD/week)", "cause", "usd_week")))
        if not fixes:
            sec.notes.append("No finding has a $ figure this week: no default config is making sessions pay a "
                             "recompute tax above the floors.")
        return sec

    def findings(self, ledger) -> Section:
        sec = Section("findings", "Findings: evidence and the exact fix",
                      "the ledger's findings in its order ($/week at stake, then severity); the whole ledger in "
                      "tables/findings.csv")
        if ledger is None:
            sec.notes += self.failures or [FINDINGS_LEFT_OUT]
            return sec
        rows = [_finding_row(f) for f in ledger.findings]
        tbl = pa.Table.from_pylist(rows, schema=FINDINGS_SCHEMA)
        if not rows:
            sec.notes.append("No rule fired for this week.")
        sec.tables.append(Table("findings", "Findings", sec.basis, tbl,
                                show=["severity", "title", "usd_week", "recoverable_usd_week", "sessions", "fix",
                                      "evidence"],
                                show_rows=50))
        return sec


def _text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, dict):
        return "; ".join(f"{k}={_short(v2)}" for k, v2 in v.items())
    if isinstance(v, (list, tuple)):
        return "; ".join(f"{x[0]}={_short(x[1])}" if isinstance(x, tuple) and len(x) == 2 else str(x) for x in v)
    return str(v)


def _short(v) -> str:
    return f"{v:,.4g}" if isinstance(v, float) else str(v)


def _finding_row(f) -> dict:
    """One ledger finding as a table row (docs/findings.md): the same id and $ as `agentobs findings`."""
    from ..findings.render import short_fix

    tax, rec, also = f.tax, f.recoverable, f.also_recovers
    return {"id": f.id, "rule": f.rule, "severity": f.severity, "kind": f.kind, "confidence": f.confidence,
            "scope": f.scope.key(), "title": f.title, "usd_week": _num(tax.usd_week),
            "tokens_week": _num(tax.tokens_week), "usd_window": _num(tax.usd_window), "window_s": _num(tax.window_s),
            "recoverable_usd_week": _num(rec.usd_week),
            "also_recovers_usd_week": _num(also.usd_week) if also is not None else None,
            "sessions": f.sessions, "tax_basis": f"{tax.method}: {tax.basis}", "summary": f.summary,
            "evidence": _text(f.evidence.numbers), "fix": short_fix(f), "remediation": f.remediation}


FINDINGS_SCHEMA = pa.schema([
    ("id", pa.string()), ("rule", pa.string()), ("severity", pa.string()), ("kind", pa.string()),
    ("confidence", pa.string()), ("scope", pa.string()), ("title", pa.string()), ("usd_week", pa.float64()),
    ("tokens_week", pa.float64()), ("usd_window", pa.float64()), ("window_s", pa.float64()),
    ("recoverable_usd_week", pa.float64()), ("also_recovers_usd_week", pa.float64()), ("sessions", pa.int64()),
    ("tax_basis", pa.string()), ("summary", pa.string()), ("evidence", pa.string()), ("fix", pa.string()),
    ("remediation", pa.string())])


def _per_text(per: str) -> str:
    return "per week" if per == "/week" else per.strip()


def _histogram(values: list[float], title: str, bins: int = 20) -> Chart:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 0.0)
    if hi <= lo:
        hi = lo + 1.0
    pos = [v for v in vals if v > 0]
    if pos and lo > 0 and hi / lo > 50:  # skewed: log-spaced bins
        a, b = math.log10(lo), math.log10(hi)
        edges = [10 ** (a + (b - a) * i / bins) for i in range(bins + 1)]
    else:
        edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
    counts = [0] * bins
    for v in vals:
        i = next((j for j in range(bins) if v < edges[j + 1]), bins - 1)
        counts[i] += 1
    return Chart("histogram", title, unit="usd", edges=edges, counts=counts)


def build(db: Source, period: Period, settings: Settings | None = None, clock: Callable[[], float] = time.time,
          findings: Callable | None | bool = True) -> Report:
    """The report of ``period`` from the Source ``db`` (agentobs.source).
    ``findings``: True = the tax ledger of agentobs.findings (``build``); None/False = leave out (a note says so); a
    callable = use it (it takes ``db, since=, until=, settings=, simulate=`` and returns a Ledger)."""
    settings = settings if settings is not None else load_settings()
    fn: Callable | None
    if findings is True:
        from ..findings import build as fn
    else:
        fn = findings or None
    src = require(db, "agentobs.report.build")
    t0 = time.perf_counter()
    prev = period.previous()
    run, close = prepare(src, since=period.since, until=period.until, settings=settings, clock=clock)
    timings = {"prepare": time.perf_counter() - t0, **{f"prepare {k}": v for k, v in run.timings.items()}}
    try:
        b = _Builder(run, period, settings, src.label(), fn, src)
        cur, before = b.totals(period), b.totals(prev)
        calls = int(cur.get("calls") or 0)
        basis, cost_tbl = b.cost_basis()
        ledger = b.ledger(period) if calls else None
        ledger_before = b.ledger(prev, simulate=False) if ledger is not None else None
        sections = [b.answer(ledger, ledger_before) if calls else Section("answer", "The recompute tax this week", "",
                                                                          notes=["No model calls this week."]),
                    b.findings(ledger) if calls else Section("findings", "Findings", "", notes=[
                        "No model calls this week, so no findings were evaluated."]),
                    b.headline(cur, before, basis)]
        if calls:
            sections += [b.spend(), b.tasks(), b.reprefill(), b.rent(), b.latency(), b.top()]
            sections.append(Section("cost_basis", "Cost basis per instance",
                                    "the [cost] settings, engine config and engine spans (METRICS.md §8)",
                                    tables=[Table("cost_basis", "Cost basis", "cost_model metric", cost_tbl,
                                                  show_rows=50)]))
        timings.update(b.timings)
    finally:
        close()
    return Report(period, prev, clock(), src.label(), calls, sections, timings)
