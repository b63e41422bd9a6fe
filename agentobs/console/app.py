"""Entry script of the agentobs console (``streamlit run`` executes this file; see docs/console.md)."""

from agentobs.console.shell import run

run()
