"""The weekly report's own SQL: one ``.sql`` file per query under ``agentobs/report/queries/``, each with a header.

Header lines (``-- key: value``, a value may continue on ``--   `` lines), all required:

- ``query``: the file's name; ``summary``: what it returns; ``reads``: the tables it reads (the metric run's);
- ``params``: its named ``$parameters`` (comma-separated, may be empty) — checked against the body;
- ``template``: the ``{fields}`` build.py fills in (comma-separated, may be empty) — checked against the body;
- ``notes`` (optional): why it is written so.

A header that is missing a key or disagrees with the body is a QueryError naming the file and line.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from functools import cache
from importlib import resources

from ..errors import QueryError

REQUIRED = ("query", "summary", "reads", "params", "template")
KNOWN = (*REQUIRED, "notes")


@dataclass(frozen=True)
class Query:
    name: str
    sql: str  # the body (the header stripped), with its ``{fields}`` when ``template`` names any
    header: dict[str, str]
    params: tuple[str, ...]
    fields: tuple[str, ...]

    def render(self, **fields: str) -> str:
        """The SQL with the template fields filled in (exactly those the header names)."""
        if set(fields) != set(self.fields):
            raise QueryError(f"report query {self.name!r} takes fields {sorted(self.fields)}, got {sorted(fields)}")
        return self.sql.format(**fields) if self.fields else self.sql


def _names(value: str) -> tuple[str, ...]:
    # "cols, sets (from X)" -> ("cols", "sets"): a parenthesized note after a name is prose
    value = re.sub(r"\([^)]*\)", "", value)
    return tuple(v.strip() for v in value.split(",") if v.strip())


def parse(name: str, text: str, where: str) -> Query:
    header: dict[str, str] = {}
    key = None
    lines = text.splitlines()
    body_at = len(lines)
    for i, line in enumerate(lines):
        if line.startswith("--   ") and key is not None:
            header[key] += " " + line[5:].strip()
            continue
        m = re.match(r"--\s*([a-z_]+):\s*(.*)$", line)
        if not m:
            body_at = i
            break
        key = m.group(1)
        if key not in KNOWN:
            raise QueryError(f"{where}:{i + 1}: unknown header key {key!r} (known: {', '.join(KNOWN)})")
        header[key] = m.group(2).strip()
    missing = [k for k in REQUIRED if k not in header]
    if missing:
        raise QueryError(f"{where}:1: header lacks {', '.join(missing)}")
    if header["query"] != name:
        raise QueryError(f"{where}:1: header says query {header['query']!r}, the file is {name!r}")
    sql = "\n".join(lines[body_at:]).strip() + "\n"
    params, fields = _names(header["params"]), _names(header["template"])
    used_fields = {f for _, f, _, _ in string.Formatter().parse(sql) if f} if fields else set()
    if fields and used_fields != set(fields):
        raise QueryError(f"{where}: template fields in the body {sorted(used_fields)} are not the header's "
                         f"{sorted(fields)}")
    used_params = set(re.findall(r"\$([a-z_][a-z0-9_]*)", sql))
    if used_params != set(params):
        raise QueryError(f"{where}: parameters in the body {sorted(used_params)} are not the header's {sorted(params)}")
    return Query(name, sql, header, params, fields)


@cache
def load(name: str) -> Query:
    f = resources.files(__package__).joinpath("queries", f"{name}.sql")
    if not f.is_file():
        raise QueryError(f"no report query {name!r} (agentobs/report/queries/{name}.sql)")
    return parse(name, f.read_text(), f"agentobs/report/queries/{name}.sql")


def names() -> list[str]:
    root = resources.files(__package__).joinpath("queries")
    return sorted(f.name[:-4] for f in root.iterdir() if f.name.endswith(".sql"))
