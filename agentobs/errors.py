"""One exception hierarchy. Messages quote the offending input and suggest the fix.

The CLI prints ``str(error)`` on one line and exits non-zero; tracebacks only with ``--debug``.
"""

from __future__ import annotations


class AgentobsError(Exception):
    """Base class of every error agentobs raises on purpose."""

    exit_code = 1


class ConfigError(AgentobsError):
    """A setting or settings file is wrong."""

    exit_code = 2


class InputError(AgentobsError):
    """Input data (a file, a payload) could not be decoded.

    ``where`` names the file and position (line, byte offset, or JSON path) so a person can find it.
    """

    def __init__(self, message: str, where: str | None = None):
        self.message = message
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class QueryError(AgentobsError):
    """A user SQL query was refused or failed."""

    exit_code = 3


class StoreError(AgentobsError):
    """The DuckDB store cannot be opened or migrated."""


def did_you_mean(word: str, options, listing: str | None = None) -> str:
    """The hint an unknown-name message ends with: `` (did you mean 'x'?)`` for the closest of ``options``, else
    `` (<listing> a, b, c)`` with the options in the order given when ``listing`` is set (e.g. ``"known:"``), else
    ``""``."""
    import difflib

    options = list(options)
    close = difflib.get_close_matches(word, options, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" ({listing} {', '.join(options)})" if listing else ""
