"""`agentobs` commands: console."""

from __future__ import annotations

import click

from .base import Ctx, backend_opts, cli, common, err_console


# --- console ---------------------------------------------------------------------------------------
@cli.command("console")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=int, default=8501, show_default=True, help="Port (0 picks a free one).")
@backend_opts
@common
def console_cmd(ctx: Ctx, host, port, backend=None, clickhouse_url=None):
    """Start the Streamlit console on the store (opened read-only), or on ClickHouse with --backend
    clickhouse; Ctrl-C stops it."""
    import socket

    from ..backends.source import resolve
    from ..console import launch
    from ..store.db import connect

    name, url = resolve(ctx.settings, backend, clickhouse_url)
    if name == "clickhouse":
        from ..backends.clickhouse.conn import ClickHouse
        from ..errors import StoreError

        ch = ClickHouse(url)  # fail now, in one line, if ClickHouse is unreachable or has no agentobs model
        try:
            if not ch.arrow("SELECT count() AS n FROM system.tables WHERE database = currentDatabase() "
                            "AND name = 'llm_calls'").column(0)[0].as_py():
                raise StoreError(f"no agentobs model at {ch} (view llm_calls missing): "
                                 "run `agentobs clickhouse init --clickhouse-url …` first")
            where = f"ClickHouse {ch}"
        finally:
            ch.close()  # chDB: this process lets go of the path before the app opens it
    else:
        connect(ctx.db, read_only=True).close()  # fail now, in one line, if the store is missing or unreadable
        where = f"store {ctx.db} (read-only)"
    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    err_console.print(f"agentobs console on http://{host}:{port}/ — {where}")
    import signal

    proc = launch(ctx.db, host=host, port=port, backend=name, clickhouse_url=url)

    def _stop(signum, _frame):  # SIGTERM/SIGINT to us: stop the Streamlit child too, never orphan it
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001 - a child that ignores SIGTERM is killed
            proc.kill()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    raise SystemExit(proc.wait())
# --- end console -----------------------------------------------------------------------------------
