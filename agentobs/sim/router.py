"""Router policies: which replica serves a call.

A session asks for one model and every call of it goes to a replica of that model: the router keeps one
*pool* per served model (``InstanceSpec.model``; replicas that declare none form one pool together) and
applies its policy within the session's pool. A session's model is drawn once, from a hash of its id, with
each pool weighted by its number of replicas (no random stream is touched, so a fleet of one model routes as
before models were pools).

* ``round_robin`` — the default of most gateways (and of sgl-router), one turn counter per pool.
* ``least_loaded`` — fewest running + waiting requests.
* ``cache_aware`` — sgl-router style: when load is imbalanced (max − min > 32 and max > 1.1 × min)
  route to the least loaded; else to the replica with the longest cached prefix if it covers more
  than ``threshold`` (0.5) of the prompt, else the least loaded.
* ``session_affinity`` — consistent hash of the session id (a hash ring with virtual nodes, so
  adding a replica moves only ~1/n of the sessions).
"""

from __future__ import annotations

import bisect
import hashlib

from ..errors import ConfigError

POLICIES = ("round_robin", "least_loaded", "cache_aware", "session_affinity")


def _h(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


class _Pool:
    """The replicas of one model, with the policy's per-pool state."""

    def __init__(self, instances: list, vnodes: int):
        self.instances = instances
        self.rr = 0
        ring = sorted((_h(f"{inst.spec.name}#{v}"), i) for i, inst in enumerate(instances) for v in range(vnodes))
        self.ring_keys = [k for k, _ in ring]
        self.ring_vals = [i for _, i in ring]


class Router:
    def __init__(self, policy: str, instances: list, threshold: float = 0.5, vnodes: int = 64,
                 balance_abs: int = 32, balance_rel: float = 1.1):
        if policy not in POLICIES:
            raise ConfigError(f"unknown router policy {policy!r}; known: {', '.join(POLICIES)}")
        self.policy = policy
        self.instances = instances
        self.threshold = threshold
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        by_model: dict[str | None, list] = {}
        for inst in instances:
            by_model.setdefault(inst.spec.model, []).append(inst)
        self.pools = [_Pool(insts, vnodes) for insts in by_model.values()]  # in order of first replica
        self.session_pool: dict[str, _Pool] = {}
        self.affinity: dict[str, int] = {}

    def pool_of(self, session_id: str) -> _Pool:
        """The pool (model) of a session: drawn on its first call, from a hash of its id."""
        p = self.session_pool.get(session_id)
        if p is None:
            p = self.pools[0]
            if len(self.pools) > 1:
                k = _h(f"model/{session_id}") % len(self.instances)  # each replica one share
                for p in self.pools:
                    if k < len(p.instances):
                        break
                    k -= len(p.instances)
            self.session_pool[session_id] = p
        return p

    def pick(self, session_id: str, chain, nblk: int):
        pool = self.pool_of(session_id)
        insts = pool.instances
        p = self.policy
        if p == "round_robin":
            i = pool.rr % len(insts)
            pool.rr += 1
            return insts[i]
        if p == "least_loaded":
            return min(insts, key=lambda x: (x.load(), x.idx))
        if p == "session_affinity":
            k = self.affinity.get(session_id)
            if k is None:
                j = bisect.bisect(pool.ring_keys, _h(session_id)) % len(pool.ring_keys)
                k = self.affinity[session_id] = pool.ring_vals[j]
            return insts[k]
        # cache_aware
        loads = [x.load() for x in insts]
        lo, hi = min(loads), max(loads)
        least = min(insts, key=lambda x: (x.load(), x.idx))
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            return least
        if nblk <= 0:
            return least
        best, best_m = None, -1
        for x in insts:
            m = x.cache.gpu_match(chain, nblk)
            if m > best_m:
                best, best_m = x, m
        if best_m / nblk > self.threshold:
            return best
        return least
