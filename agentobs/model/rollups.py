"""Rollups and quantile sketches of the maintained session model (agentobs.model.state), kept with it.

- ``model_rollup_task``: per hour (of the call's start) × task × session × branch × instance (with the task type,
  model and tenant): the sums ``task_cost`` reads — calls, retries, failures, tokens (P, C, P − C, O, X, computed,
  computed on the final path, wasted, control-plane), and the token sums the cost columns are linear in (so the $
  are computed at read time from the cost model, which is a setting: changing it needs no rebuild). Any grouping of
  task_cost (task, task type, session, model, instance) and any hour-aligned window reads it.
- ``model_rollup_session``: per session, the union of its call intervals and its life span (``duty_cycle`` by
  session over the whole store reads it).
- ``model_sketch_hour``: per hour × model × instance × series × gap bucket × hit class, a mergeable log-bucket
  quantile sketch (DDSketch's mapping: bin i holds values in (γ^(i−1), γ^i], γ = (1 + α)/(1 − α)) of the latency
  series: ``ttft`` (calls 2…n with a hit class: turn_resume_ttft's population, by gap bucket and hit class),
  ``e2e`` (end − start of every call), ``itl`` (every inter-token gap). Sketches of any hours and keys merge by
  adding counts; a quantile read from one is within a relative error α of the exact one (``quantiles``:
  ``rel_err`` is stated beside each value).

Both are maintained by deltas: a refresh subtracts the rows of the sessions it re-derives and adds their new rows
(integer sums and counts: exact), so their cost follows the touched sessions, not the store.
"""

from __future__ import annotations

import math

import duckdb

ALPHA = 0.01  # the sketch's relative error bound
GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LOG_GAMMA = math.log(GAMMA)
TASK = "model_rollup_task"
SKETCH = "model_sketch_hour"
SESSION = "model_rollup_session"
HOUR = "model_rollup_hour"
MINUTE = "model_rollup_minute"
TABLES = (TASK, SKETCH, SESSION, HOUR, MINUTE)
# values at or below this are counted in one bin (-2^31) read back as 0 (a zero TTFT, an empty ITL gap)
_TINY = 1e-9
_ZERO_BIN = -(2 ** 31)

# first_s (the key's first call start): a key belongs to one unit (session, or call without one) and a refresh
# replaces units whole, so a key's old row is subtracted to nothing and its new one added (exact, as for a sum)
_TASK_KEYS = ("hour", "task_id", "session_id", "bk", "instance", "task_type", "model", "tenant", "first_s")
_TASK_SUMS = ("calls", "retries", "failed_calls", "prompt_tokens", "cached_tokens", "computed_prompt_tokens",
              "output_tokens", "reprefill_tokens", "computed", "computed_final", "wasted_tokens", "ctrl_num",
              "ctrl_den", "ctrl_calls", "cached_p", "output_p", "n_p", "n_c", "n_o", "n_x", "n_final", "n_ctrl_den",
              "p_known", "n_p_known", "c_reuse", "n_c_reuse", "r_eff_c", "n_r_eff_c", "resets", "c_unknown",
              "follow_ups", "exact_calls")

# the rollup of a relation of model_calls rows; every value an integer and never NULL (exact under deltas: a sum
# over no values is 0 here, and the count beside it, n_*, tells the reader that SQL's sum would be NULL)
_TASK_SQL = """
SELECT CAST(floor(start_s / 3600) AS BIGINT) AS hour, task_id, session_id,
       coalesce(session_id, call_id) || '/' || branch AS bk, instance, task_type, model, tenant,
       min(start_s) AS first_s,
       count(*) AS calls,
       count(*) FILTER (WHERE is_retry) AS retries,
       count(*) FILTER (WHERE status = 'error') AS failed_calls,
       coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
       coalesce(sum(cached_tokens), 0) AS cached_tokens,
       coalesce(sum(prompt_tokens - coalesce(cached_tokens, 0)), 0) AS computed_prompt_tokens,
       coalesce(sum(output_tokens), 0) AS output_tokens,
       coalesce(sum(reprefill_tokens), 0) AS reprefill_tokens,
       coalesce(sum(prompt_tokens - coalesce(cached_tokens, 0) + coalesce(output_tokens, 0)), 0) AS computed,
       coalesce(sum(prompt_tokens - coalesce(cached_tokens, 0) + coalesce(output_tokens, 0))
                FILTER (WHERE is_last_attempt AND status = 'ok'), 0) AS computed_final,
       coalesce(sum(coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0)) FILTER (WHERE status = 'error'), 0)
           AS wasted_tokens,
       coalesce(sum(coalesce(system_tokens, 0) + coalesce(tool_def_tokens, 0))
                FILTER (WHERE system_tokens IS NOT NULL OR tool_def_tokens IS NOT NULL), 0) AS ctrl_num,
       coalesce(sum(prompt_tokens) FILTER (WHERE system_tokens IS NOT NULL OR tool_def_tokens IS NOT NULL), 0)
           AS ctrl_den,
       count(*) FILTER (WHERE system_tokens IS NOT NULL OR tool_def_tokens IS NOT NULL) AS ctrl_calls,
       -- the cost columns are NULL where P is: their token sums count only those calls
       coalesce(sum(coalesce(cached_tokens, 0)) FILTER (WHERE prompt_tokens IS NOT NULL), 0) AS cached_p,
       coalesce(sum(coalesce(output_tokens, 0)) FILTER (WHERE prompt_tokens IS NOT NULL), 0) AS output_p,
       count(prompt_tokens) AS n_p, count(cached_tokens) AS n_c, count(output_tokens) AS n_o,
       count(reprefill_tokens) AS n_x,
       count(prompt_tokens) FILTER (WHERE is_last_attempt AND status = 'ok') AS n_final,
       count(prompt_tokens) FILTER (WHERE system_tokens IS NOT NULL OR tool_def_tokens IS NOT NULL) AS n_ctrl_den,
       -- reuse's per-session sums (metrics/rollup_reuse.sql)
       coalesce(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0) AS p_known,
       count(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL) AS n_p_known,
       coalesce(sum(cached_tokens) FILTER (WHERE reusable_tokens_eff IS NOT NULL), 0) AS c_reuse,
       count(cached_tokens) FILTER (WHERE reusable_tokens_eff IS NOT NULL) AS n_c_reuse,
       coalesce(sum(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL), 0) AS r_eff_c,
       count(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL) AS n_r_eff_c,
       count(*) FILTER (WHERE context_reset) AS resets,
       count(*) FILTER (WHERE cached_tokens IS NULL) AS c_unknown,
       count(*) FILTER (WHERE prev_call_id IS NOT NULL) AS follow_ups,
       count(*) FILTER (WHERE mode = 'exact' AND prev_call_id IS NOT NULL) AS exact_calls
FROM {rel}
GROUP BY ALL
"""


def _bin(x: str) -> str:
    return (f"CASE WHEN {x} > {_TINY!r} THEN CAST(ceil(ln({x}) / {_LOG_GAMMA!r}) AS INTEGER) "
            f"ELSE {_ZERO_BIN} END")


_SKETCH_SQL = """
SELECT hour, model, instance, task_type, tenant, series, gap_lo, hit_class, bin, count(*) AS n FROM (
    SELECT CAST(floor(start_s / 3600) AS BIGINT) AS hour, model, instance, task_type, tenant, 'ttft' AS series,
           CASE WHEN gap_before_s < 1 THEN 0 WHEN gap_before_s < 5 THEN 1 WHEN gap_before_s < 30 THEN 5
                WHEN gap_before_s < 120 THEN 30 WHEN gap_before_s < 600 THEN 120 ELSE 600 END AS gap_lo,
           hit_class, {ttft_bin} AS bin
    FROM {rel} WHERE prev_call_id IS NOT NULL AND hit_class IS NOT NULL AND ttft_s IS NOT NULL
    UNION ALL
    SELECT CAST(floor(start_s / 3600) AS BIGINT), model, instance, task_type, tenant, 'e2e', NULL, NULL, {e2e_bin}
    FROM {rel} WHERE end_s IS NOT NULL AND start_s IS NOT NULL
    UNION ALL
    SELECT CAST(floor(start_s / 3600) AS BIGINT), model, instance, task_type, tenant, 'gap', NULL, NULL, {gap_bin}
    FROM {rel} WHERE session_id IS NOT NULL AND gap_before_s IS NOT NULL
    UNION ALL
    SELECT hour, model, instance, task_type, tenant, 'itl', NULL, NULL, {itl_bin} FROM (
        SELECT CAST(floor(start_s / 3600) AS BIGINT) AS hour, model, instance, task_type, tenant, unnest(itl_ms) AS g
        FROM {rel} WHERE itl_ms IS NOT NULL)
    WHERE g IS NOT NULL
) GROUP BY ALL
"""


def _sketch_sql(rel: str) -> str:
    return _SKETCH_SQL.format(rel=rel, ttft_bin=_bin("ttft_s"), e2e_bin=_bin("end_s - start_s"), itl_bin=_bin("g"),
                              gap_bin=_bin("gap_before_s"))


_SKETCH_KEYS = ("hour", "model", "instance", "task_type", "tenant", "series", "gap_lo", "hit_class", "bin")
SERIES = ("ttft", "e2e", "itl", "gap")

# per hour × instance × the previous call's instance × model × task type × tenant × cause × mode × whether the call
# has a session: the counts and sums reprefill and idle_kv_rent read (agentobs/metrics/rollup_reprefill.sql,
# rollup_idle_kv_rent.sql). Integer sums as they are; the token-second sums (doubles per call) in whole
# micro-token-seconds (each call's value rounded to 1e-6 token-s: exact under deltas, within 1e-6 token-s per call
# of the per-call sum). The $ are priced at read time (the cost model is a setting). n_* count the non-NULL values
# beside each sum (a sum over none is 0 here, NULL in SQL).
_HOUR_KEYS = ("hour", "instance", "prev_key", "model", "task_type", "tenant", "cause", "mode", "sess")
CAUSE = ("coalesce(miss_cause, CASE WHEN session_id IS NULL THEN 'no_session' WHEN context_reset THEN 'context_reset' "
         "ELSE 'none' END)")


def _micro(x: str) -> str:
    return f"coalesce(sum(CAST(round(({x}) * 1e6) AS BIGINT)), 0)"


_HOUR_COLS = {  # column -> its aggregate over model_calls rows (calls first: a key with no calls left is dropped)
    "calls": "count(*)",
    "calls_with_reprefill": "count(*) FILTER (WHERE reprefill_tokens > 0)",
    "prompt_tokens": "coalesce(sum(prompt_tokens), 0)", "n_p": "count(prompt_tokens)",
    "cached_tokens": "coalesce(sum(cached_tokens), 0)", "n_c": "count(cached_tokens)",
    "r_eff_c": "coalesce(sum(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL), 0)",
    "n_r_eff_c": "count(reusable_tokens_eff) FILTER (WHERE cached_tokens IS NOT NULL)",
    "x": "coalesce(sum(reprefill_tokens), 0)", "n_x": "count(reprefill_tokens)",
    "x_low": "coalesce(sum(reprefill_low_tokens), 0)", "n_x_low": "count(reprefill_low_tokens)",
    "x_high": "coalesce(sum(reprefill_high_tokens), 0)", "n_x_high": "count(reprefill_high_tokens)",
    "computed_prompt_tokens": "coalesce(sum(prompt_tokens - coalesce(cached_tokens, 0)), 0)",
    "output_p": "coalesce(sum(coalesce(output_tokens, 0)) FILTER (WHERE prompt_tokens IS NOT NULL), 0)",
    "p_known": "coalesce(sum(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0)",
    "n_p_known": "count(prompt_tokens) FILTER (WHERE cached_tokens IS NOT NULL)",
    "c_reuse": "coalesce(sum(cached_tokens) FILTER (WHERE reusable_tokens_eff IS NOT NULL), 0)",
    "n_c_reuse": "count(cached_tokens) FILTER (WHERE reusable_tokens_eff IS NOT NULL)",
    "c_x": "coalesce(sum(cached_tokens) FILTER (WHERE reprefill_tokens IS NOT NULL), 0)",
    "n_c_x": "count(cached_tokens) FILTER (WHERE reprefill_tokens IS NOT NULL)",
    "pc_x": "coalesce(sum(prompt_tokens - cached_tokens) FILTER (WHERE reprefill_tokens IS NOT NULL), 0)",
    "n_pc_x": "count(prompt_tokens - cached_tokens) FILTER (WHERE reprefill_tokens IS NOT NULL)",
    # idle_kv_rent (its calls: those with a session, sess)
    "windows": "count(*) FILTER (WHERE prev_call_id IS NOT NULL)",
    "retained": "count(*) FILTER (WHERE window_outcome = 'retained')",
    "evicted": "count(*) FILTER (WHERE window_outcome = 'evicted')",
    "routed_away": "count(*) FILTER (WHERE window_outcome = 'routed_away')",
    "unknown": "count(*) FILTER (WHERE window_outcome = 'unknown')",
    "rent_paid_us": _micro("rent_paid_token_s"), "n_rent_paid": "count(rent_paid_token_s)",
    "rent_wasted_us": _micro("rent_wasted_token_s"), "n_rent_wasted": "count(rent_wasted_token_s)",
    "evicted_rent_unknown": "count(*) FILTER (WHERE window_outcome = 'evicted' AND rent_wasted_token_s IS NULL)",
    "evicted_while_idle": "count(*) FILTER (WHERE evict_phase = 'idle')",
    "evicted_while_queued": "count(*) FILTER (WHERE evict_phase = 'queued')",
    "abandoned": "count(*) FILTER (WHERE abandoned)",
    "open_sessions": "count(*) FILTER (WHERE is_last AND NOT abandoned)",
    "abandoned_kv_tokens": "coalesce(sum(abandon_kv_tokens), 0)", "n_abandoned_kv": "count(abandon_kv_tokens)",
    "abandoned_rent_us": _micro("abandon_rent_token_s"), "n_abandoned_rent": "count(abandon_rent_token_s)",
    "abandoned_still_resident": "count(*) FILTER (WHERE abandon_censored)",
    "running_kv_us": _micro("(coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0) / 2.0) * (end_s - start_s)"),
    "n_running": "count(end_s - start_s)",
    "kv_event_windows": "count(*) FILTER (WHERE rent_mode = 'kv_events')",
    "estimate_windows": "count(*) FILTER (WHERE rent_mode = 'estimate')",
}
_HOUR_SUMS = tuple(_HOUR_COLS)
_HOUR_SQL = (f"""
SELECT CAST(floor(start_s / 3600) AS BIGINT) AS hour, instance, coalesce(prev_instance, instance, '') AS prev_key,
       model, task_type, tenant, {CAUSE} AS cause, mode, session_id IS NOT NULL AS sess,
       """ + ",\n       ".join(f"{v} AS {k}" for k, v in _HOUR_COLS.items()) + """
FROM {rel}
GROUP BY ALL
""")


# per session (a unit the state re-derives whole, so it is replaced, not patched): the union of its call intervals
# (busy_s) and its life span, as duty_cycle computes them over a session's calls (metrics/defs/duty_cycle.sql);
# sessions with a zero life span are left out, as there
_SESSION_SQL = """
SELECT session_id, sum(greatest(end_s - greatest(start_s, coalesce(reach, start_s)), 0)) AS busy_s,
       max(end_s) - min(start_s) AS life_s, count(*) AS calls
FROM (SELECT session_id, start_s, end_s,
             max(end_s) OVER (PARTITION BY session_id ORDER BY start_s, end_s
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
      FROM {rel} WHERE session_id IS NOT NULL AND end_s >= start_s)
GROUP BY session_id
HAVING max(end_s) > min(start_s)
"""


# per minute × instance × model × task type × tenant: the pieces of capacity's time series (metrics/defs/capacity.sql)
# — each call's interval [t0, t2] and each retained idle window [t2(prev), t0] cut at minute boundaries, with their
# overlap (s) and KV token-seconds (as capacity computes them per bucket, in whole pico-units), and the re-prefill
# tokens of the calls starting in the minute. A bucket of a multiple of 60 s sums its minutes. ``pieces`` counts the
# rows (a piece of zero overlap at an interval's end is one too: capacity has its bucket row).
_MINUTE_KEYS = ("minute", "instance", "model", "task_type", "tenant")
# concurrency's (metrics/rollup_concurrency.sql): run_pieces (the calls' pieces: a bucket row exists where it has
# one), run_starts (calls starting in the minute) and run_at (calls running across its start: start < m·60 < end);
# the calls overlapping a bucket of whole minutes are those starting in it plus those running across its start
_MINUTE_SUMS = ("pieces", "req_ps", "run_kv_ps", "idle_kv_ps", "x", "run_pieces", "run_starts", "run_at")
_MINUTE_SQL = """
SELECT minute, instance, model, task_type, tenant, count(*) AS pieces,
       coalesce(sum(CAST(round(ov * 1e12) AS HUGEINT)) FILTER (WHERE part = 'run'), 0) AS req_ps,
       coalesce(sum(CAST(round(ov * kv * 1e12) AS HUGEINT)) FILTER (WHERE part = 'run'), 0) AS run_kv_ps,
       coalesce(sum(CAST(round(ov * kv * 1e12) AS HUGEINT)) FILTER (WHERE part = 'idle'), 0) AS idle_kv_ps,
       coalesce(sum(CAST(kv AS BIGINT)) FILTER (WHERE part = 'x'), 0) AS x,
       count(*) FILTER (WHERE part = 'run') AS run_pieces,
       count(*) FILTER (WHERE part = 'run' AND m0) AS run_starts,
       count(*) FILTER (WHERE part = 'run' AND start_s < minute * 60.0 AND end_s > minute * 60.0) AS run_at
FROM (
    SELECT m AS minute, instance, model, task_type, tenant, 'run' AS part,
           greatest(0, least(end_s, (m + 1) * 60.0) - greatest(start_s, m * 60.0)) AS ov, kv,
           m = CAST(floor(start_s / 60.0) AS BIGINT) AS m0, start_s, end_s
    FROM (SELECT instance, model, task_type, tenant, start_s, end_s,
                 coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0) / 2.0 AS kv,
                 unnest(generate_series(CAST(floor(start_s / 60.0) AS BIGINT), CAST(floor(end_s / 60.0) AS BIGINT))) AS m
          FROM {rel} WHERE end_s > start_s)
    UNION ALL
    SELECT m, instance, model, task_type, tenant, 'idle',
           greatest(0, least(b, (m + 1) * 60.0) - greatest(a, m * 60.0)), kv, NULL, NULL, NULL
    FROM (SELECT instance, model, task_type, tenant, start_s - gap_before_s AS a, start_s AS b, kv_tokens_before AS kv,
                 unnest(generate_series(CAST(floor((start_s - gap_before_s) / 60.0) AS BIGINT),
                                        CAST(floor(start_s / 60.0) AS BIGINT))) AS m
          FROM {rel} WHERE window_outcome = 'retained' AND gap_before_s > 0)
    UNION ALL
    SELECT CAST(floor(start_s / 60.0) AS BIGINT), instance, model, task_type, tenant, 'x', NULL, reprefill_tokens,
           NULL, NULL, NULL
    FROM {rel} WHERE reprefill_tokens > 0
)
GROUP BY ALL
"""


def _keyed(sql: str, keys: tuple) -> str:
    """``sql``'s rows with ``k``, a hash of the key columns: deltas find the stored rows of a key by an equality join
    on it (a collision only makes a row of another key be read and written back unchanged: the rows are regrouped
    by the key columns themselves)."""
    return f"SELECT hash({', '.join(keys)}) AS k, * FROM ({sql})"


def rebuild(cur: duckdb.DuckDBPyConnection, table: str) -> None:
    """Both made whole from ``table`` (model_calls), inside the caller's transaction."""
    cur.execute(f"CREATE OR REPLACE TABLE {TASK} AS {_keyed(_TASK_SQL.format(rel=table), _TASK_KEYS)}")
    cur.execute(f"CREATE OR REPLACE TABLE {SKETCH} AS {_keyed(_sketch_sql(table), _SKETCH_KEYS)}")
    cur.execute(f"CREATE OR REPLACE TABLE {SESSION} AS {_SESSION_SQL.format(rel=table)}")
    cur.execute(f"CREATE OR REPLACE TABLE {HOUR} AS {_keyed(_HOUR_SQL.replace('{rel}', table), _HOUR_KEYS)}")
    cur.execute(f"CREATE OR REPLACE TABLE {MINUTE} AS {_keyed(_MINUTE_SQL.replace('{rel}', table), _MINUTE_KEYS)}")


def apply_delta(cur: duckdb.DuckDBPyConnection, old: str, new: str) -> None:
    """Subtract the rollups of the rows in ``old`` (removed from model_calls) and add those of ``new`` (inserted);
    the sessions of either are replaced whole (``new`` holds every call of each session it has)."""
    _delta(cur, TASK, _TASK_KEYS, _TASK_SUMS, _TASK_SQL.format(rel=old), _TASK_SQL.format(rel=new))
    _delta(cur, SKETCH, _SKETCH_KEYS, ("n",), _sketch_sql(old), _sketch_sql(new))
    _delta(cur, HOUR, _HOUR_KEYS, _HOUR_SUMS, _HOUR_SQL.replace("{rel}", old), _HOUR_SQL.replace("{rel}", new))
    _delta(cur, MINUTE, _MINUTE_KEYS, _MINUTE_SUMS, _MINUTE_SQL.replace("{rel}", old),
           _MINUTE_SQL.replace("{rel}", new))
    # a session has a row only when it had stored calls: those of ``old`` (a session first seen in ``new`` has none
    # to remove, so the scan is skipped when ``old`` has no session)
    if cur.execute(f"SELECT count(session_id) FROM {old}").fetchall()[0][0]:
        cur.execute(f"DELETE FROM {SESSION} WHERE session_id IN (SELECT session_id FROM {old})")
    cur.execute(f"INSERT INTO {SESSION} {_SESSION_SQL.format(rel=new)}")


def _delta(cur, table: str, keys: tuple, sums: tuple, old_sql: str, new_sql: str) -> None:
    k = ", ".join(keys)
    neg = ", ".join(f"-{c} AS {c}" for c in sums)
    pos = ", ".join(sums)
    total = ", ".join(f"CAST(sum({c}) AS HUGEINT) AS {c}" for c in sums)
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE roll_d AS SELECT hash({k}) AS k, * FROM (
        SELECT {k}, {total} FROM (SELECT {k}, {pos} FROM ({new_sql}) UNION ALL SELECT {k}, {neg} FROM ({old_sql}))
        GROUP BY ALL)""")
    # the stored rows of the changed keys (by row id), with the deltas added; then they replace those rows
    cur.execute(f"CREATE OR REPLACE TEMP TABLE roll_r AS SELECT rowid AS r FROM {table} "
                "WHERE k IN (SELECT k FROM roll_d)")
    cur.execute(f"""CREATE OR REPLACE TEMP TABLE roll_m AS SELECT hash({k}) AS k, * FROM (
        SELECT {k}, {total} FROM (
            SELECT {k}, {pos} FROM {table} WHERE rowid IN (SELECT r FROM roll_r)
            UNION ALL SELECT {k}, {pos} FROM roll_d)
        GROUP BY ALL)""")
    cur.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT r FROM roll_r)")
    first = sums[0]  # calls / n: a key with none left is dropped
    cur.execute(f"INSERT INTO {table} BY NAME SELECT * FROM roll_m WHERE {first} <> 0")
    for t in ("roll_d", "roll_r", "roll_m"):
        cur.execute(f"DROP TABLE {t}")


def hour_aligned(since: float | None, until: float | None) -> bool:
    """Whether a window is a union of whole hours (open ends count): what the hour rollups can serve."""
    return all(t is None or (math.isfinite(t) and t % 3600 == 0) for t in (since, until))


def _bin_value_sql(b: str) -> str:
    """The value sketch bin ``b`` stands for: 2γ^b/(γ + 1), within α of every value in (γ^(b−1), γ^b] (the zero bin:
    0)."""
    return f"CASE WHEN {b} = {_ZERO_BIN} THEN 0.0 ELSE 2 * pow({GAMMA!r}, {b}) / {GAMMA + 1!r} END"


def quantiles_sql(rel: str, part: tuple[str, ...], qs: dict[str, float]) -> str:
    """A SELECT of ``part``, ``n`` (the values counted) and, per ``name: q`` of ``qs``, the q-quantile of the merged
    sketch ``rel`` (columns ``part``, ``bin``, ``n``: bins of one partition may repeat), read as DuckDB's
    ``quantile_cont`` reads values: at h = q·(n − 1), the values of ranks floor(h) and ceil(h) interpolated. Each
    rank's value is its bin's (within α of the value there), so the result is within α of ``quantile_cont`` of
    the values themselves (an interpolation between two values, each within α)."""
    cols = "".join(f"{c}, " for c in part)
    over = f"PARTITION BY {', '.join(part)} " if part else ""
    inner, outer = [], []
    for name, q in qs.items():
        h = f"{float(q)!r} * (total - 1)"
        inner.append(f"min(bin) FILTER (WHERE cum > floor({h})) AS {name}_lo, "
                     f"min(bin) FILTER (WHERE cum > ceil({h})) AS {name}_hi")
        lo, hi = _bin_value_sql(f"{name}_lo"), _bin_value_sql(f"{name}_hi")
        outer.append(f"{lo} + ({float(q)!r} * (n - 1) - floor({float(q)!r} * (n - 1))) * (({hi}) - ({lo})) AS {name}")
    return f"""SELECT {cols}CAST(n AS BIGINT) AS n, {', '.join(outer)} FROM (
    SELECT {cols}any_value(total) AS n, {', '.join(inner)}
    FROM (SELECT {cols}bin, sum(n) OVER ({over}ORDER BY bin ROWS UNBOUNDED PRECEDING) AS cum,
                 sum(n) OVER ({over.strip()}) AS total
          FROM {rel})
    GROUP BY ALL)"""


SKETCH_COLUMNS = ("model", "instance", "task_type", "tenant", "gap_lo", "hit_class")


def quantiles(con, series: str, qs=(0.5, 0.9, 0.99), since: float | None = None, until: float | None = None,
              by: str | None = None, where: dict | None = None) -> list[dict]:
    """Quantiles of a latency series (``ttft``, ``e2e``, ``itl``, ``gap``) from the hourly sketches, merged over the
    hours of [since, until) (hour-aligned) and per ``by`` (one of SKETCH_COLUMNS, or None for one row). ``where``:
    equality filters on those columns. Each row: the group, ``n`` and per q ``p<q>`` with ``rel_err`` (the bound α:
    the exact quantile x — DuckDB's quantile_cont of the same values — satisfies |p − x| ≤ α·x)."""
    if series not in SERIES:
        raise ValueError(f"no sketch series {series!r}: {', '.join(SERIES)}")
    if not hour_aligned(since, until):
        raise ValueError("the sketches are hourly: since and until must be whole hours (or open)")
    cols = SKETCH_COLUMNS
    if by is not None and by not in cols:
        raise ValueError(f"cannot group sketches by {by!r}: one of {', '.join(cols)}")
    preds: list[str] = ["series = $series"]
    params: dict[str, object] = {"series": series}
    if since is not None:
        preds.append("hour >= $h0")
        params["h0"] = int(since // 3600)
    if until is not None:
        preds.append("hour < $h1")
        params["h1"] = int(until // 3600)
    for i, (c, v) in enumerate((where or {}).items()):
        if c not in cols:
            raise ValueError(f"cannot filter sketches on {c!r}: one of {', '.join(cols)}")
        preds.append(f"{c} = $w{i}")
        params[f"w{i}"] = v
    grp = by if by is not None else "NULL"
    names = {f"q{i}": q for i, q in enumerate(qs)}
    sql = (f"WITH m AS (SELECT {grp} AS grp, bin, sum(n) AS n FROM {SKETCH} WHERE {' AND '.join(preds)} "
           f"GROUP BY ALL) {quantiles_sql('m', ('grp',), names)} ORDER BY grp")
    out = []
    for row in con.execute(sql, params).fetchall():
        d = {"group": row[0], "n": int(row[1]), "rel_err": ALPHA}
        for (_, q), v in zip(names.items(), row[2:], strict=True):
            d[f"p{q * 100:g}"] = v
        out.append(d)
    return out
