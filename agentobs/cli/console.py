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

    from ..console import launch
    from ..source import make_source, resolve

    name, url = resolve(ctx.settings, backend, clickhouse_url)
    src = make_source(ctx.settings, name, url, ctx.db)
    try:
        src.check()  # fail now, in one line, if the store is missing or ClickHouse has no agentobs model
        where = src.where()
    finally:
        src.close()  # chDB: this process lets go of the path before the app opens it
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
