"""The layer rule (docs/architecture.md, "Layers"): every import of every agentobs module — at module level, in a
function (a lazy import) or under TYPE_CHECKING — points down the one-way flow

    base → store → collect → model → source → metrics → findings → loadgen → surfaces (report, exporter, console) → cli

and the simulator sits beside it: it imports only the base and the store, and only findings and the surfaces
import it. Modules of one package import each other freely; the surfaces do not import each other.

Also checked: the backend is named in one place (agentobs/source.py): no other module tests the type of a
connection, and the store path's default and environment variable are the setting ``db``'s (agentobs/config.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "agentobs"

# module prefix -> layer (the longest prefix wins)
LAYER_OF = {
    "agentobs": "base",  # the package's __init__ (its version)
    "agentobs.errors": "base",
    "agentobs.config": "base",
    "agentobs.conventions": "base",  # every span alias list (both backends read it)
    "agentobs.times": "base",
    "agentobs.redact": "base",
    "agentobs.output": "base",
    "agentobs.store": "store",
    "agentobs.sql": "store",  # read-only user SQL on a sandboxed store connection
    "agentobs.collect": "collect",
    "agentobs.model": "model",
    "agentobs.source": "source",
    "agentobs.backends": "source",  # ClickHouse behind the seam (its connection, dialect, model DDL, loader)
    "agentobs.metrics": "metrics",
    "agentobs.findings": "findings",
    "agentobs.report": "surface",
    "agentobs.exporter": "surface",
    "agentobs.console": "surface",
    "agentobs.loadgen": "loadgen",  # load against a live engine; the console shows its --compare
    "agentobs.cli": "cli",
    "agentobs.sim": "sim",
}
ORDER = ["base", "store", "collect", "model", "source", "metrics", "findings", "loadgen", "surface", "cli"]
SIM_IMPORTS = {"base", "store"}  # what the simulator may import (its truth stays independent of what it checks)
SIM_IMPORTED_BY = {"findings", "loadgen", "surface", "cli", "sim"}  # who may import the simulator (replays, load)


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(ROOT.rglob("*.py")):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def layer(module: str) -> str:
    best = max((p for p in LAYER_OF if module == p or module.startswith(p + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"{module}: in no layer (add it to LAYER_OF and to docs/architecture.md)")
    return LAYER_OF[best]


def package(module: str) -> str:
    """The unit that may import itself freely: agentobs.<first part> (a top-level module is its own)."""
    return ".".join(module.split(".")[:2])


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported agentobs module) for every import statement anywhere in the file."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "agentobs"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "agentobs":
                continue
            # `from . import x` / `from .. import model`: the names may be modules
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((node.lineno, sub if _is_module(sub) else target))
    return out


def _is_module(name: str) -> bool:
    p = ROOT.parent.joinpath(*name.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def allowed(src: str, dst: str) -> bool:
    if package(src) == package(dst):
        return True
    a, b = layer(src), layer(dst)
    if a == "sim":
        return b in SIM_IMPORTS
    if b == "sim":
        return a in SIM_IMPORTED_BY
    if a == b == "surface":
        return False  # report, exporter and console stand side by side
    return ORDER.index(b) <= ORDER.index(a)


def violations() -> list[str]:
    out = []
    for mod, path in modules().items():
        for line, target in imports(mod, path):
            if not allowed(mod, target):
                out.append(f"{path.relative_to(ROOT.parent)}:{line}: {mod} ({layer(mod)}) imports {target} "
                           f"({layer(target)})")
    return out


def test_every_module_is_in_a_layer():
    placed = {mod: layer(mod) for mod in modules()}  # layer() raises, naming a module that is in none
    assert len(placed) > 100 and placed["agentobs.model.state"] == LAYER_OF["agentobs.model"]


def test_imports_point_down_the_layers():
    bad = violations()
    assert not bad, "imports against the layer rule (docs/architecture.md, Layers):\n" + "\n".join(bad)


@pytest.mark.parametrize("src,dst,ok", [
    ("agentobs.collect.files", "agentobs.store.writer", True),  # collect writes the store
    ("agentobs.collect.service", "agentobs.model.kvindex", False),  # the model's upkeep is handed in
    ("agentobs.store.db", "agentobs.model", False),  # the store creates no views
    ("agentobs.metrics.run", "agentobs.source", True),
    ("agentobs.backends.clickhouse.metrics", "agentobs.metrics.run", False),  # the old circle
    ("agentobs.sim.engine", "agentobs.collect.files", False),  # the simulator imports nothing above the store
    ("agentobs.findings.replay", "agentobs.sim.engine", True),
    ("agentobs.metrics.run", "agentobs.sim.engine", False),
    ("agentobs.report.build", "agentobs.console.data", False),  # surfaces side by side
    ("agentobs.cli.report", "agentobs.report", True),
])
def test_the_rule_itself(src, dst, ok):
    # the checker on hand-picked arrows, so a rule that lets everything through cannot pass the test above
    assert allowed(src, dst) is ok


def test_lazy_imports_are_seen(tmp_path):
    # a function-level import counts as much as a module-level one
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from ..metrics import run\n    return run\n")
    assert imports("agentobs.store.m", f) == [(2, "agentobs.metrics.run")]


# -- the backend in one place -----------------------------------------------------------------------------------
TYPE_TESTS = re.compile(r"isinstance\([^)]*(DuckDBPyConnection|ClickHouse)\b|\bis_clickhouse\(")


def test_only_the_source_tests_the_backend_type():
    bad = [f"{p.relative_to(ROOT.parent)}:{i}: {line.strip()}"
           for mod, p in modules().items() if mod != "agentobs.source"
           for i, line in enumerate(p.read_text().splitlines(), 1) if TYPE_TESTS.search(line)]
    assert not bad, "\n".join(bad)


def test_the_store_path_is_one_setting():
    # the default path and its environment variable are the setting `db`'s (agentobs/config.py); code elsewhere
    # names them only in prose (docstrings, help) or when it hands the path to a child process
    code = re.compile(r"""environ(\.get)?\(\s*["']AGENTOBS_DB|getenv\(\s*["']AGENTOBS_DB|envvar=["']AGENTOBS_DB""")
    bad = [f"{p.relative_to(ROOT.parent)}:{i}" for mod, p in modules().items()
           for i, line in enumerate(p.read_text().splitlines(), 1) if code.search(line)]
    assert not bad, bad
