"""Raw tables, created by named migrations recorded in ``schema_migrations``.

Raw tables keep everything (attributes as JSON) so ad-hoc SQL can reach what the model does
not know. ``spans`` also carries *promoted* columns: the attribute aliases of DESIGN.md resolved
once at ingest (session, task, usage, latency, instance, ...), so the normalized views are plain
SQL over typed columns. See docs/schema.md.

A migration is ``(name, sql)``; never edit one that has shipped — append a new one.
"""

from __future__ import annotations

MIGRATIONS: tuple[tuple[str, str], ...] = (
    (
        "0001_raw_tables",
        """
        CREATE TABLE IF NOT EXISTS spans (
            trace_id        VARCHAR NOT NULL,
            span_id         VARCHAR NOT NULL,
            parent_span_id  VARCHAR,
            name            VARCHAR,
            kind            TINYINT,
            start_ns        BIGINT,
            end_ns          BIGINT,
            status_code     TINYINT,
            status_message  VARCHAR,
            service_name    VARCHAR,
            scope_name      VARCHAR,
            resource        JSON,
            attributes      JSON,
            events          JSON,
            -- promoted columns (resolved at ingest from the aliases in agentobs/collect/normalize.py)
            role            VARCHAR,   -- gateway | engine | agent | tool | other
            op              VARCHAR,   -- gen_ai.operation.name or inferred
            session_id      VARCHAR,
            task_id         VARCHAR,
            task_type       VARCHAR,
            tenant          VARCHAR,
            agent_name      VARCHAR,
            attempt         INTEGER,
            branch          VARCHAR,
            model           VARCHAR,
            provider        VARCHAR,
            engine          VARCHAR,
            instance        VARCHAR,
            response_id     VARCHAR,
            request_id      VARCHAR,
            input_tokens    BIGINT,
            cached_tokens   BIGINT,
            output_tokens   BIGINT,
            system_tokens   BIGINT,
            tool_def_tokens BIGINT,
            ttft_s          DOUBLE,
            queue_s         DOUBLE,
            prefill_s       DOUBLE,
            decode_s        DOUBLE,
            finish_reason   VARCHAR,
            error_type      VARCHAR,
            tool_name       VARCHAR,
            itl_ms          DOUBLE[],
            block_hashes    VARCHAR[],
            ingest_source   VARCHAR,
            PRIMARY KEY (trace_id, span_id)
        );
        CREATE TABLE IF NOT EXISTS metric_samples (
            ts          TIMESTAMP NOT NULL,
            instance    VARCHAR NOT NULL,
            metric      VARCHAR NOT NULL,
            labels      MAP(VARCHAR, VARCHAR),
            labels_key  VARCHAR NOT NULL,
            value       DOUBLE,
            engine      VARCHAR,
            PRIMARY KEY (instance, metric, labels_key, ts)
        );
        CREATE TABLE IF NOT EXISTS scrapes (
            ts          TIMESTAMP NOT NULL,
            instance    VARCHAR NOT NULL,
            url         VARCHAR,
            ok          BOOLEAN,
            error       VARCHAR,
            duration_s  DOUBLE,
            samples     INTEGER,
            PRIMARY KEY (instance, ts)
        );
        CREATE TABLE IF NOT EXISTS engine_config (
            instance    VARCHAR NOT NULL,
            ts          TIMESTAMP NOT NULL,
            engine      VARCHAR,
            key         VARCHAR NOT NULL,
            value       VARCHAR,
            source      VARCHAR,
            PRIMARY KEY (instance, ts, key)
        );
        CREATE TABLE IF NOT EXISTS kv_events (
            instance          VARCHAR NOT NULL,
            ts                TIMESTAMP NOT NULL,
            seq               BIGINT NOT NULL,
            event_idx         INTEGER NOT NULL,
            type              VARCHAR NOT NULL,
            block_hashes      VARCHAR[],
            parent_block_hash VARCHAR,
            num_tokens        INTEGER,
            block_size        INTEGER,
            medium            VARCHAR,
            session_id        VARCHAR,
            lora_name         VARCHAR,
            PRIMARY KEY (instance, ts, seq, event_idx)
        );
        CREATE TABLE IF NOT EXISTS ingest_log (
            ts          TIMESTAMP NOT NULL,
            source      VARCHAR NOT NULL,
            kind        VARCHAR NOT NULL,
            accepted    BIGINT,
            rejected    BIGINT,
            detail      VARCHAR
        );
        """,
    ),
    (
        "0002_findings_acks",
        """
        -- acknowledgements of findings (agentobs findings ack): written by the CLI only
        CREATE TABLE IF NOT EXISTS findings_acks (
            finding_id  VARCHAR PRIMARY KEY,   -- rule/scope, e.g. hicache_off/instance=10.0.0.1:30000
            reason      VARCHAR NOT NULL,
            until       TIMESTAMP NOT NULL,    -- UTC; the acknowledgement lapses then
            created_at  TIMESTAMP NOT NULL,
            created_by  VARCHAR
        );
        """,
    ),
    (
        "0003_spans_append_only",
        """
        -- spans without a primary key (appends stay flat as the store grows): retries are caught by the
        -- spool's request hash, and insert_spans (agentobs/store/writer.py) skips a span already stored.
        -- spool_loaded: how far the OTLP spool has been loaded, written in the transaction of the spans.
        CREATE TABLE spans_0003 AS SELECT * FROM spans LIMIT 0;
        INSERT INTO spans_0003 SELECT * FROM spans;
        DROP TABLE spans;
        ALTER TABLE spans_0003 RENAME TO spans;
        ALTER TABLE spans ALTER COLUMN trace_id SET NOT NULL;
        ALTER TABLE spans ALTER COLUMN span_id SET NOT NULL;
        CREATE TABLE IF NOT EXISTS spool_loaded (
            segment     BIGINT NOT NULL,   -- spool segment number
            end_offset  BIGINT NOT NULL,   -- byte offset in it where the loaded records end
            requests    INTEGER,
            spans       BIGINT,            -- spans decoded (before skipping those already stored)
            rejected    BIGINT,
            ts          TIMESTAMP
        );
        """,
    ),
    (
        "0004_span_segments",
        """
        -- spans becomes a view (agentobs/store/segments.py): the compacted table part spans_part, plus the
        -- Parquet segments the loader published (span_store = segments) that compaction has not merged yet.
        ALTER TABLE spans RENAME TO spans_part;
        CREATE TABLE span_segments (
            seq           BIGINT PRIMARY KEY,  -- publication order
            file          VARCHAR NOT NULL,    -- absolute path of the Parquet file
            rows          BIGINT NOT NULL,
            min_start_ns  BIGINT,
            max_start_ns  BIGINT,
            spool_segment BIGINT,              -- spool position loaded with it (spool_loaded's row of the same commit)
            spool_end     BIGINT,
            created_at    TIMESTAMP
        );
        CREATE TABLE span_compactions (        -- segments merged into spans_part (the model's marks read it)
            max_seq     BIGINT NOT NULL,       -- highest segment seq merged
            segments    INTEGER NOT NULL,
            rowid_lo    BIGINT,                -- spans_part rowids the merged rows got (NULL: none inserted)
            rowid_hi    BIGINT,
            rows        BIGINT NOT NULL,       -- rows inserted (duplicates of stored spans skipped)
            ts          TIMESTAMP
        );
        CREATE TABLE span_segments_retired (   -- merged files, deleted once no read snapshot lists them
            file        VARCHAR NOT NULL,
            retired_at  TIMESTAMP NOT NULL
        );
        CREATE VIEW spans AS SELECT * FROM spans_part;
        """,
    ),
    (
        "0005_span_merged",
        """
        -- compaction merges tail segments into large Parquet files, not into spans_part (agentobs/store/segments.py)
        CREATE TABLE span_merged (
            file          VARCHAR NOT NULL,    -- absolute path of the merged Parquet file
            rows          BIGINT NOT NULL,     -- spans in it: none in spans_part or another merged file
            min_start_ns  BIGINT,
            max_start_ns  BIGINT,
            min_seq       BIGINT NOT NULL,     -- the tail segments merged into it (its column _seg: each row's)
            max_seq       BIGINT NOT NULL,
            created_at    TIMESTAMP
        );
        """,
    ),
)
