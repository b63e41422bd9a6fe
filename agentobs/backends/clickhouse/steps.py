"""A long CTE chain on ClickHouse, step by step: each step CTE computed once, into a Memory table.

ClickHouse inlines a CTE at every reference, so a chain in which a CTE is read twice (call_reuse's ``u``, read by
``lab`` and ``fin``; ``z``, read by five CTEs) plans and runs everything below it again at each reference — the
call_reuse view on an empty chDB store did not finish in 4 GiB (docs/clickhouse.md). ``AS MATERIALIZED`` CTEs
would say "once", but inside ``CREATE TABLE … AS`` chDB 26.9 fails with a LOGICAL_ERROR on them. So a statement
whose SQL marks steps is run here as one ``CREATE TABLE <prefix>step_<name> ENGINE = Memory AS WITH <what the
step reads> SELECT * FROM <name>`` per step, in order, each reading the earlier steps' tables; then the statement
itself, with every step CTE's body replaced by a plain read of its table.

The steps of a statement: its CTEs marked ``AS MATERIALIZED`` (DuckDB computes those once too) and those preceded by
a comment line starting ``--@step`` (agentobs/model/call_reuse.sql; DuckDB reads it as a comment). One SQL text,
both engines: DuckDB runs the statement as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import cast

import sqlglot
from sqlglot import exp

MARK = "--@step"
_MARKED = re.compile(r"^[ \t]*--@step[^\n]*\n(?:[ \t]*--[^\n]*\n)*[ \t]*(\w+)\s+AS\b", re.MULTILINE)


def has_steps(sql: str) -> bool:
    """Whether ``sql`` marks steps (cheap: the statements that do are ours and carry the marker)."""
    return MARK in sql


def marked(sql: str) -> list[str]:
    """The CTE names a ``--@step`` comment line marks, in order."""
    return _MARKED.findall(sql)


def _top_ctes(tree: exp.Expression) -> list[exp.CTE]:
    """The CTEs of every WITH that is not inside a CTE's body (an outer WITH, then a subquery's), in order."""
    out: list[exp.CTE] = []
    for w in tree.find_all(exp.With, bfs=True):
        if w.find_ancestor(exp.CTE) is None:
            out += list(w.expressions)
    return out


def _reads(node: exp.Expression, names: set[str]) -> set[str]:
    return {t.name for t in node.find_all(exp.Table) if not t.db and t.name in names}


def _needed(ctes: dict[str, exp.CTE], roots: set[str]) -> set[str]:
    names = set(ctes)
    need: set[str] = set()
    todo = list(roots)
    while todo:
        n = todo.pop()
        if n in need:
            continue
        need.add(n)
        todo += _reads(ctes[n].this, names) - need
    return need


def _prune(tree: exp.Expression) -> None:
    """Drop the CTEs nothing outside the WITH clauses reads (directly or through other CTEs)."""
    ctes = {c.alias: c for c in _top_ctes(tree)}
    outside = tree.copy()
    for w in list(outside.find_all(exp.With)):
        if w.find_ancestor(exp.CTE) is None:
            w.pop()
    keep = _needed(ctes, _reads(outside, set(ctes)))
    for name, c in ctes.items():
        if name not in keep:
            parent = c.parent
            c.pop()
            if isinstance(parent, exp.With) and not parent.expressions:
                parent.pop()


def _read_of(table: str, columns: list[str]) -> exp.Select:
    return exp.select(*[exp.column(exp.to_identifier(c)) for c in columns]).from_(exp.to_identifier(table))


# statement text → (the steps' (table, SELECT) in order, the rewritten statement): parsing and rewriting the chain
# costs more than running it on a small store, and a statement's plan is the same every time (its tables are named
# prefix + the step's name; the columns follow from the SQL)
_PLANS: dict[tuple[str, str], tuple[list[tuple[str, str]], str]] = {}
_PLANS_MAX = 64


def run(sql: str, prefix: str, create: Callable[[str, str], list[str]]) -> tuple[str, list[str]]:
    """Compute the steps of ``sql`` (DuckDB SQL) in order; returns the statement rewritten to read their tables (DuckDB
    SQL again) and the tables made. A step's table is ``prefix`` + its name; ``create(table, select_sql)``: make the
    table from a DuckDB SELECT (the caller transpiles and runs it, and drops the tables when done) and return its
    columns. A statement without steps comes back unchanged."""
    key = (sql, prefix)
    plan = _PLANS.get(key)
    if plan is not None:
        for table, select in plan[0]:
            create(table, select)
        return plan[1], [t for t, _ in plan[0]]
    final, made, done = _run(sql, prefix, create)
    if made:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = (done, final)
    return final, made


def _run(sql: str, prefix: str,
         create: Callable[[str, str], list[str]]) -> tuple[str, list[str], list[tuple[str, str]]]:
    tree = sqlglot.parse_one(sql, read="duckdb")
    stmt = cast(exp.Expression, tree.expression if isinstance(tree, exp.Create) else tree)
    ctes = {c.alias: c for c in _top_ctes(stmt)}
    marks = set(marked(sql))
    steps = [n for n in ctes if ctes[n].args.get("materialized") is True or n in marks]
    made: list[str] = []
    done: list[tuple[str, str]] = []
    for name in steps:
        need = _needed(ctes, {name})
        q = exp.select("*").from_(name)
        for n in ctes:  # definition order: a CTE reads only those before it
            if n in need:  # without a MATERIALIZED hint (a step is computed once: its own table)
                q = q.with_(n, as_=ctes[n].this)
        table = prefix + name
        select = q.sql(dialect="duckdb")
        made.append(table)
        cols = create(table, select)
        done.append((table, select))
        ctes[name].set("this", _read_of(table, cols))
        ctes[name].set("materialized", None)
    if not made:
        return sql, made, done
    _prune(stmt)
    return tree.sql(dialect="duckdb"), made, done
