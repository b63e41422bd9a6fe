"""DuckDB SQL → ClickHouse SQL: sqlglot's transpiler plus the few rewrites our SQL needs.

The model views and metric SQL are written once, in DuckDB's dialect (agentobs/model/views.sql,
agentobs/metrics/). This module turns them into ClickHouse SQL at run time:

- named parameters ``$x`` → typed query parameters ``{x:Type}`` (types from PARAM_TYPES);
- ``quantile_cont`` → ``quantileExactInclusive`` (both are linear interpolation, R-7), also inside
  ``list_aggregate``; ``string_agg(DISTINCT …)`` (with or without ``ORDER BY`` the same value) → sorted
  ``groupUniqArray`` joined;
- ``unnest(generate_series(a, b))`` → ``arrayJoin(range(a, b + 1))``; ``unnest(x)`` with
  ``generate_subscripts(x, 1)`` → one ``arrayJoin`` over ``arrayZip(x, arrayEnumerate(x))``;
- ``lag``/``lead`` → ``lagInFrame``/``leadInFrame`` over a Nullable argument and a whole-partition frame
  (so "no previous row" is NULL, as in DuckDB);
- ``agentobs_cumsum`` (agentobs.store.functions, a Python function on DuckDB) → ``arrayCumSum``;
- ``epoch_us``/``make_timestamp`` → ``toUnixTimestamp64Micro``/``fromUnixTimestamp64Micro``;
- arrays cannot be NULL in ClickHouse: ``x IS [NOT] NULL`` and ``coalesce`` on the array columns
  (ARRAY_COLUMNS) test emptiness instead;
- ``AS MATERIALIZED`` CTE hints are kept (ClickHouse inlines a CTE at every reference otherwise;
  the session enables ``enable_materialized_cte``); ``AS NOT MATERIALIZED`` (DuckDB: scan again at every
  reference rather than fan one scan out) is ClickHouse's default and is dropped;
- ``list_sort(x)`` → ``arraySort(x)``.

Session settings in conn.SESSION_SETTINGS supply SQL NULL semantics (join_use_nulls, …).
"""

from __future__ import annotations

import re
from functools import lru_cache

import sqlglot
from sqlglot import exp

ARRAY_COLUMNS = {"itl_ms", "block_hashes", "h_block_hashes"}
PARAM_TYPES = {
    "since": "Nullable(Float64)", "until": "Nullable(Float64)", "by": "String",
    "instances": "Array(String)", "metrics": "Array(String)",
    "bucket_s": "Float64", "itl_slo_ms": "Float64", "itl_tail_mode": "String", "long_prefill_tokens": "Int64",
    "ttft_slo_s": "Float64", "default_block_size": "Int32",
    # findings (agentobs/findings), report (agentobs/report/build.py)
    "instance": "Nullable(String)", "model": "Nullable(String)", "cause": "String", "cause2": "String", "cause3": "String",
    "mode": "String", "slo_ms": "Float64",
    "long_tokens": "Int64", "queue_s": "Float64", "lo": "Nullable(Float64)", "hi": "Nullable(Float64)",
    "ids": "Array(String)",
    # console (agentobs/console/data.py, metrics.py)
    "sid": "String", "tid": "String", "search": "String", "near": "String", "n_rows": "Int64",
    # one trace (agentobs/model/trace.py: agentobs trace, the console's Trace page)
    "trace_ident": "String", "trace_id": "String",
}
LIST_PARAMS = {"instances", "metrics", "ids"}  # lists cannot be NULL in ClickHouse: None → []


_CLAIM_PARAM = re.compile(r"^c\d+_(\w+)$")  # a finding's claim parameter in the ledger's one query (c<rank>_<name>)


def param_type(name: str) -> str:
    if name.startswith("f_"):
        return "Array(String)"
    m = _CLAIM_PARAM.match(name)
    if m and name not in PARAM_TYPES:
        name = m.group(1)
    if name not in PARAM_TYPES:
        raise KeyError(f"no ClickHouse type for parameter ${name}")
    return PARAM_TYPES[name]


def _fn(name: str, *args) -> exp.Anonymous:
    return exp.Anonymous(this=name, expressions=list(args))


def _is_array_col(e) -> bool:
    return isinstance(e, exp.Column) and e.name in ARRAY_COLUMNS


def _rewrite(node: exp.Expression) -> exp.Expression:
    # $param → placeholder kept by name; typed when rendered (see _render_params)
    if isinstance(node, exp.CTE) and node.args.get("materialized") is False:
        node.set("materialized", None)  # NOT MATERIALIZED: what ClickHouse does anyway (and cannot parse)
        return node
    if isinstance(node, exp.ArraySort) and node.args.get("expression") is None:
        return _fn("arraySort", node.this)
    if isinstance(node, (exp.Length, exp.ArraySize)) and _is_array_col(node.this):
        return _fn("length", node.this)  # len(list): sqlglot's Length renders as lengthUTF8 (strings only)
    if isinstance(node, exp.Is) and _is_array_col(node.this) and isinstance(node.expression, exp.Null):
        return _fn("empty", node.this)
    if isinstance(node, exp.Coalesce) and _is_array_col(node.this):
        args = [node.this, *node.expressions]
        out = args[-1]
        for a in reversed(args[:-1]):
            out = exp.If(this=_fn("notEmpty", a.copy()), true=a.copy(), false=out)
        return out
    if isinstance(node, exp.Anonymous):
        n = node.name.lower()
        if n == "jaro_winkler_similarity":
            return _fn("jaroWinklerSimilarity", *node.expressions)
        if n == "agentobs_cumsum":  # agentobs.store.functions: a list's running sum
            return _fn("arrayCumSum", *node.expressions)
        if n == "epoch_us":
            return _fn("toUnixTimestamp64Micro", *node.expressions)
        if n == "make_timestamp" and len(node.expressions) == 1:
            return _fn("fromUnixTimestamp64Micro", exp.cast(node.expressions[0], "Int64"))
        if n == "list_aggregate":
            arr, fname, *rest = node.expressions
            if isinstance(fname, exp.Literal) and fname.this == "quantile_cont" and rest:
                # DuckDB: NULL for a NULL list; ClickHouse arrays are never NULL and reduce [] to NaN
                return exp.If(this=_fn("empty", arr.copy()), true=exp.Null(),
                              false=_fn("arrayReduce", exp.Literal.string(f"quantileExactInclusive({rest[0].sql()})"), arr))
        if n == "generate_subscripts":
            return node
    if isinstance(node, exp.Window) and isinstance(node.this, (exp.Lag, exp.Lead)):
        f = node.this
        name = "lagInFrame" if isinstance(f, exp.Lag) else "leadInFrame"
        args = [_fn("toNullable", f.this)]
        if f.args.get("offset") is not None:
            args.append(f.args["offset"])
        node.set("this", _fn(name, *args))
        if node.args.get("spec") is None:  # a named window (OVER t) too: its ORDER BY frame ends at the row
            node.set("spec", exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING",
                                            end="UNBOUNDED", end_side="FOLLOWING"))
        return node
    return node


def _quantiles(node):
    if isinstance(node, exp.Median):
        return exp.Anonymous(this="quantileExactInclusive(0.5)", expressions=[node.this])
    if type(node).__name__ == "Mode" or (isinstance(node, exp.Anonymous) and node.name.lower() == "mode"):
        arg = node.this if type(node).__name__ == "Mode" else node.expressions[0]
        return _fn("arrayElement", exp.Anonymous(this="topK(1)", expressions=[arg]), exp.Literal.number(1))
    if isinstance(node, (exp.PercentileCont, exp.Quantile)):
        q = node.expression if isinstance(node, exp.PercentileCont) else node.args.get("quantile")
        this = node.this
        return exp.Anonymous(this=f"quantileExactInclusive({q.sql()})", expressions=[this])
    return node


def _unnest(select: exp.Select) -> None:
    """unnest(...) in a SELECT list → arrayJoin; pair unnest(x) with generate_subscripts(x, 1)."""
    subs = {}
    for e in select.expressions:
        inner = e.this if isinstance(e, exp.Alias) else e
        if isinstance(inner, exp.Anonymous) and inner.name.lower() == "generate_subscripts":
            subs[inner.expressions[0].sql()] = inner
    for e in list(select.expressions):
        inner = e.this if isinstance(e, exp.Alias) else e
        if isinstance(inner, (exp.Unnest, exp.Explode)):
            arg = inner.expressions[0] if isinstance(inner, exp.Unnest) else inner.this
            if isinstance(arg, exp.GenerateSeries):
                new = _fn("arrayJoin", _fn("range", arg.args["start"],
                                           exp.Add(this=exp.Paren(this=arg.args["end"]), expression=exp.Literal.number(1))))
            elif arg.sql() in subs:
                z = _fn("arrayJoin", _fn("arrayZip", arg.copy(), _fn("arrayEnumerate", arg.copy())))
                new = _fn("tupleElement", z, exp.Literal.number(1))
                subs[arg.sql()].replace(_fn("tupleElement", z.copy(), exp.Literal.number(2)))
            else:
                new = _fn("arrayJoin", arg)
            inner.replace(new)


def _string_agg(node):
    if isinstance(node, exp.Struct):  # {'k': v, ...} → a named tuple
        items = []
        for e in node.expressions:
            k, v = (e.this, e.expression) if isinstance(e, (exp.PropertyEQ, exp.Slice, exp.EQ)) else (None, e)
            name = k.name if isinstance(k, (exp.Identifier, exp.Column, exp.Literal)) else str(k)
            items.append(exp.alias_(v, name) if k is not None else v)
        return _fn("tuple", *items)
    if isinstance(node, exp.GroupConcat):
        this, sep = node.this, node.args.get("separator") or exp.Literal.string(",")
        if isinstance(this, exp.Order) and isinstance(this.this, exp.Distinct):
            # string_agg(DISTINCT x, sep ORDER BY x): the distinct values, sorted
            return _fn("arrayStringConcat", _fn("arraySort", _fn("groupUniqArray", this.this.expressions[0])), sep)
        if isinstance(this, exp.Order):  # string_agg(x, sep ORDER BY k) → sort (k, x) pairs
            key = this.expressions[0].this
            pairs = _fn("groupArray", _fn("tuple", key, this.this))
            arr = _fn("arrayMap", exp.Lambda(this=_fn("tupleElement", exp.to_identifier("t"), exp.Literal.number(2)),
                                             expressions=[exp.to_identifier("t")]), _fn("arraySort", pairs))
            return _fn("arrayStringConcat", arr, sep)
        if isinstance(this, exp.Distinct):
            arr = _fn("arraySort", _fn("groupUniqArray", this.expressions[0]))
        else:
            arr = _fn("groupArray", this)
        return _fn("arrayStringConcat", arr, sep)
    return node


def _params(node):
    if isinstance(node, exp.Placeholder) and node.name:
        return exp.Var(this="{" + f"{node.name}:{param_type(node.name)}" + "}")
    if isinstance(node, exp.Parameter):
        name = node.this.name if isinstance(node.this, exp.Expression) else str(node.this)
        return exp.Var(this="{" + f"{name}:{param_type(name)}" + "}")
    return node


def _instances_null(node):
    # `$instances IS NULL` (a list parameter) → empty({instances:Array(String)}): lists cannot be NULL
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null) and isinstance(node.this, exp.Var) \
            and node.this.name.startswith("{") and ":Array(" in node.this.name:
        return _fn("empty", node.this)
    return node


def _intdiv(node):
    if isinstance(node, exp.IntDiv):
        return _fn("intDiv", node.this, node.expression)
    return node


def _alias_columns(select: exp.Select) -> None:
    """ClickHouse names an unaliased ``t.col`` projection ``t.col``; DuckDB names it ``col``."""
    if isinstance(select.parent, exp.Union) and select.arg_key == "expression":
        return  # later UNION members take the first member's names
    names = [e.alias_or_name for e in select.expressions]
    for e in list(select.expressions):
        if isinstance(e, exp.Column) and e.table and not isinstance(e.this, exp.Star) and names.count(e.name) == 1:
            e.replace(exp.alias_(e.copy(), e.name, quoted=False))


def _is_predicate(e) -> bool:
    if isinstance(e, exp.Paren):
        return _is_predicate(e.this)
    if isinstance(e, (exp.Predicate, exp.Connector, exp.Not, exp.Boolean, exp.Exists)):
        return True
    if isinstance(e, exp.Case):
        branches = [i.args.get("true") for i in e.args.get("ifs") or []] + [e.args.get("default")]
        known = [b for b in branches if b is not None and not isinstance(b, exp.Null)]
        return bool(known) and all(_is_predicate(b) for b in known)
    return False


def _bool_columns(select: exp.Select) -> None:
    """``a = b AS x``: DuckDB gives BOOLEAN, ClickHouse UInt8 (0/1), which Python reads as an int (and
    ``x is False`` fails): cast named predicate projections to Bool (NULL kept: cast_keep_nullable)."""
    for e in select.expressions:
        if isinstance(e, exp.Alias) and _is_predicate(e.this):
            e.set("this", exp.Cast(this=e.this, to=exp.DataType.build("BOOLEAN")))


def _order_by_alias(select: exp.Select) -> None:
    """DuckDB resolves ``ORDER BY x`` to the output column ``… AS x`` first; with prefer_column_name_to_alias
    ClickHouse takes the input column ``x`` (not grouped, when the output is ``coalesce(x, '') AS x``): order
    by the projection's expression instead."""
    order = select.args.get("order")
    if order is None:
        return
    aliased = {e.alias: e.this for e in select.expressions
               if isinstance(e, exp.Alias) and not (isinstance(e.this, exp.Column) and e.this.name == e.alias)}
    for o in order.expressions:
        c = o.this
        if isinstance(c, exp.Column) and not c.table and c.name in aliased:
            c.replace(aliased[c.name].copy())


def _expand_stars(select: exp.Select, schema: dict[str, tuple[str, ...]]) -> None:
    """``s.*`` over a joined relation whose columns we know → explicit ``s.col AS col`` (ClickHouse would
    name a column that is ambiguous across the join ``s.col``)."""
    joins = select.args.get("joins") or []
    for src in [select.args.get("from_") or select.args.get("from"), *joins]:
        t = src.this if src is not None else None
        if joins and isinstance(t, exp.Table) and not t.alias:  # `FROM n JOIN n AS p` is ambiguous to ClickHouse
            t.set("alias", exp.TableAlias(this=exp.to_identifier(f"{t.name}__t")))
            for col in select.find_all(exp.Column):
                if col.table == t.name and col.find_ancestor(exp.Select) is select:
                    col.set("table", exp.to_identifier(f"{t.name}__t"))
    sources = {}
    for src in [select.args.get("from_") or select.args.get("from"), *joins]:
        t = src.this if src is not None else None
        if isinstance(t, exp.Table):
            sources[t.alias_or_name] = t.name
    new = []
    for e in select.expressions:
        star = e.this if isinstance(e, exp.Column) else e
        if isinstance(star, exp.Star) and any(star.args.get(k) for k in ("except_", "except", "replace", "rename")):
            new.append(e)  # `* EXCLUDE (...)`: left to ClickHouse's `* EXCEPT (...)`
        elif isinstance(e, exp.Column) and isinstance(e.this, exp.Star) and sources.get(e.table) in schema:
            new += [exp.alias_(exp.column(c, table=e.table), c) for c in schema[sources[e.table]]]
        elif isinstance(e, exp.Star) and len(sources) == 1 and not joins and next(iter(sources.values())) in schema:
            new += [exp.column(c) for c in schema[next(iter(sources.values()))]]
        else:
            new.append(e)
    select.set("expressions", new)


def to_clickhouse(sql: str, schema: dict[str, tuple[str, ...]] | None = None) -> str:
    """One DuckDB statement as ClickHouse SQL. ``schema``: columns of relations that ``t.*`` may expand."""
    return _to_clickhouse(sql, tuple(sorted((schema or {}).items())))


@lru_cache(maxsize=512)
def _to_clickhouse(sql: str, schema_items: tuple) -> str:
    schema = dict(schema_items)
    tree = sqlglot.parse_one(sql, read="duckdb")
    # `WITH d(a, b) AS (SELECT x, y …)`: ClickHouse has no CTE column list → alias the first SELECT's columns
    for cte in tree.find_all(exp.CTE):
        alias = cte.args.get("alias")
        cols = alias.args.get("columns") if alias is not None else None
        if cols and alias is not None:
            first = cte.this
            while isinstance(first, exp.SetOperation):
                first = first.this
            if isinstance(first, exp.Select) and len(first.expressions) == len(cols):
                first.set("expressions", [exp.alias_(e.this if isinstance(e, exp.Alias) else e, c.name)
                                          for e, c in zip(first.expressions, cols, strict=True)])
                alias.set("columns", None)
    # CTE by CTE, in order: expand `t.*` over joins with the columns known so far, then record the CTE's own
    for w in reversed(list(tree.find_all(exp.With))):
        for cte in w.expressions:
            for sel in reversed(list(cte.this.find_all(exp.Select))):
                _expand_stars(sel, schema)
            body = cte.this
            if isinstance(body, exp.Select) and not any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)) for e in body.expressions):
                schema[cte.alias] = tuple(e.alias_or_name for e in body.expressions)
    for sel in reversed(list(tree.find_all(exp.Select))):
        _expand_stars(sel, schema)
    tree = tree.transform(_intdiv)
    for sel in list(tree.find_all(exp.Select)):
        _alias_columns(sel)
        _order_by_alias(sel)
        _bool_columns(sel)
    tree = tree.transform(_string_agg)
    tree = tree.transform(_quantiles)
    for sel in list(tree.find_all(exp.Select)):
        _unnest(sel)
    tree = tree.transform(_rewrite)
    tree = tree.transform(_params)
    tree = tree.transform(_instances_null)
    return tree.sql(dialect="clickhouse")
