"""`agentobs model`: the maintained session model (agentobs.model.state)."""

from __future__ import annotations

import click

from .base import Ctx, _open, cli, common


@cli.group(name="model")
def model_():
    """The maintained session model: call_reuse's rows kept in the store (docs/architecture.md)."""


def _echo(r) -> None:
    why = f" ({r.reason})" if r.reason else ""
    click.echo(f"session model {r.mode}{why}: {r.derived:,} calls of {r.sessions:,} sessions derived, "
               f"{r.calls:,} stored ({r.seconds:.2f} s)")


@model_.command("refresh")
@common
def model_refresh_cmd(ctx: Ctx):
    """Bring it up to date: only the sessions touched since the last refresh (a rebuild if there is none yet, or
    it was built with other settings)."""
    from ..model.state import refresh

    _derive(ctx, refresh)


def _derive(ctx: Ctx, fn) -> None:
    """Run ``fn(con, settings)`` (refresh or rebuild) on an existing store and print what it did."""
    _open(ctx, read_only=True).close()  # an existing store only: one clear line if it is missing, none created
    con = _open(ctx)
    try:
        _echo(fn(con, ctx.settings))
    finally:
        con.close()


@model_.command("rebuild")
@common
def model_rebuild_cmd(ctx: Ctx):
    """Derive it whole, e.g. after changing default_block_size, abandoned_after_s or hit_tolerance_blocks (refresh also rebuilds when
    it sees such a change)."""
    from ..model.state import rebuild

    _derive(ctx, rebuild)


@model_.command("status")
@common
def model_status_cmd(ctx: Ctx):
    """Whether it is current for the store and the settings (metric runs read it only then)."""
    from ..model.state import status

    con = _open(ctx, read_only=True)
    try:
        click.echo(status(con, ctx.settings))
    finally:
        con.close()


@model_.command("compact")
@click.option("--max-seconds", type=float, default=None,
              help="Stop after this many seconds (checked between groups of segments); default: merge them all.")
@common
def model_compact_cmd(ctx: Ctx, max_seconds):
    """Merge the store's span segments (span_store = segments) into large Parquet files, each span once, merge
    runs of small merged files again, and delete the small files (agentobs collect does this in the background;
    docs/collectors.md)."""
    from ..store import segments

    _open(ctx, read_only=True).close()  # an existing store only
    con = _open(ctx)
    try:
        out = segments.compact(con, max_seconds=max_seconds)
        gone = segments.sweep(con, 0.0)
        click.echo(f"span segments: {out.segments:,} merged into {out.files:,} file(s) ({out.rows:,} spans written, "
                   f"copies of stored spans skipped; {out.promoted:,} large segment(s) listed as they are), {out.left:,} left; "
                   f"{out.remerged:,} merged file(s) merged again; "
                   f"{gone:,} files deleted ({out.seconds:.2f} s)")
    finally:
        con.close()
