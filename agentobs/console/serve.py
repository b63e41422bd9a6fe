"""``python -m agentobs.console.serve ARGS``: the ``streamlit ARGS`` command line (``agentobs console`` runs
``serve run app.py …``) with the console's modules imported first.

Streamlit imports an app's modules when the first page runs, so the first visit after a start waited ~1 s
(measured on sample_data: Overview 3.9–4.6 s first, 3.2 s with the modules loaded) for pandas, polars, altair,
the console and the metric catalogue. Imported here, before the server listens, that cost is paid at start.
A module that fails to import here is left to fail (with its message) where the page imports it.
"""

from __future__ import annotations

import importlib
import sys

# what the pages import (directly or through Streamlit's charts and dataframes)
PRELOAD = (
    "pandas", "altair", "polars", "pyarrow",
    "agentobs.console.shell", "agentobs.console.data", "agentobs.console.metrics", "agentobs.console.findings",
    "agentobs.console.charts", "agentobs.console.ui", "agentobs.metrics.run", "agentobs.findings",
)


def preload() -> list[str]:
    """Import PRELOAD and parse the metric catalogue; the names that failed (the page reports those itself)."""
    failed = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not ours to report here: the page that imports it will
            failed.append(name)
    try:
        from ..metrics import catalogue

        catalogue()
    except Exception:  # noqa: BLE001 - a bad metric file is reported by the pages that read the catalogue
        failed.append("agentobs.metrics.catalogue")
    return failed


def main(argv: list[str] | None = None) -> None:
    preload()
    from streamlit.web import cli

    cli.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="streamlit")


if __name__ == "__main__":
    main()
