"""Workloads: what agent sessions send, as prompt block chains, output lengths and gaps.

A session is a list of segments run in order. A ``seq`` segment is one thread of calls, each after
an idle gap (tool execution / think time) following the previous call's end (closed loop, as an
agent behaves). A ``par`` segment runs several threads at once (parallel branches / sub-agents) and
ends when all have finished. A call's prompt is the first ``nblk`` full blocks of a block-hash
chain (shared list, append-only), plus ``P mod B`` tokens in a trailing partial block.

Sources: synthetic task mixes (task types as data below), the Claude Code traces and the Mooncake
conversation trace shipped in ``agentobs/sim/datasets``.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ConfigError, InputError
from .chain import Chain


class IdAlloc:
    """Unique block ids for one run (workload chains and engine output blocks share the space)."""

    def __init__(self, start: int = 1):
        self.next = start

    def take(self, n: int) -> list[int]:
        a = self.next
        self.next += n
        return list(range(a, a + n))

    def take_run(self, n: int) -> int:
        """``n`` consecutive ids; returns the first."""
        a = self.next
        self.next += n
        return a


@dataclass(slots=True)
class CallSpec:
    chain: Chain                # (a plain list of ids is converted when the call is issued)
    nblk: int
    P: int
    O: int  # noqa: E741 - METRICS.md notation
    gap_s: float = 0.0          # idle time before this call (after the previous call of its thread ended)
    at_s: float | None = None   # open-loop arrival time (trace replays), relative to the session start
    tool: str | None = None     # tool executed in the gap before this call
    fail: bool = False          # this attempt fails (client sees an error) and is retried
    backoff_s: float = 1.0
    system_tokens: int = 0
    tool_tokens: int = 0
    model: str | None = None
    # what the prompt is to the previous call of its thread (ground truth, truth/calls.parquet prompt_kind):
    # first | append | tail_rewrite (the last 1-2 blocks re-rendered) | edit (history edited mid-session: the
    # shared prefix shrinks while P grows) | compaction (a new context) | fork (a sub-agent's first call)
    kind: str = "append"


@dataclass
class Segment:
    kind: str                         # seq | par
    threads: list[tuple[str, list[CallSpec]]]  # (branch, calls)


@dataclass
class Session:
    sid: str
    task_id: str
    task_type: str
    tenant: str
    agent_name: str
    start_s: float
    segments: list[Segment]
    n_calls: int = 0
    engine_session: bool = True   # requests carry session_id to the engine (vLLM KV events show it)


@dataclass(frozen=True)
class Dist:
    """Lognormal with a median and a spread, clipped; ``fixed`` makes it a constant; ``uniform``."""

    median: float
    sigma: float = 0.0
    lo: float = 0.0
    hi: float = math.inf
    uniform: bool = False

    def draw(self, rng: random.Random) -> float:
        if self.uniform:
            return rng.uniform(self.lo, self.hi)
        v = self.median if self.sigma == 0 else rng.lognormvariate(math.log(self.median), self.sigma)
        return min(self.hi, max(self.lo, v))


@dataclass(frozen=True)
class TaskType:
    name: str
    agent: str
    turns: tuple[int, int]
    system_tokens: int
    tool_def_tokens: int
    first_input: Dist
    growth: Dist                 # new context per turn (tool output / user text), tokens
    output: Dist
    gap: Dist                    # tool / think time between calls, seconds
    tools: tuple[str, ...]
    retry_p: float = 0.0
    human_p: float = 0.0         # share of gaps that are a human turn instead of a tool
    human_gap: Dist = Dist(60.0, 1.0, 5.0, 1800.0)
    branches: tuple[int, int] = (0, 0)   # parallel branches forked once (research sub-agents)
    branch_turns: tuple[int, int] = (3, 6)
    compact_at: int = 0          # context compaction threshold (tokens), 0 = never
    tail_rewrite_p: float = 0.0  # share of turns whose prompt re-renders the last 1-2 blocks of the previous one
    edit_p: float = 0.0          # share of turns that edit history: keep 30-80% of the previous prompt's blocks


TASK_TYPES: dict[str, TaskType] = {
    t.name: t
    for t in (
        TaskType("coding", "swe-fixer", (10, 30), 2500, 5500, Dist(900, 0.8, 200, 4000), Dist(700, 1.1, 40, 12000),
                 Dist(180, 0.7, 20, 2000), Dist(9.0, 1.1, 0.5, 900.0), ("read_file", "grep", "run_tests", "edit_file"),
                 retry_p=0.02, human_p=0.05, compact_at=90_000),
        TaskType("support", "support-bot", (3, 8), 1800, 1200, Dist(200, 0.6, 40, 1500), Dist(250, 0.7, 40, 1500),
                 Dist(120, 0.6, 20, 600), Dist(1.2, 0.7, 0.2, 10.0), ("lookup_order", "search_kb"),
                 retry_p=0.01, human_p=0.4, human_gap=Dist(40.0, 0.9, 5.0, 600.0)),
        TaskType("research", "deep-researcher", (5, 10), 2200, 2600, Dist(400, 0.5, 100, 2000),
                 Dist(2500, 0.7, 300, 9000), Dist(300, 0.6, 50, 1500), Dist(6.0, 0.8, 1.0, 60.0),
                 ("web_search", "fetch_url"), retry_p=0.03, branches=(2, 4), branch_turns=(3, 6)),
        TaskType("batch-eval", "eval-runner", (1, 1), 1200, 0, Dist(3000, 0.5, 500, 12000), Dist(0, 0, 0, 0),
                 Dist(40, 0.8, 2, 300), Dist(0.05, 0.5, 0.0, 1.0), ()),
        TaskType("toolcall20", "tool-agent", (20, 20), 4000, 2000, Dist(600, 0.3, 200, 1500),
                 Dist(1500, 0.4, 600, 3000), Dist(180, 0.4, 60, 400), Dist(0, 0, 5.0, 30.0, uniform=True),
                 ("run_tool",)),
        # agents whose harness rewrites the context (issue 20): the last turn re-rendered, history edited or
        # compacted mid-session, sub-agents forked from the main thread
        TaskType("coding-edit", "edit-agent", (12, 30), 2500, 5500, Dist(900, 0.8, 200, 4000),
                 Dist(900, 1.0, 60, 9000), Dist(180, 0.7, 20, 2000), Dist(9.0, 1.1, 0.5, 300.0),
                 ("read_file", "grep", "run_tests", "edit_file"), retry_p=0.02, human_p=0.05, compact_at=60_000,
                 tail_rewrite_p=0.5, edit_p=0.08),
        TaskType("research-fork", "fork-researcher", (5, 10), 2200, 2600, Dist(400, 0.5, 100, 2000),
                 Dist(2500, 0.7, 300, 9000), Dist(300, 0.6, 50, 1500), Dist(6.0, 0.8, 1.0, 60.0),
                 ("web_search", "fetch_url"), retry_p=0.03, branches=(2, 4), branch_turns=(3, 6),
                 tail_rewrite_p=0.3, edit_p=0.05),
    )
}

TENANTS = ("team-platform", "team-search", "team-support", "acme-corp")


def _tokens(d: Dist, rng: random.Random) -> int:
    return int(round(d.draw(rng)))


class _Chain:
    """Grows one thread's block chain: a prompt of P tokens uses its first P // B blocks."""

    def __init__(self, ids: IdAlloc, B: int, head: Chain):
        self.ids, self.B = ids, B
        self.chain = head.prefix(len(head))

    def rewrite_from(self, keep: int) -> None:
        """The prompt changes from block ``keep`` on: later prompts share only the first ``keep`` blocks."""
        self.chain = self.chain.prefix(min(keep, len(self.chain)))

    def prompt(self, P: int) -> tuple[Chain, int]:
        n = P // self.B
        have = len(self.chain)
        if n > have:
            self.chain.append_run(self.ids.take_run(n - have), n - have)
        return self.chain, n


def synthetic(mix: dict[str, float], duration_s: float, sessions_per_min: float, seed: int, block_size: int,
              ids: IdAlloc, n_sessions: int | None = None, bursts: bool = True) -> list[Session]:
    """Sessions of the named task types, Poisson arrivals over ``duration_s`` (or exactly
    ``n_sessions``), deterministic for a seed."""
    for name in mix:
        if name not in TASK_TYPES:
            raise ConfigError(f"unknown task type {name!r}; known: {', '.join(TASK_TYPES)}")
    rng = random.Random(seed)
    names = list(mix)
    weights = [mix[n] for n in names]
    B = block_size
    shared = {}
    for n in names:
        k = (TASK_TYPES[n].system_tokens + TASK_TYPES[n].tool_def_tokens) // B
        shared[n] = Chain()
        shared[n].append_run(ids.take_run(k), k)
    out: list[Session] = []
    t = 0.0
    rate = sessions_per_min / 60.0
    i = 0
    while True:
        if n_sessions is not None:
            if i >= n_sessions:
                break
        t += rng.expovariate(rate) if rate > 0 else 0.0
        if n_sessions is None and t > duration_s:
            break
        tt = TASK_TYPES[rng.choices(names, weights)[0]]
        burst = rng.randint(5, 20) if (bursts and tt.name == "batch-eval") else 1
        for _ in range(burst):
            out.append(_synthetic_session(tt, i, t, rng, ids, B, shared[tt.name], seed))
            i += 1
    return out


def _synthetic_session(tt: TaskType, i: int, t0: float, rng: random.Random, ids: IdAlloc, B: int, shared: Chain,
                       seed: int) -> Session:
    sid = f"sess-{seed:x}-{i:06d}"
    head_tokens = tt.system_tokens + tt.tool_def_tokens
    main = _Chain(ids, B, shared)
    P = head_tokens + _tokens(tt.first_input, rng)
    turns = rng.randint(*tt.turns)
    fork_at = rng.randint(1, max(1, turns - 2)) if tt.branches[1] else -1
    segments: list[Segment] = []
    calls: list[CallSpec] = []
    n = 0

    def mk(ch: _Chain, P: int, gap: float, tool: str | None, kind: str = "append") -> CallSpec:
        chain, nblk = ch.prompt(P)
        O = max(1, _tokens(tt.output, rng))  # noqa: E741
        fail = rng.random() < tt.retry_p
        return CallSpec(chain, nblk, P, O, gap, None, tool, fail, rng.uniform(0.5, 3.0), tt.system_tokens,
                        tt.tool_def_tokens, kind=kind)

    head_blocks = head_tokens // B

    def rewrite(ch: _Chain, prev_nblk: int) -> str:
        """Draws (only for task types that rewrite, so other types' random streams stay as they were) whether this
        turn edits history or re-renders the tail, and cuts the thread's chain accordingly."""
        if tt.edit_p and rng.random() < tt.edit_p:
            ch.rewrite_from(max(head_blocks, int(prev_nblk * rng.uniform(0.3, 0.8))))
            return "edit"
        if tt.tail_rewrite_p and rng.random() < tt.tail_rewrite_p:
            ch.rewrite_from(max(head_blocks, prev_nblk - rng.randint(1, 2)))
            return "tail_rewrite"
        return "append"

    prevO = 0
    last_nblk = 0
    for k in range(turns):
        if k == 0:
            gap, tool, kind = 0.0, None, "first"
        else:
            human = rng.random() < tt.human_p
            gap = tt.human_gap.draw(rng) if human else tt.gap.draw(rng)
            tool = None if human or not tt.tools else rng.choice(tt.tools)
            P = P + prevO + _tokens(tt.growth, rng)
            kind = "append"
            if tt.compact_at and P > tt.compact_at:  # compaction: a new context (summary)
                main = _Chain(ids, B, shared)
                P = head_tokens + rng.randint(2000, 5000)
                kind = "compaction"
            elif tt.edit_p or tt.tail_rewrite_p:
                kind = rewrite(main, last_nblk)
        c = mk(main, P, gap, tool, kind)
        last_nblk = c.nblk
        calls.append(c)
        n += 1
        prevO = c.O
        if k == fork_at:
            segments.append(Segment("seq", [("main", calls)]))
            calls = []
            threads = []
            base = main.chain.prefix(P // B)
            for b in range(rng.randint(*tt.branches)):
                ch = _Chain(ids, B, base)
                bp = P + prevO + _tokens(tt.growth, rng)
                bcalls: list[CallSpec] = []
                for j in range(rng.randint(*tt.branch_turns)):
                    if j:
                        bp += bcalls[-1].O + _tokens(tt.growth, rng)
                    bt = rng.choice(tt.tools) if tt.tools else None
                    bkind = "fork" if not j else (rewrite(ch, bcalls[-1].nblk) if tt.edit_p or tt.tail_rewrite_p
                                                  else "append")
                    bcalls.append(mk(ch, bp, tt.gap.draw(rng), bt, bkind))
                    n += 1
                threads.append((f"b{b + 1}", bcalls))
            segments.append(Segment("par", threads))
            P = P + prevO + sum(300 for _ in threads)  # branch summaries come back to the main thread
            prevO = 0
    if calls:
        segments.append(Segment("seq", [("main", calls)]))
    return Session(sid, f"task-{seed:x}-{i:06d}", tt.name, rng.choice(TENANTS), tt.agent, t0, segments, n)


# -- trace replays ---------------------------------------------------------------------------------
def dataset_dir() -> Path:
    return Path(str(resources.files("agentobs.sim") / "datasets"))


def _load_json(path: Path):
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except (OSError, EOFError) as e:
        raise InputError(f"cannot read: {getattr(e, 'strerror', None) or e}", str(path)) from e
    try:
        return json.loads(data)
    except ValueError as e:
        raise InputError(f"not JSON: {e}", str(path)) from e


def _expand(ids: list[int], k: int, base: int) -> list[int]:
    if k == 1:
        return [base + h for h in ids]
    return [base + h * k + j for h in ids for j in range(k)]


def claude_code(paths: list[Path] | None, block_size: int, ids: IdAlloc, spacing_s: float = 30.0,
                limit: int | None = None) -> list[Session]:
    """Replay Claude Code sessions (kv-cache-tester traces): each file one session; prompts keep
    their 64-token block ids (split into ``64 / block_size`` sub-blocks); gaps are ``think_time``;
    sub-agents run as a parallel branch while the parent waits."""
    if 64 % block_size:
        raise ConfigError(f"the Claude Code traces have 64-token blocks; block size {block_size} must divide 64")
    k = 64 // block_size
    if paths is None:
        paths = sorted((dataset_dir() / "claude_code").glob("trace_*.json*"))
    out = []
    names: set[str] = set()
    for i, p in enumerate(paths[:limit] if limit else paths):
        doc = _load_json(p)
        _check_trace(doc, p)
        base = ids.next
        maxid = 0
        sysn, tooln = int(doc.get("system_tokens", 0)), int(doc.get("tool_tokens", 0))
        segments: list[Segment] = []
        calls: list[CallSpec] = []
        n = 0

        tails: list[int] = []  # fresh ids for trailing partial blocks no later prompt completes

        def conv(reqs):
            """The calls of one thread. With blocks smaller than 64 tokens, the prompt's trailing partial 64-token
            block (not hashed in the trace) still holds ``(P mod 64) // B`` full blocks: they take the ids of the
            block that a later prompt of the thread completes at that position when that prompt extends this one
            (same tokens), else fresh ids (the tail was rewritten)."""
            nonlocal maxid
            reqs = [r for r in reqs if r.get("type") != "subagent"]
            hs = [r.get("hash_ids") or [] for r in reqs]
            res = []
            prev_stop = None
            for j, r in enumerate(reqs):
                h = hs[j]
                if h:
                    maxid = max(maxid, max(h))
                P = int(r["in"])
                sub = (P % 64) // block_size if k > 1 else 0
                chain = Chain.from_ids(_expand(h, k, base))  # noqa: B023 - called within the iteration
                if sub:
                    m = len(h)
                    nxt = None
                    for h2 in hs[j + 1:]:
                        if m and (len(h2) < m or h2[m - 1] != h[m - 1]):
                            break  # a later prompt no longer extends this one
                        if len(h2) > m:
                            nxt = h2[m]
                            break
                    if nxt is not None:
                        chain.append_run(base + nxt * k, sub)  # noqa: B023
                    else:
                        tails.append(sub)  # noqa: B023
                        chain.append_run(-len(tails), sub)  # noqa: B023 - placeholder, renumbered below
                nblk = min(len(chain), P // block_size)
                tool = "tool_use" if prev_stop == "tool_use" else None
                res.append(CallSpec(chain, nblk, P, max(1, int(r.get("out", 1))), float(r.get("think_time", 0) or 0),
                                    None, tool, False, 1.0, sysn, tooln, r.get("model"),  # noqa: B023
                                    kind=_trace_kind(hs[j - 1], h) if j else "append"))
                prev_stop = r.get("stop")
            return res

        parent = [r for r in doc["requests"] if r.get("type") != "subagent"]
        parent_calls = iter(conv(parent))
        for r in doc["requests"]:
            if r.get("type") == "subagent":
                if calls:
                    segments.append(Segment("seq", [("main", calls)]))
                    calls = []
                sub = conv(r.get("requests") or [])
                if sub:
                    sub[0].gap_s = 0.0
                    sub[0].kind = "fork"
                    segments.append(Segment("par", [(str(r.get("agent_id") or "subagent"), sub)]))
                    n += len(sub)
            else:
                calls.append(next(parent_calls))
                n += 1
        if calls:
            segments.append(Segment("seq", [("main", calls)]))
        ids.next = base + (maxid + 1) * k + 1
        if tails:  # give the rewritten tails their fresh ids, after the session's own
            _renumber_tails(segments, tails, ids)
        if segments and segments[0].threads[0][1]:
            segments[0].threads[0][1][0].gap_s = 0.0
        name = p.name.split(".")[0]
        if f"cc-{name}" in names:  # the same file name from two folders: two sessions all the same
            name = f"{name}-{i}"
        names.add(f"cc-{name}")
        out.append(Session(f"cc-{name}", f"task-cc-{name}", "coding", "team-platform", "claude-code", i * spacing_s,
                           segments, n))
    return out


def _trace_kind(prev: list[int], cur: list[int]) -> str:
    """What a trace request's prompt is to the previous one of its thread, from their 64-token block ids."""
    n = 0
    for a, b in zip(prev, cur, strict=False):
        if a != b:
            break
        n += 1
    if n == len(prev):
        return "append"
    if len(cur) < len(prev):
        return "compaction"
    return "tail_rewrite" if len(prev) - n <= 2 else "edit"


def _renumber_tails(segments: list[Segment], tails: list[int], ids: IdAlloc) -> None:
    firsts = [ids.take_run(n) for n in tails]
    for seg in segments:
        for _, calls in seg.threads:
            for c in calls:
                ch = c.chain
                last = ch.runs(0, len(ch))[-1] if len(ch) else None
                if last is not None and last[0] < 0:
                    c.chain = ch.prefix(len(ch) - (last[1] - last[0]))
                    c.chain.append_run(firsts[-last[0] - 1], last[1] - last[0])


def _check_trace(doc, p: Path) -> None:
    """Refuse a file that is JSON but not a kv-cache-tester trace, naming the first wrong field."""
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise InputError("not a kv-cache-tester trace: expected an object with a 'requests' list", str(p))
    bs = doc.get("block_size", 64)
    if bs != 64:
        raise InputError(f"block_size is {bs!r}; kv-cache-tester traces have 64-token blocks", str(p))

    def check(reqs, where):
        for j, r in enumerate(reqs):
            at = f"{where}[{j}]"
            if not isinstance(r, dict):
                raise InputError(f"{at} is not an object", str(p))
            if r.get("type") == "subagent":
                if not isinstance(r.get("requests") or [], list):
                    raise InputError(f"{at}.requests is not a list", str(p))
                check(r.get("requests") or [], f"{at}.requests")
                continue
            n = r.get("in")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise InputError(f"{at}.in is {n!r}; expected the prompt's token count (an integer >= 0)", str(p))
            o = r.get("out", 1)
            if isinstance(o, bool) or not isinstance(o, int | float) or o < 0:
                raise InputError(f"{at}.out is {o!r}; expected the output's token count", str(p))
            for k in ("t", "think_time"):
                v = r.get(k)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
                    raise InputError(f"{at}.{k} is {v!r}; expected seconds (a number >= 0)", str(p))
            h = r.get("hash_ids") or []
            if not isinstance(h, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                  for x in h):
                raise InputError(f"{at}.hash_ids must be a list of integers >= 0", str(p))
            if len(h) > n // 64:
                raise InputError(f"{at} has {len(h)} hash_ids for {n} tokens (at most one per full 64-token "
                                 "block)", str(p))

    check(doc["requests"], "requests")


def mooncake(path: Path | None, block_size: int, ids: IdAlloc, limit: int | None = None,
             popular: int = 50) -> list[Session]:
    """Replay the Mooncake conversation trace: open-loop arrivals at the recorded timestamps; 512-token
    block ids split into ``512 / block_size`` sub-blocks; a request continues an earlier one (same
    session) when that one's full blocks are a prefix of it, past any node ≥ ``popular`` requests
    pass through (README heuristic)."""
    if 512 % block_size:
        raise ConfigError(f"the Mooncake trace has 512-token blocks; block size {block_size} must divide 512")
    k = 512 // block_size
    if path is None:
        path = dataset_dir() / "mooncake" / "conversation_trace.jsonl.gz"
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    rows = []
    for ln, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            raise InputError(f"not JSON: {e}", f"{path}:{ln}") from e
        if limit and len(rows) >= limit:
            break
    passes: dict[int, int] = {}
    for r in rows:
        for h in r["hash_ids"]:
            passes[h] = passes.get(h, 0) + 1
    base = ids.next
    maxid = max((max(r["hash_ids"]) for r in rows if r["hash_ids"]), default=0)
    ids.next = base + (maxid + 1) * k + 1
    end_of: dict[int, Session] = {}  # last full block id of a request -> its session
    sessions: list[Session] = []
    for i, r in enumerate(rows):
        h = r["hash_ids"]
        P = int(r["input_length"])
        full = h[: P // 512]
        sess = None
        for j in range(len(h) - 1, -1, -1):
            if passes.get(h[j], 0) >= popular:
                break
            s = end_of.get(h[j])
            if s is not None:
                sess = s
                break
        t = r["timestamp"] / 1000.0
        chain = Chain.from_ids(_expand(h, k, base))
        c = CallSpec(chain, min(len(chain), P // block_size), P, max(1, int(r["output_length"])), 0.0, None, None)
        if sess is None:
            sess = Session(f"mc-{i:06d}", f"task-mc-{i:06d}", "chat", "kimi", "chat", t,
                           [Segment("seq", [("main", [])])], 0)
            sessions.append(sess)
        c.at_s = t - sess.start_s
        sess.segments[0].threads[0][1].append(c)
        sess.n_calls += 1
        if full:
            end_of[full[-1]] = sess
    return sessions
