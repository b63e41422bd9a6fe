"""SQL functions agentobs adds to its DuckDB connections (and how the ClickHouse backend spells them).

``agentobs_cumsum(DOUBLE[]) -> DOUBLE[]``: the running sum of a list, ``[a, b, c] → [a, a+b, a+b+c]``; NULL
elements add nothing (as ``sum`` skips them), a NULL list gives NULL. The ITL queries (the ``itl_tail`` metric,
the long-prefill ITL finding) place each inter-token gap in time: gap i of a call ends at
``t1 + Σ_{j≤i} itl_j``. DuckDB has no list running sum, and the window that computed it over the unnested gaps
(``sum(g) OVER (PARTITION BY call ORDER BY i ROWS UNBOUNDED PRECEDING)``) partitioned and sorted every gap, the
largest single step of those queries. The lists are already in order, so one vectorized pass does it (NumPy
over the Arrow list's values; docs/metrics.md, "Round 8"); the sum is taken left to right, so it is the same
every run (the parallel window's was not, in the last bits).
ClickHouse has it built in: the dialect maps it to ``arrayCumSum``.

Registered by ``agentobs.store.db.connect``/``sandboxed`` and by a metric run on any DuckDB connection it is
given (``ensure``), so the SQL a finding shows as evidence runs as shown in the console and in ``agentobs sql``.
"""

from __future__ import annotations

import duckdb
from duckdb.func import PythonUDFType

CUMSUM = "agentobs_cumsum"


def _cumsum(arr):
    import numpy as np
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    off = np.asarray(arr.offsets, dtype=np.int64)
    # the values this (possibly sliced) list array covers, NULL elements as 0
    vals = np.asarray(arr.values.fill_null(0.0), dtype=np.float64)[off[0]:off[-1]]
    off = off - off[0]
    run = np.cumsum(vals)
    # each list restarts: subtract the running sum reached before its first element
    before = np.concatenate(([0.0], run))[off[:-1]]
    out = run - np.repeat(before, np.diff(off))
    return pa.ListArray.from_arrays(pa.array(off, pa.int32()), pa.array(out, pa.float64()), mask=arr.is_null())


def ensure(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Register agentobs' SQL functions on ``con`` unless they are there already; returns ``con``. (It tries the
    registration rather than asking ``duckdb_functions()`` first, which is slow enough to matter: the console
    opens a connection per listing.)"""
    try:
        con.create_function(CUMSUM, _cumsum, [duckdb.list_type("DOUBLE")], duckdb.list_type("DOUBLE"),
                            type=PythonUDFType.ARROW, side_effects=False)
    except (duckdb.NotImplementedException, duckdb.CatalogException) as e:
        # a second registration: on this connection ("already created"), or on another open connection to the same
        # file, which shares this one's catalog ("already exists"; it stays usable after that one closes)
        if "already" not in str(e):
            raise
    return con
