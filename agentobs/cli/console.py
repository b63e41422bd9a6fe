"""`agentobs` commands: console."""

from __future__ import annotations

import signal
import subprocess
import time

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
    raise SystemExit(run_child(launch(ctx.db, host=host, port=port, backend=name, clickhouse_url=url)))


def run_child(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """Wait for the console's Streamlit child and return our exit status: the child's, or 128 + the signal when
    SIGTERM/SIGINT reached us. Such a signal is passed on to the child (never orphaned); a child still running
    ``grace_s`` later is killed.

    The handler only signals the child: the wait stays here, in short polls. (A handler that waits for the child
    itself, inside a blocking ``proc.wait()``, cannot reap it — the interrupted wait holds Popen's wait lock — so it
    used to sit out its whole timeout and kill a child that had long exited.)"""
    stop: list[int] = []

    def _stop(signum, _frame):
        if not stop:
            proc.terminate()
        stop.append(signum)

    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop_at = None
        while True:
            try:
                code = proc.wait(0.2)
            except subprocess.TimeoutExpired:
                if stop:
                    stop_at = stop_at or time.monotonic()
                    if time.monotonic() - stop_at > grace_s:
                        proc.kill()  # a child that ignores SIGTERM
                continue
            return 128 + stop[0] if stop else code
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
# --- end console -----------------------------------------------------------------------------------
