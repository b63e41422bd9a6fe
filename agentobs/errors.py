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
