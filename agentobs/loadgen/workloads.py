"""What the load generator replays: agent sessions as the simulator describes them (agentobs.sim.workload
``Session`` → segments → threads → ``CallSpec``: a block-id chain, prompt and output tokens, the idle gap before
the call, retries), from four sources:

- ``claude-code``: kv-cache-tester traces (bundled in agentobs/sim/datasets, or ``--trace FILE...``), sub-agents
  as parallel branches;
- ``mooncake``: the Mooncake conversation trace (bundled or ``--trace FILE``), open-loop arrivals;
- ``synthetic``: the simulator's task mixes (``--mix coding=3,support=1``);
- ``store``: sessions observed in an agentobs store (``--from-store``): their prompt sizes, growth, gaps,
  retries and sub-agent branches, replayed.

Every source yields chains of 64-token blocks (``BLOCK``), so one prompt synthesiser serves them all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, InputError
from ..sim.chain import Chain
from ..sim.workload import TASK_TYPES, CallSpec, IdAlloc, Segment, Session, claude_code, mooncake, synthetic

BLOCK = 64  # tokens per block id in every workload the load generator builds
WORKLOADS = ("claude-code", "mooncake", "synthetic", "store")


@dataclass
class Plan:
    """The sessions to run, in launch order, and what they came from."""

    sessions: list[Session]
    source: str
    note: str = ""


def parse_mix(text: str | None) -> dict[str, float]:
    if not text:
        return {"coding": 3.0, "support": 4.0, "research": 1.0}
    out: dict[str, float] = {}
    for part in text.split(","):
        name, _, w = part.strip().partition("=")
        name = name.strip()
        if name not in TASK_TYPES:
            raise ConfigError(f"--mix: unknown task type {name!r}; known: {', '.join(TASK_TYPES)}")
        try:
            out[name] = float(w) if w else 1.0
        except ValueError:
            raise ConfigError(f"--mix: weight of {name!r} is {w!r}, not a number") from None
        if out[name] <= 0:
            raise ConfigError(f"--mix: weight of {name!r} must be > 0")
    return out


def _repeat(load, n: int | None, limit_each: int | None = None) -> list[Session]:
    """``n`` sessions from a loader of a finite set: the set again (fresh block ids, new names) until ``n``."""
    ids = IdAlloc()
    out: list[Session] = []
    rnd = 0
    while True:
        batch = load(ids)
        if not batch:
            return out
        for s in batch:
            if rnd:
                s.sid, s.task_id = f"{s.sid}-r{rnd}", f"{s.task_id}-r{rnd}"
            out.append(s)
            if n is not None and len(out) >= n:
                return out
        if n is None:
            return out
        rnd += 1


def load_plan(workload: str, *, sessions: int | None, seed: int, traces: tuple[str, ...] = (),
              mix: str | None = None, store_db: str | None = None, since: str | None = None,
              sample: int | None = None, settings=None) -> Plan:
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    if traces and workload not in ("claude-code", "mooncake"):
        raise ConfigError("--trace FILE gives claude-code (kv-cache-tester) or mooncake traces; "
                          f"it does not apply to --workload {workload}")
    if workload == "claude-code":
        paths = [Path(p) for p in traces] or None
        plan = _repeat(lambda ids: claude_code(paths, BLOCK, ids), sessions)
        return Plan(plan, "kv-cache-tester traces " + (", ".join(traces) if traces else "(bundled)"))
    if workload == "mooncake":
        if len(traces) > 1:
            raise ConfigError("--workload mooncake replays one trace file")
        path = Path(traces[0]) if traces else None
        # the first requests of the trace: enough of them to make the sessions asked for
        limit = max(200, 20 * (sessions or 10))
        got = mooncake(path, BLOCK, IdAlloc(), limit=limit)
        got = [s for s in got if s.n_calls > 0]
        return Plan(got[:sessions] if sessions else got, "Mooncake conversation trace " + (traces[0] if traces
                                                                                          else "(bundled)"))
    if workload == "synthetic":
        m = parse_mix(mix)
        n = sessions or 10
        got = synthetic(m, 0.0, 0.0, seed, BLOCK, IdAlloc(), n_sessions=n, bursts=False)
        return Plan(got[:n], "synthetic task mix " + ",".join(f"{k}={v:g}" for k, v in m.items()))
    return from_store(store_db, since, sample if sample is not None else sessions, seed, settings)


# -- sessions observed in a store ---------------------------------------------------------------------------------
def from_store(db: str | None, since: str | None, sample: int | None, seed: int, settings=None) -> Plan:
    """The store's sessions that start in the window (``--since``), ``sample`` of them at random (seeded): per
    branch their calls in order with the observed prompt and output sizes and idle gaps; a turn that was retried
    (attempts > 1) is replayed with a failing first attempt; a prompt that grows extends the branch's chain, one
    that shrinks starts a new one (a context reset); a sub-agent branch forks from the main chain where it
    started."""
    from ..metrics.run import parse_time
    from ..model import connect

    if not db or not Path(db).exists():
        raise ConfigError(f"--from-store reads the store {db!r}, which does not exist (give --db PATH)")
    lo = parse_time(since, name="--since") if since else None
    con = connect(db, read_only=True)
    try:
        rows = con.sql("""
            SELECT session_id, coalesce(task_id, session_id) AS task_id, coalesce(task_type, 'observed') AS task_type,
                   coalesce(tenant, '') AS tenant, coalesce(agent_name, 'agent') AS agent_name,
                   coalesce(branch, 'main') AS branch, coalesce(attempt, 1) AS attempt, start_s, end_s,
                   prompt_tokens, coalesce(output_tokens, 1) AS output_tokens, status
            FROM llm_calls
            WHERE session_id IS NOT NULL AND prompt_tokens IS NOT NULL
              AND session_id IN (SELECT session_id FROM llm_calls WHERE session_id IS NOT NULL
                                 GROUP BY session_id HAVING $lo IS NULL OR min(start_s) >= $lo)
            ORDER BY session_id, start_s, call_id
        """, params={"lo": lo}).fetchall()
    finally:
        con.close()
    by: dict[str, list[tuple]] = {}
    for r in rows:
        by.setdefault(r[0], []).append(r)
    if not by:
        raise ConfigError(f"the store {db} has no sessions with prompt sizes" + (f" since {since}" if since else ""))
    names = sorted(by)
    rng = random.Random(seed)
    if sample is not None and sample < len(names):
        names = sorted(rng.sample(names, sample))
    ids = IdAlloc()
    out = []
    t_first = min(by[n][0][7] for n in names)
    for sid in names:
        out.append(_observed_session(sid, by[sid], ids, t_first))
    out.sort(key=lambda s: s.start_s)
    return Plan(out, f"{len(out)} observed session(s) from {db}" + (f" since {since}" if since else ""))


def _observed_session(sid: str, calls: list[tuple], ids: IdAlloc, t_first: float) -> Session:
    branches: dict[str, list[tuple]] = {}
    for c in calls:
        branches.setdefault(c[5], []).append(c)
    main_calls = branches.pop("main", None) or branches.pop(next(iter(branches)))
    main_chain = Chain()

    def thread(rows: list[tuple], head: Chain | None) -> tuple[list[CallSpec], Chain]:
        chain = head.prefix(len(head)) if head is not None else Chain()
        specs: list[CallSpec] = []
        prev_p, prev_end = None, None
        i = 0
        while i < len(rows):
            r = rows[i]
            # a turn: this call and the retries right after it (attempt > 1)
            j = i + 1
            while j < len(rows) and rows[j][6] > 1:
                j += 1
            last = rows[j - 1]
            p = int(r[9])
            if prev_p is not None and p < prev_p:  # the context shrank: a new chain (a reset)
                chain = Chain()
            need = p // BLOCK
            if need > len(chain):
                chain.append_run(ids.take_run(need - len(chain)), need - len(chain))
            gap = 0.0 if prev_end is None else max(0.0, float(r[7]) - float(prev_end))
            specs.append(CallSpec(chain.prefix(need), need, p, max(1, int(last[10])), gap, None,
                                  "tool" if prev_end is not None else None, j - i > 1,
                                  max(0.0, float(rows[i + 1][7]) - float(r[8])) if j - i > 1 else 1.0))
            prev_p, prev_end = p, last[8]
            i = j
        return specs, chain

    main_specs, main_chain = thread(main_calls, None)
    segments: list[Segment] = []
    # sub-agent branches as parallel segments where they started in the main thread's timeline
    forks = sorted(branches.items(), key=lambda kv: kv[1][0][7])
    starts = [float(c[7]) for c in main_calls]
    # map main specs back to their first-attempt start times
    turn_starts = []
    i = 0
    while i < len(main_calls):
        turn_starts.append(starts[i])
        j = i + 1
        while j < len(main_calls) and main_calls[j][6] > 1:
            j += 1
        i = j
    cur: list[CallSpec] = []
    k = 0
    for spec, t in zip(main_specs, turn_starts, strict=True):
        pending = []
        while k < len(forks) and float(forks[k][1][0][7]) < t:
            pending.append(forks[k])
            k += 1
        if pending:
            if cur:
                segments.append(Segment("seq", [("main", cur)]))
                cur = []
            threads = []
            for name, rows in pending:
                bspecs, _ = thread(rows, main_chain.prefix(min(len(main_chain), int(rows[0][9]) // BLOCK)))
                if bspecs:
                    bspecs[0].gap_s = 0.0
                    threads.append((name, bspecs))
            segments.append(Segment("par", threads))
        cur.append(spec)
    if cur:
        segments.append(Segment("seq", [("main", cur)]))
    rest = forks[k:]
    if rest:
        threads = []
        for name, rows in rest:
            bspecs, _ = thread(rows, main_chain.prefix(min(len(main_chain), int(rows[0][9]) // BLOCK)))
            if bspecs:
                bspecs[0].gap_s = 0.0
                threads.append((name, bspecs))
        segments.append(Segment("par", threads))
    first = segments[0].threads[0][1] if segments and segments[0].threads else []
    if first:
        first[0].gap_s = 0.0
    r0 = calls[0]
    n = sum(len(c) for s in segments for _, c in s.threads)
    return Session(f"obs-{sid}", f"obs-{r0[1]}", r0[2], r0[3], r0[4], float(r0[7]) - t_first, segments, n)


def check_plan(plan: Plan) -> None:
    if not plan.sessions:
        raise InputError(f"the workload has no sessions ({plan.source})")
