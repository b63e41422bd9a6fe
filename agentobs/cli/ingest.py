"""`agentobs` commands: ingest."""

from __future__ import annotations

import click

from .base import Ctx, _exit_for, _open, _progress, _summary, _writer, cli, common, err_console


# -- import ----------------------------------------------------------------------------------------
@cli.group(name="import")
def import_():
    """Import telemetry files into the store (idempotent: re-importing adds nothing)."""


@import_.command("otlp")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@common
def import_otlp_cmd(ctx: Ctx, paths):
    """OTLP traces: OTLP/JSON (one document or JSON lines, as the Collector file exporter writes)
    or protobuf (single or length-prefixed); .gz transparently; directories recursively."""
    from ..collect.files import OTLP_SUFFIXES, expand, import_otlp

    files = expand(paths, OTLP_SUFFIXES)
    total = sum(f.stat().st_size for f in files)
    con = _open(ctx)
    with _writer(con, ctx) as w:
        p, adv = _progress(total, "otlp")
        with p:
            res = import_otlp(paths, w, ctx.settings, progress=adv)
    _summary(res, "spans")
    _exit_for(res)


@import_.command("tracelab")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@common
def import_tracelab_cmd(ctx: Ctx, paths):
    """TraceLab per-call rows (JSON lines, .gz too; https://github.com/uw-syfi/TraceLab): Claude Code / Codex
    sessions as their harness recorded them become ordinary sessions (an invoke_agent root, a chat span per
    round with its token split, execute_tool spans); see docs/cli.md."""
    from ..collect.tracelab import import_tracelab

    con = _open(ctx)
    with _writer(con, ctx) as w:
        res = import_tracelab(paths, w, ctx.settings)
    con.close()
    _summary(res, "tracelab rounds → spans")
    _exit_for(res)


@import_.command("prom")
@click.argument("path", type=click.Path(exists=True))
@click.option("--instance", required=True, help="Engine instance, host:port (as server.address:server.port on spans).")
@click.option("--at", default=None, help="Snapshot time (epoch seconds or ISO-8601); a directory's files are timed by their names.")
@common
def import_prom_cmd(ctx: Ctx, path, instance, at):
    """Prometheus text snapshots of an engine's /metrics (a file, or a directory of <epoch>.prom files)."""
    from ..collect.files import expand, import_prom, parse_at

    files = expand([path], (".prom", ".txt", ".metrics"))
    con = _open(ctx)
    with _writer(con, ctx) as w:
        p, adv = _progress(sum(f.stat().st_size for f in files), "prom")
        with p:
            res = import_prom([path], instance, w, at=parse_at(at), progress=adv)
    _summary(res, "samples")
    _exit_for(res)


@import_.command("server-info")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--instance", required=True, help="Engine instance, host:port.")
@click.option("--at", default=None, help="Capture time (epoch seconds or ISO-8601); default: the file's mtime.")
@common
def import_server_info_cmd(ctx: Ctx, path, instance, at):
    """SGLang GET /server_info JSON (secrets redacted before storing)."""
    from ..collect.files import import_server_info, parse_at

    con = _open(ctx)
    with _writer(con, ctx) as w:
        res = import_server_info(path, instance, w, at=parse_at(at))
    _summary(res, "config keys")


@import_.command("kv-events")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--instance", default=None, help="Instance for lines that do not name one.")
@common
def import_kv_cmd(ctx: Ctx, paths, instance):
    """KV-cache event captures (JSON lines of vLLM KVEventBatch payloads; see docs/cli.md)."""
    from ..collect.files import import_kv_events

    con = _open(ctx)
    with _writer(con, ctx) as w:
        res = import_kv_events(paths, w, instance)
    _summary(res, "kv events")
    _kv_index(con)
    con.close()
    _exit_for(res)


def _kv_index(con) -> None:
    """Refresh the stored KV-event index after an import that wrote KV events (agentobs.model.kvindex)."""
    from ..model.kvindex import refresh

    try:
        b = refresh(con)
    except Exception as e:  # noqa: BLE001 - the import itself is committed; runs derive the index inline
        err_console.print(f"[yellow]warning[/yellow] kv index not refreshed ({type(e).__name__}: {e}); metric runs "
                          "derive it from kv_events until `agentobs kv-index` succeeds", highlight=False)
        return
    if b.rebuilt:
        err_console.print(f"kv index: {b.sessions:,} sessions, {b.removals:,} removals of their blocks "
                          f"({b.seconds:.2f} s)")


@cli.command("kv-index")
@click.option("--force", is_flag=True, default=False, help="Rebuild even when the index is current.")
@common
def kv_index_cmd(ctx: Ctx, force):
    """Build or refresh the KV-event index metric runs read instead of re-deriving it (docs/metrics.md)."""
    from ..model.kvindex import refresh

    _open(ctx, read_only=True).close()  # an existing store only: one clear line if it is missing, none created
    con = _open(ctx)
    b = refresh(con, force=force)
    con.close()
    state = "rebuilt" if b.rebuilt else "already current"
    click.echo(f"kv index {state}: {b.sessions:,} sessions, {b.removals:,} removals ({b.seconds:.2f} s)")
