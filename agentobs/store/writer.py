"""The single batching writer.

Every collector and importer hands Arrow tables to one ``Writer``. One thread owns the write
cursor; it concatenates pending tables per destination and commits them in one transaction with
``INSERT ... BY NAME``; the primary keys make re-imports idempotent. ``spans`` has no primary key
(appends stay flat as the store grows): ``insert_spans`` skips spans already stored instead.
``submit`` returns a ``Ticket``; ``ticket.wait()`` returns once the rows are committed, which is
what lets a receiver acknowledge only durable spans. The writer holds a small batch up to ``flush_s`` for
more rows; a caller that waits on a ticket asks the writer to commit what it holds at once (whoever waits
for its rows commits them), so an importer waiting at the end of its files does not idle out ``flush_s``.

Duplicates are rare (an OTLP retry, a re-imported file), and DuckDB's ``INSERT OR IGNORE`` costs
well more than a plain ``INSERT`` into a table with a primary key (bench/ingest_otlp.py,
docs/collectors.md). So a commit first tries a plain ``INSERT``; when a key is already there the
transaction is rolled back whole and redone with ``INSERT OR IGNORE``, and that table keeps using
``INSERT OR IGNORE`` for the next ``IGNORE_AFTER_CONFLICT`` commits (a re-import is mostly
duplicates: trying plain first would waste the attempt every time).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import StoreError
from . import segments

TABLES = ("spans", "metric_samples", "scrapes", "engine_config", "kv_events", "ingest_log")
APPEND_ONLY = {"ingest_log", "spans"}  # no primary key: plain INSERT (spans: insert_spans)
IGNORE_AFTER_CONFLICT = 32  # commits a table goes straight to INSERT OR IGNORE after a duplicate key


@dataclass
class Ticket:
    rows: int
    table: str = ""
    _done: threading.Event = field(default_factory=threading.Event)
    inserted: int = 0
    error: BaseException | None = None
    _urge: Callable[[], None] | None = field(default=None, repr=False)  # the writer: commit what you hold now

    def wait(self, timeout: float | None = None) -> int:
        if self._urge is not None and not self._done.is_set():
            self._urge()  # a caller waits for these rows: no reason left to hold them for more
            self._urge = None
        if not self._done.wait(timeout):
            raise TimeoutError("write not committed in time")
        if self.error is not None:
            raise StoreError(f"write failed: {self.error}") from self.error
        return self.inserted


@dataclass
class WriterStats:
    batches: int = 0
    rows_submitted: int = 0
    rows_inserted: int = 0
    conflict_retries: int = 0  # commits redone with INSERT OR IGNORE after a duplicate key
    last_commit_s: float = 0.0
    commit_seconds_total: float = 0.0


class Writer:
    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        batch_rows: int = 50_000,
        flush_s: float = 1.0,
        on_commit=None,
    ):
        self._cur = con.cursor()
        self.batch_rows = batch_rows
        self.flush_s = flush_s
        self.on_commit = on_commit  # callable(seconds, rows) for health metrics
        self.stats = WriterStats()
        self._q: queue.Queue = queue.Queue()
        self._closed = False
        self._ignore_left: dict[str, int] = {}  # table -> commits left with INSERT OR IGNORE
        self._thread = threading.Thread(target=self._run, name="agentobs-writer", daemon=True)
        self._thread.start()

    # -- public API -------------------------------------------------------------------------
    def submit(self, table: str, data: pa.Table) -> Ticket:
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}")
        if self._closed:
            raise StoreError("writer is closed")
        t = Ticket(rows=data.num_rows, table=table, _urge=self._urge)
        self._q.put((table, data, t))
        return t

    def write(self, table: str, data: pa.Table) -> int:
        """Submit and wait for the commit (made at once: ``Ticket.wait``); returns rows actually inserted
        (duplicates ignored)."""
        return self.submit(table, data).wait()

    def _urge(self) -> None:
        """Commit what the writer holds now (a ticket is waited on); does not wait itself."""
        self._q.put(("__urge__", None, None))

    def flush(self) -> None:
        t = Ticket(rows=0)
        self._q.put(("__flush__", None, t))
        t.wait()

    def pending(self) -> int:
        return self._q.qsize()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._q.put(None)
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        pending: dict[str, list[pa.Table]] = defaultdict(list)
        tickets: list[Ticket] = []
        rows = 0
        first_at = None
        while True:
            timeout = None
            if first_at is not None:
                timeout = max(0.0, self.flush_s - (time.monotonic() - first_at))
            try:
                item = self._q.get(timeout=timeout)
            except queue.Empty:
                item = "__timeout__"
            stop = item is None
            force = stop or item == "__timeout__"
            if isinstance(item, tuple):
                table, data, ticket = item
                if table == "__flush__":
                    force = True
                    tickets.append(ticket)
                elif table == "__urge__":
                    force = True
                else:
                    if data.num_rows:
                        pending[table].append(data)
                        rows += data.num_rows
                    tickets.append(ticket)
                    if first_at is None:
                        first_at = time.monotonic()
                    # drain what is already queued before deciding to commit
                    if rows < self.batch_rows and not self._q.empty():
                        continue
                    force = force or rows >= self.batch_rows or self.flush_s == 0
            if force and tickets:
                self._commit(pending, tickets)
                pending = defaultdict(list)
                tickets = []
                rows = 0
                first_at = None
            if stop:
                return

    def _commit(self, pending: dict[str, list[pa.Table]], tickets: list[Ticket]) -> None:
        t0 = time.perf_counter()
        per_table: dict[str, int] = {}
        err: BaseException | None = None
        ignore = {table for table, left in self._ignore_left.items() if left > 0}
        for table in ignore:
            self._ignore_left[table] -= 1
        try:
            batches = {table: _concat(parts) for table, parts in pending.items()}
            while True:
                try:
                    per_table = self._insert(batches, ignore)
                    break
                except _Conflict as c:
                    # a key is already stored (or twice in this batch): nothing of this transaction
                    # is kept; redo it with INSERT OR IGNORE for the table(s) that had the duplicate
                    self._rollback()
                    more = c.tables - ignore
                    if not more:  # not a duplicate key (e.g. NOT NULL): OR IGNORE cannot help
                        raise (c.__cause__ or c) from None
                    self.stats.conflict_retries += 1
                    ignore |= more
                    for table in more:
                        self._ignore_left[table] = IGNORE_AFTER_CONFLICT
        except BaseException as e:  # noqa: BLE001 - reported through every ticket
            err = e
            self._rollback()
        total = sum(per_table.values()) if err is None else 0
        dt = time.perf_counter() - t0
        self.stats.batches += 1
        self.stats.rows_submitted += sum(t.rows for t in tickets)
        self.stats.rows_inserted += total
        self.stats.last_commit_s = dt
        self.stats.commit_seconds_total += dt
        if self.on_commit:
            try:
                self.on_commit(dt, total)
            except Exception:  # noqa: BLE001 - metrics must never break writes
                pass
        # Each ticket learns how many of its rows were new. DuckDB reports one count per table and
        # batch; when several tickets of one table were merged, the new rows are credited to the
        # earliest tickets first (exact whenever a batch holds one ticket per table, or none or all
        # of the rows were duplicates).
        left = dict(per_table) if err is None else {}
        for t in tickets:
            t.error = err
            t.inserted = min(t.rows, left.get(t.table, 0))
            left[t.table] = left.get(t.table, 0) - t.inserted
            t._done.set()

    def _insert(self, batches: dict[str, pa.Table], ignore: set[str]) -> dict[str, int]:
        """One transaction: every table's batch, committed; new rows per table. A constraint error
        is raised as ``_Conflict`` naming the table (all of them when COMMIT raised it)."""
        cur = self._cur
        per_table = {}
        cur.execute("BEGIN")
        for table, batch in batches.items():
            if table == "spans":
                try:
                    per_table[table] = insert_spans(cur, batch)
                except BaseException:
                    self._rollback()
                    raise
                continue
            verb = "INSERT OR IGNORE" if table in ignore and table not in APPEND_ONLY else "INSERT"
            cur.register("_agentobs_batch", batch)
            try:
                res = cur.execute(f"{verb} INTO {table} BY NAME SELECT * FROM _agentobs_batch").fetchone()
            except duckdb.ConstraintException as e:
                self._rollback()  # the aborted transaction refuses even the unregister below
                raise _Conflict({table} - APPEND_ONLY) from e
            except BaseException:
                self._rollback()
                raise
            finally:
                cur.unregister("_agentobs_batch")
            per_table[table] = int(res[0]) if res else 0
        try:
            cur.execute("COMMIT")
        except duckdb.ConstraintException as e:
            raise _Conflict(set(batches) - APPEND_ONLY) from e
        return per_table

    def _rollback(self) -> None:
        try:
            self._cur.execute("ROLLBACK")
        except duckdb.Error:
            pass  # no transaction open (BEGIN itself failed)


def insert_spans(cur: duckdb.DuckDBPyConnection, batch: pa.Table, unique: bool = False) -> int:
    """Append ``batch`` to ``spans_part`` (the table part of ``spans``: agentobs/store/segments.py) inside the
    caller's transaction, skipping a span (trace_id, span_id) already stored there, in its Parquet files, or
    repeated in the batch; returns the rows inserted. ``unique``: the caller guarantees no
    span is repeated in the batch (the loader: ``loader.first_of_each_span``), so that check is skipped.

    A span sent again has its start time again, so the stored side is read only where ``start_ns`` lies in
    the batch's range: DuckDB skips the row groups outside it by their min/max, and spans arrive roughly in
    time order, so the check reads a few recent row groups however large the store (bench/ingest_otlp.py)."""
    if not batch.num_rows:
        return 0
    mm = pc.min_max(batch["start_ns"])
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    window = f"s.start_ns BETWEEN {int(lo)} AND {int(hi)}" if lo is not None else "s.start_ns IS NULL"
    cur.register("_agentobs_spans", batch)
    try:
        res = cur.execute(
            "INSERT INTO spans_part BY NAME SELECT * FROM _agentobs_spans b "
            f"WHERE NOT EXISTS (SELECT 1 FROM spans_part s WHERE {window} "
            "AND s.trace_id = b.trace_id AND s.span_id = b.span_id) "
            f"{segments.not_in_files_sql(cur, 'b', lo, hi)} "  # nor in a Parquet part (span_store = segments)
            + ("" if unique else "QUALIFY row_number() OVER (PARTITION BY b.trace_id, b.span_id) = 1")).fetchone()
    finally:
        cur.unregister("_agentobs_spans")
    return int(res[0]) if res else 0


class _Conflict(Exception):
    def __init__(self, tables: set[str]):
        super().__init__(", ".join(sorted(tables)))
        self.tables = tables


def _concat(parts: list[pa.Table]) -> pa.Table:
    if len(parts) == 1:
        return parts[0]
    # one contiguous chunk: DuckDB inserts from a few large chunks faster than from many 512-row receiver
    # batches (docs/collectors.md, "Writer: one contiguous chunk per commit")
    return pa.concat_tables(parts, promote_options="default").combine_chunks()
