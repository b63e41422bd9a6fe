"""Block-hash chains as runs of consecutive ids, and sorted id-range maps.

Block ids are ints handed out in runs (``IdAlloc.take_run``): a prompt's new blocks at one turn, a
task type's shared system prefix, a call's output blocks. A chain is the list of those runs, so a
20k-token prompt (1,250 blocks of 16) is ~20 runs and every cache operation costs O(runs), not
O(blocks). Ids are prefix-chained (equal id ⇒ equal prefix), so wherever two chains hold id ``x + 1``
it follows ``x`` in both, and a range of consecutive ids is a piece of one prefix path.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any


class Chain:
    """Positions ``0 … len-1`` → block ids, as runs: run ``k`` holds positions
    ``ends[k-1] … ends[k]-1`` with ids ``starts[k], starts[k]+1, …``. Append-only (a call keeps the
    shared chain and its own block count, as with a list)."""

    __slots__ = ("starts", "ends")

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []

    @classmethod
    def from_ids(cls, ids) -> Chain:
        c = cls()
        for h in ids:
            c.append_run(h, 1)
        return c

    def append_run(self, start: int, n: int) -> None:
        if n <= 0:
            return
        st, en = self.starts, self.ends
        if st:
            prev = en[-2] if len(en) > 1 else 0
            if st[-1] + (en[-1] - prev) == start:  # continues the last run
                en[-1] += n
                return
            en.append(en[-1] + n)
        else:
            en.append(n)
        st.append(start)

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def runs(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Id ranges ``[a, b)`` covering positions ``lo … hi-1``, in chain order."""
        ends, starts = self.ends, self.starts
        hi = min(hi, ends[-1] if ends else 0)
        out: list[tuple[int, int]] = []
        if lo >= hi:
            return out
        k = bisect_right(ends, lo)
        prev = ends[k - 1] if k else 0
        while lo < hi:
            e = ends[k]
            a = starts[k] + (lo - prev)
            m = (e if e < hi else hi) - lo
            out.append((a, a + m))
            lo += m
            prev = e
            k += 1
        return out

    def at(self, i: int) -> int:
        k = bisect_right(self.ends, i)
        return self.starts[k] + i - (self.ends[k - 1] if k else 0)

    def ids(self, lo: int = 0, hi: int | None = None) -> list[int]:
        out: list[int] = []
        for a, b in self.runs(lo, len(self) if hi is None else hi):
            out.extend(range(a, b))
        return out

    def prefix(self, n: int) -> Chain:
        c = Chain()
        for a, b in self.runs(0, n):
            c.append_run(a, b - a)
        return c

    def __getitem__(self, i):
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                raise ValueError("Chain slices have step 1")
            return self.ids(lo, hi)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.at(i)

    def __iter__(self):
        return iter(self.ids())

    def __repr__(self) -> str:
        return f"Chain({self.runs(0, len(self))})"


def as_chain(x) -> Chain:
    return x if isinstance(x, Chain) else Chain.from_ids(x)


class RangeMap:
    """Disjoint id ranges ``[a, b)`` → a value, sorted by start (a list of starts + a dict)."""

    __slots__ = ("ks", "iv")

    def __init__(self):
        self.ks: list[int] = []
        self.iv: dict[int, list] = {}   # start -> [end, value]

    def _split(self, x: int) -> None:
        ks = self.ks
        i = bisect_right(ks, x) - 1
        if i < 0:
            return
        a = ks[i]
        e = self.iv[a]
        if a < x < e[0]:
            self.iv[x] = [e[0], e[1]]
            e[0] = x
            ks.insert(i + 1, x)

    def pop_range(self, a: int, b: int) -> list[tuple[int, int, Any]]:
        """Remove and return the (clipped) pieces inside ``[a, b)``."""
        if not self.ks:
            return []
        self._split(a)
        self._split(b)
        ks, iv = self.ks, self.iv
        i, j = bisect_left(ks, a), bisect_left(ks, b)
        if i == j:
            return []
        out = []
        for k in ks[i:j]:
            e = iv.pop(k)
            out.append((k, e[0], e[1]))
        del ks[i:j]
        return out

    def assign(self, a: int, b: int, value) -> None:
        if b <= a:
            return
        self.pop_range(a, b)
        ks = self.ks
        ks.insert(bisect_left(ks, a), a)
        self.iv[a] = [b, value]

    def covered_prefix(self, runs) -> int:
        """How many leading ids of ``runs`` (id ranges in chain order) lie in the map."""
        return lead(self.ks, self.iv, runs)

    def __len__(self) -> int:
        return len(self.ks)


def lead(ks: list[int], iv: dict, runs) -> int:
    """Leading ids of ``runs`` covered by the ranges ``ks``/``iv`` (``iv[start][0]`` = end)."""
    c = 0
    for a, b in runs:
        x = a
        while x < b:
            i = bisect_right(ks, x) - 1
            if i < 0:
                break
            e = iv[ks[i]][0]
            if e <= x:
                break
            x = e
        if x < b:
            return c + x - a
        c += b - a
    return c
