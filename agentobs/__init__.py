"""agentobs: per-session observability for LLM inference fleets serving agent traffic."""

__version__ = "0.1.0"
