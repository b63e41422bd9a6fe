"""The Streamlit console (``agentobs console``): app shell, pages, and the launcher.

The app ships inside the package (``app.py`` + ``views/``) so it runs from an installed wheel;
``dashboards/console.py`` in a checkout is a thin entry that runs the same app.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"


def command(host: str = "127.0.0.1", port: int = 8501, app: Path = APP) -> list[str]:
    """The ``streamlit run`` command line: loopback by default, no telemetry, no browser, no file watcher; run
    through agentobs.console.serve, which imports the console's modules before the server listens."""
    return [
        sys.executable, "-m", "agentobs.console.serve", "run", str(app),
        "--server.address", host,
        "--server.port", str(port),
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--runner.magicEnabled", "false",  # the pages write explicitly; no AST rewrite of each page on its first run
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "viewer",
        "--theme.base", "light",
    ]


def launch(db: str | None, host: str = "127.0.0.1", port: int = 8501, env: dict | None = None,
           backend: str = "duckdb", clickhouse_url: str | None = None) -> subprocess.Popen:
    """Start the console as a subprocess on ``db`` (opened read-only by the app), or on ClickHouse
    (``backend="clickhouse"``). The choice reaches the app in its environment (``AGENTOBS_BACKEND``,
    ``AGENTOBS_CLICKHOUSE_URL``), not on its command line, where a URL's password would be visible to
    every user of the machine."""
    child_env = dict(os.environ if env is None else env)
    child_env["AGENTOBS_BACKEND"] = backend
    if backend == "clickhouse":
        child_env["AGENTOBS_CLICKHOUSE_URL"] = str(clickhouse_url)
    elif db is not None:
        child_env["AGENTOBS_DB"] = str(Path(db).resolve())
    return subprocess.Popen(command(host, port), env=child_env)
