"""``kworkers workflow start|show|list``: start a run, see where one is, list them.

    kworkers workflow start myapp.flows:engine pipeline --id doc-42 --input '{"doc": "a.txt"}'
    kworkers workflow show doc-42 --store postgresql://...    # or --app myapp.flows:engine
    kworkers workflow list --status failed --store ...

``start`` needs the application's ``Engine`` (``MODULE:ATTR``, an instance or a zero-argument
factory): the definition decides the first activity and the version. ``show`` and ``list`` only
read the engine's tables, so the store URL is enough (``--store``, env ``KWORKERS_STORE_URL``),
and they work from a machine without the application's code.

Errors are one line (``kworkers: error: ...``), as everywhere in the ``kworkers`` command.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import sys
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kworkers.errors import ConfigError
from kworkers.idempotency import open_store
from kworkers.idempotency.capabilities import require_sql
from kworkers.workflow.engine import Engine
from kworkers.workflow.state import STATUSES
from kworkers.workflow.tables import RunRow, RunTables, StepRow

__all__ = ["load_engine", "workflow_cli"]

SHOWN_ERROR = 160


def load_engine(spec: str) -> Engine:
    """The ``Engine`` named by ``module:attr`` (an instance, or a zero-argument factory)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"expected MODULE:ENGINE (e.g. myapp.flows:engine), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, Engine) and callable(obj):
            obj = obj()
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"loading {spec} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, Engine):
        raise ConfigError(f"{spec} is a {type(obj).__name__}, not a kworkers.workflow.Engine")
    return obj


def _tables(app: str | None, store_url: str | None, prefix: str) -> RunTables:
    if app:
        return load_engine(app).tables
    if not store_url:
        raise ConfigError("give --store URL (or env KWORKERS_STORE_URL) or --app MODULE:ENGINE")
    tables = RunTables(require_sql(open_store(store_url), "--store (the workflow tables)"),
                       prefix)
    try:
        tables.counts()
    except Exception as exc:  # the driver's words, never the URL (it may hold a password)
        raise ConfigError(f"cannot read the workflow table {tables.runs} from the store "
                          f"({type(exc).__name__}: {str(exc)[:200]}); check --store and "
                          "--tables") from None
    return tables


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _console() -> Console:
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(width=width, highlight=False, soft_wrap=False)


def _pending(run: RunRow) -> str:
    s = run.state
    if s.activity is None:
        return "-"
    if s.status == "failed":
        return f"{s.activity} (dead-lettered: redrive to retry)"
    return s.activity


def _waits(run: RunRow) -> str | None:
    """What the pending activity waits for, and until when (None: nothing)."""
    s = run.state
    if s.activity is None or s.status == "failed":
        return None
    if s.signal is not None:
        until = "" if s.wake_at is None else f", times out at {_when(s.wake_at)}"
        return f"signal {s.signal!r}{until}"
    if s.wake_at is not None:
        return f"timer until {_when(s.wake_at)}"
    return None


def _run_json(run: RunRow, steps: list[StepRow] | None = None) -> dict[str, Any]:
    s = run.state
    out: dict[str, Any] = {
        "workflow_id": run.workflow_id, "workflow": run.workflow, "version": run.version,
        "status": s.status, "pending": s.activity, "error": s.error, "cause": s.cause,
        "wait": None if _waits(run) is None else {"signal": s.signal, "until": s.wake_at},
        "traceparent": run.traceparent, "created_at": run.created_at,
        "updated_at": run.updated_at,
    }
    if steps is not None:
        out["input"] = None if run.input is None else json.loads(run.input)
        out["history"] = [{
            "activity": h.activity_id, "kind": h.kind, "function": h.name, "status": h.status,
            "attempts": h.attempts, "error": h.error,
            "result": None if h.result is None else json.loads(h.result),
            "updated_at": h.updated_at} for h in steps]
    return out


_source = [
    click.option("--app", default=None, metavar="MODULE:ENGINE",
                 help="Read the tables of this application's Engine."),
    click.option("--store", "store_url", default=None, envvar="KWORKERS_STORE_URL",
                 metavar="URL", help="The store (sqlite:/postgresql:; env KWORKERS_STORE_URL)."),
    click.option("--tables", "prefix", default="kworkers_wf", show_default=True,
                 help="The engine's table prefix (Engine(tables=...))."),
    click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
]


def _source_options(f: Any) -> Any:
    for opt in reversed(_source):
        f = opt(f)
    return f


@click.group("workflow")
def workflow_cli() -> None:
    """Durable workflows: start a run, signal one, show one, list them."""


@workflow_cli.command("start")
@click.argument("app", metavar="MODULE:ENGINE")
@click.argument("workflow")
@click.option("--id", "workflow_id", required=True, help="The run's id (its idempotency key).")
@click.option("--input", "input_json", default="null", show_default=True, metavar="JSON",
              help="The run's input, as JSON.")
def start_cmd(app: str, workflow: str, workflow_id: str, input_json: str) -> None:
    """Start a run of WORKFLOW; starting an existing id again starts nothing."""
    try:
        value = json.loads(input_json)
    except ValueError as exc:
        raise ConfigError(f"--input is not JSON: {exc}") from None
    started = load_engine(app).start(workflow, workflow_id, value)
    verb = "started" if started.created else "exists"
    click.echo(f"{verb}: {started.workflow_id} ({started.workflow} {started.version}) "
               f"{started.status}")


@workflow_cli.command("signal")
@click.argument("app", metavar="MODULE:ENGINE")
@click.argument("workflow_id")
@click.argument("name")
@click.option("--payload", "payload_json", default="null", show_default=True, metavar="JSON",
              help="The signal's payload, as JSON (the waiting step reads it as ctx.signal).")
def signal_cmd(app: str, workflow_id: str, name: str, payload_json: str) -> None:
    """Send signal NAME to run WORKFLOW_ID; kept until a step waiting for NAME takes it."""
    try:
        value = json.loads(payload_json)
    except ValueError as exc:
        raise ConfigError(f"--payload is not JSON: {exc}") from None
    woke = load_engine(app).signal(workflow_id, name, value)
    click.echo(f"sent: {name} to {workflow_id} "
               f"({'woke its waiting step' if woke else 'kept until a step waits for it'})")


@workflow_cli.command("show")
@click.argument("workflow_id")
@_source_options
def show_cmd(workflow_id: str, app: str | None, store_url: str | None, prefix: str,
             as_json: bool) -> None:
    """A run: status, what is pending, and its step history with attempts and errors."""
    tables = _tables(app, store_url, prefix)
    run = tables.run(workflow_id)
    if run is None:
        raise ConfigError(f"no workflow run {workflow_id!r} in {tables.runs}")
    steps = tables.history(workflow_id)
    signals = tables.signals(workflow_id)
    if as_json:
        out = _run_json(run, steps)
        out["signals"] = [{"name": n, "sent_at": t, "taken_by": c} for n, t, c in signals]
        click.echo(json.dumps(out, indent=2))
        return
    con = _console()
    s = run.state
    con.print(f"[bold]{run.workflow_id}[/]  {run.workflow} {run.version}  status [bold]{s.status}"
              f"[/]  pending {_pending(run)}")
    con.print(f"started {_when(run.created_at)}  updated {_when(run.updated_at)}  "
              f"trace {run.traceparent or '-'}")
    waits = _waits(run)
    if waits:
        late = s.wake_at is not None and s.wake_at < time.time() and s.signal is None
        con.print(f"waits for {waits}{' (due: its record is on its way)' if late else ''}")
    for n, t, c in signals:
        con.print(f"signal {n!r} sent {_when(t)}: {'taken by ' + c if c else 'not taken yet'}")
    if s.cause:
        con.print(f"unwinding because: {s.cause}")
    if s.error:
        con.print(f"[red]error:[/] {s.error}")
    table = Table("activity", "kind", "function", "status", "attempts", "last error",
                  "result bytes", "updated")
    for h in steps:
        table.add_row(h.activity_id, h.kind, h.name, h.status, str(h.attempts),
                      (h.error or "")[:SHOWN_ERROR],
                      "-" if h.result is None else str(len(h.result.encode())),
                      _when(h.updated_at))
    con.print(table)


@workflow_cli.command("list")
@_source_options
@click.option("--status", type=click.Choice(STATUSES), default=None, help="Only this status.")
@click.option("--workflow", default=None, help="Only runs of this workflow.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
def list_cmd(app: str | None, store_url: str | None, prefix: str, as_json: bool,
             status: Any, workflow: str | None, limit: int) -> None:
    """Runs, most recently updated first, and how many are in each status."""
    tables = _tables(app, store_url, prefix)
    runs = tables.list_runs(status, workflow, limit)
    counts = tables.counts()
    if as_json:
        click.echo(json.dumps({"counts": counts, "runs": [_run_json(r) for r in runs]},
                              indent=2))
        return
    con = _console()
    table = Table("workflow id", "workflow", "status", "pending", "updated", "error")
    for r in runs:
        table.add_row(r.workflow_id, r.workflow, r.status, _pending(r), _when(r.updated_at),
                      (r.state.error or r.state.cause or "")[:SHOWN_ERROR])
    con.print(table)
    con.print("  ".join(f"{k}: {counts.get(k, 0)}" for k in STATUSES))
