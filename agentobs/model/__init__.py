"""The normalized model: views over the raw tables (``llm_calls``, ``tool_calls``, ``sessions``,
``tasks``, ``turn_gaps``, ``instance_config``). The SQL lives in ``views.sql``."""

from __future__ import annotations

from importlib import resources

import duckdb


def views_sql() -> str:
    return resources.files(__package__).joinpath("views.sql").read_text()


def split_statements(sql: str) -> list[str]:
    """Split a SQL script into statements (sqlglot-free: our files end statements with ';\\n')."""
    out, buf = [], []
    for line in sql.splitlines():
        if line.strip().startswith("--") and not buf:
            continue
        buf.append(line)
        if line.rstrip().endswith(";"):
            stmt = "\n".join(buf).strip()
            if stmt.strip(";").strip():
                out.append(stmt)
            buf = []
    if "\n".join(buf).strip():
        out.append("\n".join(buf).strip())
    return out


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    for stmt in split_statements(views_sql()):
        con.execute(stmt)
    # call_reuse: the per-call reuse model of METRICS.md §1/§4 (agentobs/model/call_reuse.sql)
    from .reuse import create_view as create_call_reuse

    create_call_reuse(con)
