"""`agentobs` commands: findings."""

from __future__ import annotations

import sys

import click

from ..errors import AgentobsError
from .base import Ctx, _emit, _filters, _open, _source, backend_opts, cli, common, console, err_console


# --- findings --------------------------------------------------------------------------------------
def _ledger(ctx: Ctx, since, until, filters, backend=None, clickhouse_url=None, include_acked=False,
            simulate=True):
    from ..findings import build

    with _source(ctx, backend, clickhouse_url) as src:  # ClickHouse: no acknowledgements (docs/clickhouse.md)
        return build(src, since=since, until=until, filters=_filters(filters) or None, settings=ctx.settings,
                     include_acked=include_acked, simulate=simulate)


@cli.group("findings", invoke_without_command=True)
@click.option("--since", default=None, help="Window start: ISO-8601, epoch seconds, or a span before now (24h, 7d). "
              "Default: findings_default_window_s (7 days) before --until or the newest call.")
@click.option("--until", default=None, help="Window end (exclusive), same forms as --since.")
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE",
              help="Only calls with KEY=VALUE (instance, model, engine, task_type, tenant, agent_name, session, task); "
                   "repeatable. The ledger (tax, ownership, scaling) is computed over those calls.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown", "ledger"]), default="table",
              help="json: the findings, one object each; ledger: the whole ledger (window, the fleet's tax by cause "
                   "and over time, the findings).")
@click.option("--all", "show_all", is_flag=True, default=False, help="Also show acknowledged findings.")
@click.option("--no-simulate", "no_simulate", is_flag=True, default=False,
              help="Skip the simulator replay: recoverable tax from the analytical estimate only (faster).")
@backend_opts
@common
def findings_cmd(ctx: Ctx, since, until, filters, fmt, show_all, no_simulate, backend, clickhouse_url):
    """The recompute-tax ledger: the fleet's tax per week, and the default configs behind it with evidence, $ per
    week, the sessions affected and the exact fix (docs/findings.md). Subcommands list a finding's sessions and
    acknowledge a finding until a date."""
    if click.get_current_context().invoked_subcommand:
        return
    from ..findings.render import headline, to_json, to_markdown, to_table

    ledger = _ledger(ctx, since, until, filters, backend, clickhouse_url, show_all, not no_simulate)
    found = list(ledger.findings)
    if fmt == "json":
        sys.stdout.buffer.write(to_json(found))
    elif fmt == "ledger":
        sys.stdout.buffer.write(ledger.to_json())
    elif fmt == "markdown":
        sys.stdout.write("\n".join(headline(ledger)) + "\n\n" + to_markdown(found))
    else:
        for line in headline(ledger):  # one line each, cut at the terminal's width (the full text: --format ledger)
            console.print(line, highlight=False, markup=False, no_wrap=True, overflow="ellipsis", crop=True)
        if found:
            _emit(to_table(found), "table", f"findings ({len(found)}; details: --format markdown; sessions: "
                                            "agentobs findings sessions ID)")
    err_console.print(f"{len(found)} finding(s)" + ("" if found else ": no default config is costing a recompute tax"),
                      highlight=False)


@findings_cmd.command("sessions")
@click.argument("finding_id")
@click.option("--since", default=None, help="Window start, as for `agentobs findings`.")
@click.option("--until", default=None, help="Window end (exclusive).")
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE", help="As for `agentobs findings`.")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@backend_opts
@common
def findings_sessions_cmd(ctx: Ctx, finding_id, since, until, filters, limit, fmt, backend, clickhouse_url):
    """The sessions FINDING_ID owns calls of (its tax), most $ first: then `agentobs calls --session ID`."""
    import pyarrow as pa

    ledger = _ledger(ctx, since, until, filters, backend, clickhouse_url, include_acked=True, simulate=False)
    if ledger.get(finding_id) is None:
        ids = [f.id for f in ledger.findings]
        raise AgentobsError(f"no finding {finding_id!r} in this window" + (f"; findings: {', '.join(ids)}" if ids
                                                                            else ""))
    rows = ledger.sessions_of(finding_id)
    schema = pa.schema([("session_id", pa.string()), ("calls", pa.int64()), ("reprefill_tokens", pa.float64()),
                        ("usd_window", pa.float64()), ("usd_week", pa.float64())])
    table = pa.Table.from_pylist(rows[:limit], schema=schema)
    _emit(table, fmt, f"{finding_id}: {len(rows)} session(s) affected" + (f", top {limit}" if len(rows) > limit
                                                                          else ""))


@findings_cmd.command("ack")
@click.argument("finding_id")
@click.option("--reason", required=True, help="Why it is accepted for now (stored with the acknowledgement).")
@click.option("--until", "until", required=True, help="Until when: a date (2026-11-30), ISO-8601 time, or a span (14d).")
@common
def findings_ack_cmd(ctx: Ctx, finding_id, reason, until):
    """Acknowledge finding FINDING_ID (rule/scope, as `agentobs findings` prints it) until a date."""
    from ..findings.acks import add, parse_until

    con = _open(ctx)
    a = add(con, finding_id, reason, parse_until(until))
    con.close()
    err_console.print(f"acknowledged {finding_id} until {a['until']:%Y-%m-%d %H:%M} UTC", highlight=False)


@findings_cmd.command("unack")
@click.argument("finding_id")
@common
def findings_unack_cmd(ctx: Ctx, finding_id):
    """Withdraw the acknowledgement of FINDING_ID."""
    from ..findings.acks import remove

    con = _open(ctx)
    ok = remove(con, finding_id)
    con.close()
    if not ok:
        raise AgentobsError(f"no acknowledgement for {finding_id!r} (see `agentobs findings acks`)")
    err_console.print(f"removed the acknowledgement of {finding_id}", highlight=False)


@findings_cmd.command("acks")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
@common
def findings_acks_cmd(ctx: Ctx, fmt):
    """List acknowledgements (active and lapsed)."""
    import pyarrow as pa

    from ..findings.acks import all_acks

    con = _open(ctx, read_only=True)
    rows = all_acks(con)
    cols = ("finding_id", "reason", "until", "created_at", "created_by")
    _emit(pa.table({c: [r[c] for r in rows] for c in cols}) if rows else
          pa.table({c: pa.array([], pa.string()) for c in cols}), fmt, "acknowledged findings")
# --- end findings ----------------------------------------------------------------------------------
