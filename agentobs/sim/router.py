"""Router policies: which replica serves a call.

* ``round_robin`` — the default of most gateways (and of sgl-router).
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


class Router:
    def __init__(self, policy: str, instances: list, threshold: float = 0.5, vnodes: int = 64,
                 balance_abs: int = 32, balance_rel: float = 1.1):
        if policy not in POLICIES:
            raise ConfigError(f"unknown router policy {policy!r}; known: {', '.join(POLICIES)}")
        self.policy = policy
        self.instances = instances
        self.threshold = threshold
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self.rr = 0
        ring = sorted((_h(f"{inst.spec.name}#{v}"), i) for i, inst in enumerate(instances) for v in range(vnodes))
        self.ring_keys = [k for k, _ in ring]
        self.ring_vals = [i for _, i in ring]
        self.affinity: dict[str, int] = {}

    def pick(self, session_id: str, chain, nblk: int):
        insts = self.instances
        p = self.policy
        if p == "round_robin":
            i = self.rr % len(insts)
            self.rr += 1
            return insts[i]
        if p == "least_loaded":
            return min(insts, key=lambda x: (x.load(), x.idx))
        if p == "session_affinity":
            i = self.affinity.get(session_id)
            if i is None:
                j = bisect.bisect(self.ring_keys, _h(session_id)) % len(self.ring_keys)
                i = self.affinity[session_id] = self.ring_vals[j]
            return insts[i]
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
