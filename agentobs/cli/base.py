"""The command group, the options every command shares, and the output helpers."""

from __future__ import annotations

import functools
import sys

import click
from rich.console import Console
from rich.markup import escape

from .. import __version__
from ..config import Settings, load_settings
from ..errors import AgentobsError

err_console = Console(stderr=True)
# --db: the setting ``db`` when absent ($AGENTOBS_DB, the settings file, ./agentobs.duckdb: agentobs.config)
DB_HELP = "DuckDB file (default: setting db, i.e. $AGENTOBS_DB or ./agentobs.duckdb)."
console = Console()


class Ctx:
    def __init__(self, db: str | None, config: str | None, debug: bool):
        self._db = db
        self.config = config
        self.debug = debug
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config)
        return self._settings

    @property
    def db(self) -> str:
        return self._db or self.settings.db


def common(f):
    """--db, --config and --debug on every command (also accepted before the command name)."""

    @click.option("--db", "db", default=None, help=DB_HELP)
    @click.option("--config", "config", envvar="AGENTOBS_CONFIG", default=None, help="Settings file (TOML).")
    @click.option("--debug", is_flag=True, default=False, help="Show tracebacks.")
    @click.pass_context
    @functools.wraps(f)
    def wrapper(click_ctx, db, config, debug, *args, **kwargs):
        parent = click_ctx.find_object(Ctx)
        ctx = Ctx(db or (parent._db if parent else None), config or (parent.config if parent else None),
                  debug or (parent.debug if parent else False))
        click_ctx.obj = ctx
        return f(ctx, *args, **kwargs)

    return wrapper


# --- backend choice (agentobs/source.py, docs/clickhouse.md) --------------------------------
def backend_opts(f):
    """--backend duckdb|clickhouse and --clickhouse-url (defaults: settings backend / clickhouse_url, also
    $AGENTOBS_BACKEND / $AGENTOBS_CLICKHOUSE_URL)."""
    f = click.option("--clickhouse-url", "clickhouse_url", default=None,
                     help="ClickHouse for --backend clickhouse: chdb:///DIR (in-process) or "
                          "http(s)://user:pass@host:8123/db (default: setting clickhouse_url).")(f)
    return click.option("--backend", "backend", type=click.Choice(["duckdb", "clickhouse"]), default=None,
                        help="Read the DuckDB store (--db) or ClickHouse (--clickhouse-url); default: setting "
                             "backend (duckdb).")(f)


def _source(ctx: Ctx, backend: str | None, clickhouse_url: str | None):
    """The command's Source (agentobs.source), as a context that closes it: the store, or ClickHouse."""
    from ..source import open_source

    return open_source(ctx.settings, backend, clickhouse_url, ctx.db)
# --- end backend choice ----------------------------------------------------------------------------


def _filters(filters) -> dict[str, list[str]]:
    """Repeated ``--filter KEY=VALUE`` options as {key: [values]} (what the metrics and findings APIs take)."""
    flt: dict[str, list[str]] = {}
    for f in filters:
        key, sep, value = f.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--filter {f!r}: expected KEY=VALUE, e.g. --filter instance=10.0.0.1:8000")
        flt.setdefault(key.strip(), []).append(value)
    return flt


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--db", default=None, help=DB_HELP)
@click.option("--config", default=None, envvar="AGENTOBS_CONFIG", help="Settings file (TOML).")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(__version__, prog_name="agentobs")
@click.pass_context
def cli(click_ctx, db, config, debug):
    """agentobs — per-session observability for LLM inference fleets serving agents."""
    click_ctx.obj = Ctx(db, config, debug)


def _open(ctx: Ctx, read_only: bool = False):
    """The store with the session model (read-write opens migrate and ensure the model's views)."""
    from ..model import connect

    return connect(ctx.db, read_only=read_only)


def _writer(con, ctx: Ctx):
    from ..store.writer import Writer

    return Writer(con, batch_rows=ctx.settings.writer_batch_rows, flush_s=ctx.settings.writer_flush_s)


def _progress(total: int, label: str):
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    p = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                 console=err_console, transient=True, disable=not err_console.is_terminal)
    task = p.add_task(label, total=total)
    return p, (lambda n: p.advance(task, n))


def _summary(res, what: str) -> None:
    dup = f", {res.duplicates:,} already present" if res.duplicates else ""
    line = (f"{what}: {res.files} file(s), {res.accepted:,} accepted ({res.inserted:,} new{dup}), "
            f"{res.rejected:,} rejected")
    err_console.print(line)
    for e in res.errors[:20]:
        err_console.print(f"  [red]error[/red] {e}", highlight=False)
    if len(res.errors) > 20:
        err_console.print(f"  … {len(res.errors) - 20} more errors")
    for w in res.warnings[:10]:
        err_console.print(f"  [yellow]warning[/yellow] {w}", highlight=False)
    if len(res.warnings) > 10:
        err_console.print(f"  … {len(res.warnings) - 10} more warnings")


def _exit_for(res) -> None:
    if res.accepted == 0 and (res.rejected or res.errors):
        raise SystemExit(1)

def _emit(table, fmt, title):
    from ..output import render

    data = render(table, fmt, title=title, console=console, full=_full_hint())
    if data is not None:
        sys.stdout.buffer.write(data)


def _full_hint() -> str | None:
    """The other --format choices of the running command (where a shortened table's full values are), if any."""
    ctx = click.get_current_context(silent=True)
    for p in (ctx.command.params if ctx else ()):
        if p.name == "fmt" and isinstance(p.type, click.Choice):
            others = [c for c in p.type.choices if c not in ("table", "parquet")]
            return f"--format {'|'.join(others)}" if others else None
    return None


def main(argv: list[str] | None = None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="agentobs", standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        raise SystemExit(130) from None
    except click.ClickException as e:
        e.show()
        raise SystemExit(e.exit_code) from None
    except AgentobsError as e:
        if debug:
            raise
        err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)  # "[cost]" is text, not markup
        raise SystemExit(e.exit_code) from None
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - one line unless --debug
        if debug:
            raise
        err_console.print(f"[red]internal error:[/red] {type(e).__name__}: {escape(str(e))} (rerun with --debug for "
                          "the traceback)",
                          highlight=False)
        raise SystemExit(70) from None
