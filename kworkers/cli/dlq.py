"""``kworkers dlq list|show|redrive``: inspect dead letters and replay them, exactly once.

The reading is ``kworkers.dlq.reader`` and ``kworkers.kafka.reader``, the replay
``kworkers.dlq.redrive``, the printing ``kworkers.cli.dlq_format``; this module only joins them
to the command line.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kworkers.cli.options import client_options, console
from kworkers.kafka.settings import ClientSettings


@click.group()
def dlq() -> None:
    """Inspect dead letters and redrive them, exactly once."""


def _dlq_option(fn: Any) -> Any:
    fn = click.option("--dlq", "dlq_topic", required=True, metavar="TOPIC.dlq",
                      help="The DLQ topic (the source topic's name + .dlq).")(fn)
    return client_options(fn)


@dlq.command("list")
@_dlq_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, for scripts.")
def dlq_list(client: ClientSettings, dlq_topic: str, as_json: bool) -> int:
    """List the dead letters of a DLQ: origin, key, attempts, error, last failure, age."""
    from kworkers.cli.dlq_format import as_json as to_json
    from kworkers.cli.dlq_format import list_table
    from kworkers.dlq.reader import read_dlq

    contents = read_dlq(client, dlq_topic)
    now = time.time()
    if as_json:
        for d in contents.dead_letters:
            click.echo(json.dumps(to_json(d, now)))
        return 0
    out = console()
    out.print(list_table(contents.dead_letters, now,
                         f"{dlq_topic} on {client.bootstrap_servers}"))
    out.print(f"{len(contents.dead_letters)} dead letters")
    for msg, why in contents.unreadable:
        out.print(f"not a kworkers dead letter: {msg.partition}@{msg.offset} ({why}); "
                  f"see `kworkers dlq show`", markup=False)
    return 0


@dlq.command("show")
@_dlq_option
@click.option("--partition", "-p", type=click.IntRange(min=0), required=True)
@click.option("--offset", "-o", type=click.IntRange(min=0), required=True)
def dlq_show(client: ClientSettings, dlq_topic: str, partition: int, offset: int) -> int:
    """Show one DLQ record in full: failure, headers, key and value.

    The value is decoded as a kworkers task envelope when it is one, else shown as text or
    hex.
    """
    from kworkers.cli.dlq_format import show_lines
    from kworkers.dlq.record import DeadLetter
    from kworkers.kafka.clients import require_topic
    from kworkers.kafka.reader import read_record
    from kworkers.retry_tiers.headers import HeaderError

    require_topic(client, dlq_topic, hint="is the DLQ name <topic>.dlq?")
    msg = read_record(client, dlq_topic, partition, offset)
    dead: DeadLetter | None = None
    problem = None
    try:
        dead = DeadLetter.from_message(msg)
    except HeaderError as exc:
        problem = str(exc)
    out = console()
    for line in show_lines(msg, dead, problem, time.time()):
        out.print(line, markup=False)
    return 0


def _when(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"expected an ISO-8601 time such as 2025-01-31T14:00:00Z, "
                                 f"got {value!r}", param_hint=name) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)  # a time without a zone is UTC, like the DLQ headers
    return t.timestamp()


@dlq.command("redrive")
@_dlq_option
@click.option("--to", "target", default=None, metavar="TOPIC",
              help="Replay to this topic (default: the source topic the DLQ belongs to; dead "
                   "letters whose recorded origin disagrees are then refused).")
@click.option("--error-type", default=None, help="Only dead letters with this error type.")
@click.option("--key", default=None, help="Only dead letters with this key (UTF-8).")
@click.option("--since", default=None, metavar="ISO", help="Dead-lettered at or after.")
@click.option("--until", default=None, metavar="ISO", help="Dead-lettered before.")
@click.option("--min-offset", type=click.IntRange(min=0), default=None,
              help="Lowest DLQ offset (inclusive).")
@click.option("--max-offset", type=click.IntRange(min=0), default=None,
              help="Highest DLQ offset (inclusive).")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; produce nothing.")
@click.option("--rate", default=None, metavar="R/s", help="At most R replays per second.")
@click.option("--crash-after", type=click.IntRange(min=1), default=None, hidden=True,
              envvar="KWORKERS_REDRIVE_CRASH_AFTER")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, hidden=True)
def dlq_redrive(client: ClientSettings, dlq_topic: str, target: str | None, error_type: str | None,
                key: str | None, since: str | None, until: str | None, min_offset: int | None,
                max_offset: int | None, dry_run: bool, rate: str | None,
                crash_after: int | None, batch_size: int | None) -> int:
    """Replay dead letters (attempt 1 again), each exactly once even across crashes.

    Replayed dead letters are recorded in the compacted topic <dlq>.redriven, in the same
    Kafka transaction as the replay, so running a redrive twice, or again after a crash,
    never replays a dead letter twice. Ends with `redriven=N skipped_already=M selected=S`.

    Replays go to the source topic the DLQ is named after (<source>.dlq), never where a dead
    letter's headers point: one whose recorded origin is another topic is refused with the
    reason (exit status 1) unless --to names the target.
    """
    from kworkers.dlq.redrive import BATCH_SIZE
    from kworkers.dlq.redrive import redrive as do_redrive
    from kworkers.dlq.redrive_plan import RedriveFilter
    from kworkers.settings import parse_rate

    flt = RedriveFilter(
        error_type=error_type, key=None if key is None else key.encode("utf-8"),
        since=_when(since, "--since"), until=_when(until, "--until"),
        min_offset=min_offset, max_offset=max_offset)
    per_second = None if rate is None else parse_rate(rate)
    out = console()
    with Progress(TextColumn("redrive {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=out, transient=True,
                  disable=not out.is_terminal) as bar:
        task = bar.add_task(dlq_topic, total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        summary = do_redrive(client, dlq_topic, target, flt, dry_run, per_second, progress,
                             batch_size=batch_size or BATCH_SIZE, crash_after=crash_after)
    if summary.targets:
        verb = "would replay" if dry_run else "replayed"
        for topic, n in sorted(summary.targets.items()):
            out.print(f"{verb} {n} to {topic}", markup=False)
    if summary.unreadable:
        out.print(f"left {summary.unreadable} records that are not kworkers dead letters")
    for where, why in summary.refused:
        out.print(f"refused {where}: {why}", markup=False, soft_wrap=True)  # one line each
    click.echo(summary.line())
    return 1 if summary.refused else 0
