"""Reference KV cache: one entry per block (the first implementation, kept to check the segment cache).

cache.py keeps whole runs of blocks per entry and must give the same results; tests/test_sim_engine.py
runs both on the same fleets and compares every call, and ``bench/sim_speed.py --baseline`` times both.

KV prefix caches of the simulated engines, at block (page) granularity.

A prompt is a chain of block hashes (ints, prefix-chained: equal hash ⇒ equal prefix), so a cache is
a set of hashes plus an LRU order of the evictable ones — never a Python object per token.

* ``vllm`` flavour (``radix=False``): vLLM's block pool. Only full blocks are cached; a finished
  request frees its blocks tail first (they join the free queue in reverse order, so the tail of a
  prefix is evicted before its head); blocks in use by a running request are pinned (ref count).
* ``sglang`` flavour (``radix=True``): SGLang's radix tree at page granularity; eviction takes the
  least recently used *leaf* (a node with cached children is never evicted before them).
* Optional host tier (vLLM CPU offloading / SGLang HiCache): blocks evicted from the GPU are kept
  in host memory (LRU, ``host_blocks``) and loaded back on a hit; with ``write_through`` (HiCache's
  default) a block is copied to the host when it is stored.
* ``enabled=False``: prefix caching off / ``--disable-radix-cache``: nothing is ever matched.

Every store/evict is reported through ``on_event(kind, hashes, medium, parent)`` (KV events).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import add
from operator import sub as sub_

EventFn = Callable[[str, Sequence[int], str, object], None]


class BlockKVCache:
    __slots__ = ("capacity", "block_size", "enabled", "radix", "host_capacity", "write_through", "ref", "lru",
                 "host", "used", "children", "parent", "on_event", "on_evict", "evicted_blocks",
                 "host_loaded_blocks", "stored_blocks")

    def __init__(self, capacity_blocks: int, block_size: int, enabled: bool = True, radix: bool = False,
                 host_blocks: int = 0, write_through: bool = True, on_event: EventFn | None = None,
                 on_evict: Callable[[list[tuple[int, int]]], None] | None = None):
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.enabled = enabled
        self.radix = radix
        self.host_capacity = host_blocks
        self.write_through = write_through
        self.ref: dict[int, int] = {}            # cached on GPU: hash -> requests using it
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached, unused: eviction order (oldest first)
        self.host: OrderedDict[int, None] = OrderedDict()  # host tier
        self.used = 0                             # GPU blocks allocated (cached or not)
        self.children: dict[int, int] = {}        # radix: cached children per node
        self.parent: dict[int, int | None] = {}
        self.on_event = on_event
        self.on_evict = on_evict
        self.evicted_blocks = 0
        self.host_loaded_blocks = 0
        self.stored_blocks = 0

    # -- lookup ------------------------------------------------------------------------------
    def match(self, chain: Sequence[int], n: int) -> tuple[int, int]:
        """(GPU hit blocks, further host-tier hit blocks) among the first ``n`` blocks of ``chain``."""
        if not self.enabled or n <= 0:
            return 0, 0
        hits = list(map(self.ref.__contains__, chain[:n]))
        try:
            g = hits.index(False)
        except ValueError:
            return n, 0
        if not self.host:
            return g, 0
        hh = list(map(self.host.__contains__, chain[g:n]))
        try:
            h = hh.index(False)
        except ValueError:
            h = n - g
        return g, h

    def gpu_match(self, chain: Sequence[int], n: int) -> int:
        if not self.enabled or n <= 0:
            return 0
        hits = list(map(self.ref.__contains__, chain[:n]))
        try:
            return hits.index(False)
        except ValueError:
            return n

    # -- allocation --------------------------------------------------------------------------
    def evictable(self) -> int:
        return len(self.lru)

    def allocate(self, n: int, now: float) -> bool:
        """Reserve ``n`` blocks, evicting unused cached blocks (LRU) as needed."""
        short = n - (self.capacity - self.used)
        if short > 0:
            if short > len(self.lru):
                return False
            self._evict(short, now)
        self.used += n
        return True

    def _evict(self, k: int, now: float) -> None:
        lru, ref = self.lru, self.ref
        if not self.radix:
            pop = lru.popitem
            out = [pop(False)[0] for _ in range(min(k, len(lru)))]
            deque(map(ref.__delitem__, out), maxlen=0)
        else:
            out = self._evict_radix(k)
        self.used -= len(out)
        self.evicted_blocks += len(out)
        if self.on_evict is not None:
            self.on_evict([(h, h + 1) for h in out])
        if self.on_event is not None and out:
            self.on_event("BlockRemoved", out, "GPU", None)
        if self.host_capacity:
            host = self.host
            if self.write_through:
                for h in out:  # already written at store time; refresh its recency
                    host[h] = None
                    host.move_to_end(h)
            else:
                host.update(zip(out, repeat(None)))
            while len(host) > self.host_capacity:
                host.popitem(last=False)

    def _evict_radix(self, k: int) -> list[int]:
        lru, ref = self.lru, self.ref
        children, parent = self.children, self.parent
        out: list[int] = []
        guard = 0
        while len(out) < k and lru:
            h, _ = lru.popitem(last=False)
            if children.get(h):
                lru[h] = None  # not a leaf: keep, look further (its children are newer or in use)
                guard += 1
                if guard > 2 * len(lru) + 8:
                    break
                continue
            del ref[h]
            out.append(h)
            p = parent.pop(h, None)
            if p is not None and p in children:
                children[p] -= 1
        while len(out) < k and lru:  # only inner nodes left unused: take them anyway
            h, _ = lru.popitem(last=False)
            del ref[h]
            out.append(h)
            parent.pop(h, None)
            children.pop(h, None)
        return out

    # -- request lifecycle -------------------------------------------------------------------
    def acquire(self, chain: Sequence[int], m: int) -> None:
        """Pin the first ``m`` cached blocks for a running request."""
        if m <= 0:
            return
        ref, lru = self.ref, self.lru
        sub = chain[:m]
        cnts = list(map(ref.__getitem__, sub))
        if 0 in cnts:
            deque(map(lru.__delitem__, [h for h, c in zip(sub, cnts, strict=False) if c == 0]), maxlen=0)
        ref.update(zip(sub, map(add, cnts, repeat(1)), strict=False))

    def load_from_host(self, chain: Sequence[int], start: int, end: int) -> None:
        """Blocks ``start:end`` were hit in the host tier; they are now on the GPU (already allocated)."""
        if end > start:
            self.host_loaded_blocks += end - start
            self.store(chain, start, end)

    def store(self, chain: Sequence[int], start: int, end: int, medium: str | None = "GPU") -> None:
        """Blocks ``start:end`` of ``chain`` are now full and hashed: cache them, pinned by their request.
        Blocks already cached (another request computed the same prefix meanwhile) are pinned instead
        and the duplicate block is returned to the pool."""
        if end <= start or not self.enabled:
            return
        ref = self.ref
        sub = chain[start:end]
        present = list(map(ref.__contains__, sub))
        if True in present:
            new: Sequence[int] = [h for h, p in zip(sub, present, strict=False) if not p]
            dup = [h for h, p in zip(sub, present, strict=False) if p]
            self.acquire(dup, len(dup))
            self.used -= len(dup)
        else:
            new = sub
        if not new:
            return
        ref.update(zip(new, repeat(1)))
        if self.radix:
            prev = chain[start - 1] if start > 0 else None
            parents = [prev, *sub[:-1]]
            pm = dict(zip(sub, parents, strict=False))
            children = self.children
            self.parent.update((h, pm[h]) for h in new)
            for h in new:
                p = pm[h]
                if p is not None:
                    children[p] = children.get(p, 0) + 1
        self.stored_blocks += len(new)
        if self.on_event is not None and medium is not None:
            self.on_event("BlockStored", new, medium, chain[start - 1] if start > 0 else None)
        if self.host_capacity and self.write_through:
            host = self.host
            host.update(zip(new, repeat(None)))
            while len(host) > self.host_capacity:
                host.popitem(last=False)

    def release(self, chain: Sequence[int], n_cached: int, n_uncached: int) -> None:
        """A request finished or was preempted: unpin its ``n_cached`` leading blocks (tail first into
        the LRU, so the head of a prefix outlives its tail) and free its ``n_uncached`` other blocks."""
        self.used -= n_uncached
        if n_cached <= 0:
            return
        ref, lru = self.ref, self.lru
        sub = chain[:n_cached]
        cnts = list(map(ref.__getitem__, sub))
        left = list(map(sub_, cnts, repeat(1)))
        ref.update(zip(sub, left, strict=False))
        if 0 in left:
            freed = [h for h, c in zip(sub, left, strict=False) if c == 0] if min(left) < max(left) else sub
            lru.update(zip(reversed(freed), repeat(None)))
