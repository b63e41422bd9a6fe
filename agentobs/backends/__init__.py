"""Storage backends other than the embedded DuckDB store (see docs/clickhouse.md)."""
