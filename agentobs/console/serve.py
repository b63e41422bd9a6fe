"""``python -m agentobs.console.serve ARGS``: the ``streamlit ARGS`` command line (``agentobs console`` runs
``serve run app.py …``) with the console's modules imported first.

Streamlit imports an app's modules when the first page runs, so the first visit after a start waited for
pandas, polars, altair, the console and the metric catalogue (docs/console.md, "Modules at start"). Imported
here, before the server listens, that cost is paid at start.
A module that fails to import here is left to fail (with its message) where the page imports it.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading

# what the pages import (directly or through Streamlit's charts and dataframes)
PRELOAD = (
    "pandas", "altair", "polars", "pyarrow",
    "agentobs.console.shell", "agentobs.console.data", "agentobs.console.metrics", "agentobs.console.findings",
    "agentobs.console.charts", "agentobs.console.ui", "agentobs.metrics.run", "agentobs.findings",
)


# Streamlit checks an @st.cache_data function's parameters when the module defining it is imported and, with no
# server running yet, warns once per function that it would use an in-memory cache — which is what it uses
# anyway (the cache itself is made at the first call, by then from the server's runtime). Quiet during preload.
_QUIET = ("streamlit.runtime.caching.cache_data_api", "streamlit.runtime.caching.cache_resource_api")


def preload() -> list[str]:
    """Import PRELOAD and parse the metric catalogue; the names that failed (the page reports those itself)."""
    import streamlit  # noqa: F401 - creates the loggers quieted below

    quiet = {name: logging.getLogger(name) for name in _QUIET}
    levels = {name: log.level for name, log in quiet.items()}
    for log in quiet.values():
        log.setLevel(logging.ERROR)
    failed = []
    try:
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
    finally:
        for name, log in quiet.items():
            log.setLevel(levels[name])
    _skip_direct_run_check()
    return failed


def _skip_direct_run_check() -> None:
    """Streamlit asks once per process, at the first element a page writes, whether it is run from a REPL or by
    ``python app.py`` rather than ``streamlit run``, to print a hint. The REPL test is ``inspect.stack()`` from
    the page's frame, which resolves the module of every frame by scanning ``sys.modules`` (a realpath per module
    and frame once pandas and polars are imported; docs/console.md). This process is ``streamlit run`` by
    construction, so the answer is known: mark the hint as given. (A private flag of
    ``streamlit.delta_generator``; if a Streamlit release drops it, nothing changes but the time.)"""
    from streamlit import delta_generator

    if hasattr(delta_generator, "_use_warning_has_been_displayed"):
        delta_generator._use_warning_has_been_displayed = True


def warm_default_view(db: str) -> list[str]:
    """Compute what the Overview of the default view (all data, no filters) reads, into the console's caches
    (st.cache_data: the same functions with the same arguments as the page, so its first render is a cache hit):
    the sidebar's bounds and filter options, the Overview's metrics (one preparation) and the findings, sharing
    that preparation as the page does. Returns the parts that failed (the page computes and reports those)."""
    from . import data, findings, metrics, shell

    failed = []
    stamp = data.db_stamp(db)
    for name, fn in (("bounds", shell.bounds), ("options", shell.options)):
        try:
            fn(stamp)
        except Exception:  # noqa: BLE001 - the page reports it
            failed.append(name)
    with metrics.one_preparation():
        try:
            metrics.warm(stamp, "overview")
        except Exception:  # noqa: BLE001
            failed.append("metrics")
        # the Overview's tax ledger (agentobs/console/findings.py), without and with the simulator replay: the
        # page's two draws of its first screen
        for simulate in (False, True):
            try:
                findings._ledger(stamp, None, None, (), simulate)
            except Exception:  # noqa: BLE001
                failed.append("findings")
                break
    return failed


def _warm_when_serving(timeout_s: float = 60.0) -> None:
    """Once Streamlit's runtime is up (its cache storage is then the one the pages use), warm the default view
    of a DuckDB store (the setting ``db``; ClickHouse is not warmed). A visitor arriving meanwhile waits on the same
    computation (st.cache_data's per-key compute lock) rather than repeating it. Without a store it does nothing."""
    import os
    import time

    from ..config import load_settings

    try:
        settings = load_settings()  # $AGENTOBS_DB / $AGENTOBS_BACKEND, which `agentobs console` sets for the app
    except Exception:  # noqa: BLE001 - the app reports a bad settings file
        return
    db = str(settings.db)
    if str(settings.backend).strip().lower() != "duckdb" or not os.path.exists(db):
        return
    from streamlit.runtime import Runtime

    deadline = time.monotonic() + timeout_s
    while not Runtime.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    # the warm-up runs outside a page: Streamlit would warn that there is no page context for each cached call
    quiet = logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        t = time.perf_counter()
        failed = warm_default_view(db)
        logging.getLogger("agentobs.console").info(
            "warmed the default Overview in %.2f s%s", time.perf_counter() - t,
            f" (failed: {', '.join(failed)})" if failed else "")
    except Exception:  # noqa: BLE001 - a warm-up must never take the server down
        pass
    finally:
        quiet.setLevel(level)


def main(argv: list[str] | None = None) -> None:
    preload()
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["run"] and os.environ.get("AGENTOBS_CONSOLE_WARM", "1") != "0":
        threading.Thread(target=_warm_when_serving, name="agentobs-warm", daemon=True).start()
    from streamlit.web import cli

    cli.main(args=args, prog_name="streamlit")


if __name__ == "__main__":
    main()
