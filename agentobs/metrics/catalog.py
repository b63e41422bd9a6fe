"""The metric catalogue: one ``.sql`` file per metric under ``agentobs/metrics/defs/``.

Every file starts with a header comment of ``-- key: value`` lines (a value may continue on
following ``--`` lines indented by two or more spaces)::

    -- metric: reuse
    -- definition: Session hit rate H = ΣC/ΣP and reuse hit rate U = ΣC/ΣR_eff (METRICS.md §1–2)
    -- unit: ratio 0–1 (hit rates); tokens
    -- grain: one row per group
    -- sources: call_reuse (llm_calls, instance_config, kv_events)
    -- by: session, task, instance, model, task_type

``definition``, ``unit``, ``grain``, ``sources`` and ``by`` are required (the first ``by`` entry is
the default grouping); the loader refuses a file without them. The body is exactly one SELECT
(checked with DuckDB's own parser). It may use the named parameters listed in PARAMS.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import duckdb

from ..errors import ConfigError, QueryError, did_you_mean

REQUIRED = ("definition", "unit", "grain", "sources", "by")
OPTIONAL = ("metric", "summary", "section", "notes")
# every `by` a metric may declare; each maps to a column name in the output
BY_COLUMNS = {
    "session": "session_id", "task": "task_id", "instance": "instance", "model": "model",
    "cause": "cause", "task_type": "task_type", "session_length": "session_length",
}
PARAMS = {
    "since", "until", "by", "instances", "bucket_s", "itl_slo_ms", "itl_tail_mode", "long_prefill_tokens",
    "ttft_slo_s",
}


@dataclass(frozen=True)
class Metric:
    name: str
    definition: str
    unit: str
    grain: str
    sources: str
    by: tuple[str, ...]
    sql: str
    params: frozenset[str]
    section: str = ""
    notes: str = ""
    summary: str = ""

    @property
    def one_line(self) -> str:
        """The ``summary:`` header, else the definition's first sentence."""
        return self.summary or self.definition.split(". ")[0].split(": ")[0]

    @property
    def default_by(self) -> str:
        return self.by[0]


def parse_header(text: str, where: str) -> tuple[dict[str, str], str]:
    """Split a metric file into its header fields and the SQL body."""
    fields: dict[str, str] = {}
    lines = text.splitlines()
    key = None
    i = 0
    for i, line in enumerate(lines):  # noqa: B007 - i is used after the loop
        s = line.strip()
        if not s:
            continue
        if not s.startswith("--"):
            break
        content = s[2:]
        if key is not None and content.startswith("  ") and content.strip():
            fields[key] += " " + content.strip()
            continue
        k, sep, v = content.strip().partition(":")
        k = k.strip().lower()
        if sep and k and " " not in k:
            if k not in REQUIRED and k not in OPTIONAL:
                raise ConfigError(f"{where}: unknown header field {k!r} (known: {', '.join(REQUIRED + OPTIONAL)})")
            fields[k] = v.strip()
            key = k
        else:
            key = None
    else:
        i = len(lines)
    missing = [k for k in REQUIRED if not fields.get(k)]
    if missing:
        raise ConfigError(
            f"{where}: the header comment lacks {', '.join(repr(m + ':') for m in missing)} — every metric file "
            "starts with '-- definition: …', '-- unit: …', '-- grain: …', '-- sources: …', '-- by: …' lines"
        )
    return fields, "\n".join(lines[i:]).strip()


def parse_metric(name: str, text: str, where: str | None = None,
                 con: duckdb.DuckDBPyConnection | None = None) -> Metric:
    where = where or f"{name}.sql"
    fields, body = parse_header(text, where)
    if fields.get("metric") and fields["metric"] != name:
        raise ConfigError(f"{where}: header says metric {fields['metric']!r} but the file is named {name!r}")
    by = tuple(b.strip() for b in fields["by"].split(",") if b.strip())
    bad = [b for b in by if b not in BY_COLUMNS]
    if bad:
        raise ConfigError(f"{where}: unknown grouping(s) {', '.join(map(repr, bad))} in 'by:' (known: {', '.join(BY_COLUMNS)})")
    own = con is None  # the parser only: one in-memory connection serves every file (catalogue)
    parser = duckdb.connect() if con is None else con
    try:
        stmts = parser.extract_statements(body)
    except duckdb.ParserException as e:
        raise ConfigError(f"{where}: SQL does not parse: {str(e).splitlines()[0]}") from e
    finally:
        if own:
            parser.close()
    if len(stmts) != 1 or stmts[0].type != duckdb.StatementType.SELECT:
        raise ConfigError(f"{where}: the body must be exactly one SELECT statement")
    params = frozenset(stmts[0].named_parameters)
    unknown = params - PARAMS
    if unknown:
        raise ConfigError(f"{where}: unknown parameter(s) {', '.join('$' + p for p in sorted(unknown))} (known: {', '.join('$' + p for p in sorted(PARAMS))})")
    return Metric(name=name, definition=fields["definition"], unit=fields["unit"], grain=fields["grain"],
                  sources=fields["sources"], by=by, sql=body, params=params,
                  section=fields.get("section", ""), notes=fields.get("notes", ""), summary=fields.get("summary", ""))


@cache
def catalogue() -> dict[str, Metric]:
    """All metrics shipped in the package, by name, in file-name order."""
    out: dict[str, Metric] = {}
    root = resources.files(__package__).joinpath("defs")
    con = duckdb.connect()
    try:
        for f in sorted(root.iterdir(), key=lambda p: p.name):
            if f.name.endswith(".sql"):
                name = f.name[:-4]
                out[name] = parse_metric(name, f.read_text(), f"agentobs/metrics/defs/{f.name}", con)
    finally:
        con.close()
    return out


def get_metric(name: str) -> Metric:
    """The catalogue's metric ``name``; a QueryError with a did-you-mean when there is none."""
    cat = catalogue()
    if name not in cat:
        raise QueryError(f"unknown metric {name!r}{did_you_mean(name, cat, 'choose one of')}")
    return cat[name]
