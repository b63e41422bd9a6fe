"""The ``agentobs`` command line run in-process: ``agentobs.cli.main`` (its one-line errors and exit codes included)
under click's CliRunner isolation. It gives what ``subprocess.run([python, "-m", "agentobs.cli", ...])`` gave the
tests — the exit status, stdout and stderr — without starting an interpreter and importing agentobs again per
call. End-to-end tests (a collector, a console server) still start real processes."""

from __future__ import annotations

import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass

from click.testing import CliRunner

from agentobs.cli import main
from agentobs.cli.base import err_console


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@contextmanager
def _error_console_width(env: dict[str, str | None] | None):
    """The error console as a new process would size it from ``env``'s $COLUMNS: rich reads $COLUMNS when the
    console is made, at import, and pytest-xdist workers have COLUMNS=80 by then."""
    if env is None or "COLUMNS" not in env:
        yield
        return
    cols = env["COLUMNS"]
    old = err_console._width
    err_console._width = int(cols) if cols and cols.isdigit() else None  # None: sized when it prints
    try:
        yield
    finally:
        err_console._width = old


def run_cli(*args, env: dict[str, str | None] | None = None) -> Result:
    """``agentobs ARGS``; ``env`` overrides the environment for the call (None removes a variable)."""
    with CliRunner().isolation(env=env) as (out, err, _), _error_console_width(env):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # noqa: BLE001 - what the interpreter does with an uncaught one (main re-raises on --debug)
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        return Result(code, out.getvalue().decode(), err.getvalue().decode())
