"""KV prefix caches of the simulated engines, at block (page) granularity, stored as id ranges.

A prompt is a chain of block ids (``chain.Chain``: runs of consecutive ids, prefix-chained: equal id
⇒ equal prefix). The cache keeps *ranges* of cached ids, each with one ref count, so storing, pinning,
releasing and evicting a 20k-token prefix costs O(ranges), not O(blocks) — never a Python object per
block or token. Same semantics, block for block, as the per-block reference ``cache_ref.BlockKVCache``
(tests/test_sim_engine.py runs both on whole fleets and compares every call):

* ``vllm`` flavour: vLLM's block pool. Only full blocks are cached; a finished request frees its
  blocks tail first (a release is one LRU *group* whose blocks are evicted in reverse chain order,
  so the tail of a prefix goes before its head); blocks in use by a running request are pinned.
  Unused ranges sit in a heap keyed by (group, position in the group); evicting k blocks takes them
  off the top of the oldest range, splitting it.
* ``sglang`` flavour (``radix=True``): SGLang's radix tree at page granularity evicts the least
  recently used *leaf*. That is the same order here: a pinned block's whole prefix is pinned by the
  same request, and a release group lists descendants before ancestors, so the oldest unused block
  never has a cached child (checked on whole fleets against the reference, which tests leafness).
* Optional host tier (vLLM CPU offloading / SGLang HiCache): blocks evicted from the GPU are kept
  in host memory (LRU, ``host_blocks``) and loaded back on a hit; with ``write_through`` (HiCache's
  default) a block is copied to the host when it is stored.
* ``enabled=False``: prefix caching off / ``--disable-radix-cache``: nothing is ever matched.

Every store/evict is reported through ``on_event(kind, hashes, medium, parent)`` (KV events, ids
listed — only when a sink wants them) and evictions through ``on_evict(ranges)``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from heapq import heapify, heappop, heappush, heapreplace

from .chain import Chain, as_chain, lead

EventFn = Callable[[str, list, str, object], None]


class KVCache:
    __slots__ = ("capacity", "block_size", "enabled", "radix", "host_capacity", "write_through", "used",
                 "on_event", "on_evict", "evicted_blocks", "host_loaded_blocks", "stored_blocks",
                 "ks", "iv", "heap", "gseq", "n_lru", "n_cached",
                 "hks", "hiv", "hheap", "hseq", "hn")

    def __init__(self, capacity_blocks: int, block_size: int, enabled: bool = True, radix: bool = False,
                 host_blocks: int = 0, write_through: bool = True, on_event: EventFn | None = None,
                 on_evict: Callable[[list[tuple[int, int]]], None] | None = None):
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.enabled = enabled
        self.radix = radix
        self.host_capacity = host_blocks
        self.write_through = write_through
        self.used = 0                             # GPU blocks allocated (cached or not)
        self.on_event = on_event
        self.on_evict = on_evict
        self.evicted_blocks = 0
        self.host_loaded_blocks = 0
        self.stored_blocks = 0
        # GPU: sorted range starts; start -> [end, refs, group, pos] (group None while pinned)
        self.ks: list[int] = []
        self.iv: dict[int, list] = {}
        self.heap: list = []                      # (group, pos, start) of unused ranges, lazily pruned
        self.gseq = 0
        self.n_lru = 0                            # unused cached blocks (evictable)
        self.n_cached = 0
        # host tier: start -> [end, batch, pos, dir]; dir -1: leaves top first, +1: bottom first
        self.hks: list[int] = []
        self.hiv: dict[int, list] = {}
        self.hheap: list = []
        self.hseq = 0
        self.hn = 0

    # -- lookup ------------------------------------------------------------------------------
    def match(self, chain, n: int) -> tuple[int, int]:
        """(GPU hit blocks, further host-tier hit blocks) among the first ``n`` blocks of ``chain``."""
        if not self.enabled or n <= 0:
            return 0, 0
        chain = as_chain(chain)
        g = lead(self.ks, self.iv, chain.runs(0, n))
        if g >= n or not self.hn:
            return g, 0
        return g, lead(self.hks, self.hiv, chain.runs(g, n))

    def gpu_match(self, chain, n: int) -> int:
        if not self.enabled or n <= 0:
            return 0
        return lead(self.ks, self.iv, as_chain(chain).runs(0, n))

    # -- allocation --------------------------------------------------------------------------
    def evictable(self) -> int:
        return self.n_lru

    def allocate(self, n: int, now: float) -> bool:
        """Reserve ``n`` blocks, evicting unused cached blocks (LRU) as needed."""
        short = n - (self.capacity - self.used)
        if short > 0:
            if short > self.n_lru:
                return False
            self._evict(short)
        self.used += n
        return True

    def _split(self, x: int) -> None:
        """Make ``x`` a range boundary (an unused range keeps its eviction order across the cut)."""
        ks = self.ks
        i = bisect_right(ks, x) - 1
        if i < 0:
            return
        a = ks[i]
        e = self.iv[a]
        end = e[0]
        if x <= a or x >= end:
            return
        if e[1] == 0:  # unused: [x, end) keeps the key (its top is evicted first), [a, x) follows it
            g, p = e[2], e[3]
            self.iv[x] = [end, 0, g, p]
            heappush(self.heap, (g, p, x))
            e[3] = p + (end - x)
            heappush(self.heap, (g, e[3], a))
        else:
            self.iv[x] = [end, e[1], None, 0]
        e[0] = x
        ks.insert(i + 1, x)

    def _evict(self, k: int) -> None:
        heap, iv, ks = self.heap, self.iv, self.ks
        out: list[tuple[int, int]] = []
        need = k
        while need > 0 and heap:
            g, p, a = heap[0]
            e = iv.get(a)
            if e is None or e[1] != 0 or e[2] != g or e[3] != p:
                heappop(heap)  # stale: the range was pinned, split or evicted since
                continue
            end = e[0]
            n = end - a
            if n <= need:
                heappop(heap)
                del iv[a]
                del ks[bisect_left(ks, a)]
                out.append((a, end))
                need -= n
            else:
                lo = end - need
                out.append((lo, end))
                e[0] = lo
                e[3] = p + need
                heapreplace(heap, (g, p + need, a))
                need = 0
        n_out = k - need
        self.used -= n_out
        self.n_lru -= n_out
        self.n_cached -= n_out
        self.evicted_blocks += n_out
        if self.on_evict is not None and out:
            self.on_evict(out)
        if self.on_event is not None and out:
            ids: list[int] = []
            for lo, hi in out:
                ids.extend(range(hi - 1, lo - 1, -1))
            self.on_event("BlockRemoved", ids, "GPU", None)
        if self.host_capacity and out:
            # write-through: already on the host, refresh recency; else copy the evicted blocks there
            self._host_add([(lo, hi, -1) for lo, hi in out], refresh=self.write_through)
        if len(heap) > 64 + 4 * len(ks):
            self._compact()

    def _compact(self) -> None:
        iv = self.iv
        self.heap = [(e[2], e[3], a) for a, e in iv.items() if e[1] == 0]
        heapify(self.heap)

    # -- host tier -------------------------------------------------------------------------------
    def _host_split(self, x: int) -> None:
        hks = self.hks
        i = bisect_right(hks, x) - 1
        if i < 0:
            return
        a = hks[i]
        e = self.hiv[a]
        end, s, p, d = e
        if x <= a or x >= end:
            return
        if d < 0:
            self.hiv[x] = [end, s, p, d]
            heappush(self.hheap, (s, p, x))
            e[2] = p + (end - x)
            heappush(self.hheap, (s, e[2], a))
        else:
            q = p + (x - a)
            self.hiv[x] = [end, s, q, d]
            heappush(self.hheap, (s, q, x))
        e[0] = x
        hks.insert(i + 1, x)

    def _host_add(self, ranges: list[tuple[int, int, int]], refresh: bool) -> None:
        """Append id ranges (``dir`` -1: listed top first) at the host LRU's recent end. ``refresh``:
        blocks already there move to the end too (else they keep their place, like dict.update)."""
        self.hseq += 1
        s = self.hseq
        hks, hiv, hheap = self.hks, self.hiv, self.hheap
        pos = 0
        for a, b, d in ranges:
            self._host_split(a)
            self._host_split(b)
            i = bisect_left(hks, a)
            j = bisect_left(hks, b)
            if refresh:
                if i < j:
                    for k in hks[i:j]:
                        self.hn -= hiv.pop(k)[0] - k
                    del hks[i:j]
                hks.insert(i, a)
                hiv[a] = [b, s, pos, d]
                heappush(hheap, (s, pos, a))
                self.hn += b - a
            else:  # only the gaps between ranges already held
                gaps = []
                x = a
                for k in hks[i:j]:
                    if k > x:
                        gaps.append((x, k))
                    x = hiv[k][0]
                if x < b:
                    gaps.append((x, b))
                for ga, gb in gaps:
                    q = pos + (ga - a) if d > 0 else pos + (b - gb)
                    hks.insert(bisect_left(hks, ga), ga)
                    hiv[ga] = [gb, s, q, d]
                    heappush(hheap, (s, q, ga))
                    self.hn += gb - ga
            pos += b - a
        over = self.hn - self.host_capacity
        while over > 0 and hheap:
            s0, p0, a0 = hheap[0]
            e = hiv.get(a0)
            if e is None or e[1] != s0 or e[2] != p0:
                heappop(hheap)
                continue
            end, _, _, d = e
            n = end - a0
            if n <= over:
                heappop(hheap)
                del hiv[a0]
                del hks[bisect_left(hks, a0)]
                over -= n
                self.hn -= n
                continue
            if d < 0:  # drop the top
                e[0] = end - over
                e[2] = p0 + over
                heapreplace(hheap, (s0, p0 + over, a0))
            else:  # drop the bottom: the range now starts higher
                heappop(hheap)
                del hiv[a0]
                nb = a0 + over
                hks[bisect_left(hks, a0)] = nb
                hiv[nb] = [end, s0, p0 + over, d]
                heappush(hheap, (s0, p0 + over, nb))
            self.hn -= over
            over = 0
        if len(hheap) > 64 + 4 * len(hks):
            self.hheap = [(e[1], e[2], a) for a, e in hiv.items()]
            heapify(self.hheap)

    # -- request lifecycle -------------------------------------------------------------------
    def _pieces(self, a: int, b: int) -> list[int]:
        """Starts of the cached ranges inside ``[a, b)`` after cutting at ``a`` and ``b``."""
        self._split(a)
        self._split(b)
        ks = self.ks
        return ks[bisect_left(ks, a):bisect_left(ks, b)]

    def acquire(self, chain, m: int) -> None:
        """Pin the first ``m`` cached blocks for a running request."""
        if m <= 0:
            return
        iv = self.iv
        for a, b in as_chain(chain).runs(0, m):
            for k in self._pieces(a, b):
                e = iv[k]
                if e[1] == 0:
                    self.n_lru -= e[0] - k
                    e[2] = None
                e[1] += 1

    def load_from_host(self, chain, start: int, end: int) -> None:
        """Blocks ``start:end`` were hit in the host tier; they are now on the GPU (already allocated)."""
        if end > start:
            self.host_loaded_blocks += end - start
            self.store(chain, start, end)

    def store(self, chain, start: int, end: int, medium: str | None = "GPU") -> None:
        """Blocks ``start:end`` of ``chain`` are now full and hashed: cache them, pinned by their request.
        Blocks already cached (another request computed the same prefix meanwhile) are pinned instead
        and the duplicate block is returned to the pool."""
        if end <= start or not self.enabled:
            return
        chain = as_chain(chain)
        iv, ks = self.iv, self.ks
        new: list[tuple[int, int]] = []
        dup = 0
        for a, b in chain.runs(start, end):
            x = a
            for k in self._pieces(a, b):
                if k > x:
                    new.append((x, k))
                e = iv[k]
                if e[1] == 0:
                    self.n_lru -= e[0] - k
                    e[2] = None
                e[1] += 1
                dup += e[0] - k
                x = e[0]
            if x < b:
                new.append((x, b))
        self.used -= dup
        if not new:
            return
        n_new = 0
        for a, b in new:
            ks.insert(bisect_left(ks, a), a)
            iv[a] = [b, 1, None, 0]
            n_new += b - a
        self.n_cached += n_new
        self.stored_blocks += n_new
        if self.on_event is not None and medium is not None:
            ids: list[int] = []
            for a, b in new:
                ids.extend(range(a, b))
            self.on_event("BlockStored", ids, medium, chain.at(start - 1) if start > 0 else None)
        if self.host_capacity and self.write_through:
            self._host_add([(a, b, 1) for a, b in new], refresh=False)

    def release(self, chain, n_cached: int, n_uncached: int) -> None:
        """A request finished or was preempted: unpin its ``n_cached`` leading blocks (tail first into
        the LRU, so the head of a prefix outlives its tail) and free its ``n_uncached`` other blocks."""
        self.used -= n_uncached
        if n_cached <= 0:
            return
        iv = self.iv
        pieces: list[int] = []
        for a, b in as_chain(chain).runs(0, n_cached):
            pieces.extend(self._pieces(a, b))
        self.gseq += 1
        g = self.gseq
        p = 0
        heap = self.heap
        for k in reversed(pieces):
            e = iv[k]
            n = e[0] - k
            e[1] -= 1
            if e[1] == 0:
                e[2] = g
                e[3] = p
                heappush(heap, (g, p, k))
                self.n_lru += n
            p += n


__all__ = ["Chain", "KVCache"]
