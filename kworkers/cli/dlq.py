"""``kworkers dlq list|show|redrive``: inspect dead letters and replay them, exactly once.

The reading is ``kworkers.dlq.reader`` and ``kworkers.kafka.reader``, the replay
``kworkers.dlq.redrive``, the printing ``kworkers.dlq.format``; this module only joins them
to the command line.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import TYPE_CHECKING, Any

import click

from kworkers.cli.options import client_options, console, registry_options
from kworkers.kafka.settings import ClientSettings
from kworkers.payloads.settings import RegistrySettings

if TYPE_CHECKING:
    from kworkers.dlq.record import DeadLetter

#: rows a `dlq list` table shows unless --limit says otherwise (a DLQ may hold millions)
TABLE_ROWS = 1_000


@click.group()
def dlq() -> None:
    """Inspect dead letters and redrive them, exactly once."""


def _dlq_option(fn: Any) -> Any:
    fn = click.option("--dlq", "dlq_topic", required=True, metavar="TOPIC.dlq",
                      help="The DLQ topic (the source topic's name + .dlq).")(fn)
    return client_options(fn)


def _filter_options(fn: Any) -> Any:
    """The selection `dlq list` and `dlq redrive` share (``RedriveFilter``)."""
    for option in reversed([
        click.option("--error-type", default=None, help="Only dead letters with this error "
                     "type."),
        click.option("--key", default=None, help="Only dead letters with this key (UTF-8)."),
        click.option("--since", default=None, metavar="ISO", help="Dead-lettered at or after."),
        click.option("--until", default=None, metavar="ISO", help="Dead-lettered before."),
        click.option("--min-offset", type=click.IntRange(min=0), default=None,
                     help="Lowest DLQ offset (inclusive)."),
        click.option("--max-offset", type=click.IntRange(min=0), default=None,
                     help="Highest DLQ offset (inclusive)."),
    ]):
        fn = option(fn)
    return fn


def _filter(error_type: str | None, key: str | None, since: str | None, until: str | None,
            min_offset: int | None, max_offset: int | None) -> Any:
    from kworkers.dlq.redrive_plan import RedriveFilter

    return RedriveFilter(
        error_type=error_type, key=None if key is None else key.encode("utf-8"),
        since=_when(since, "--since"), until=_when(until, "--until"),
        min_offset=min_offset, max_offset=max_offset)


@dlq.command("list")
@_dlq_option
@_filter_options
@click.option("--pending", is_flag=True, help="Only dead letters no redrive replayed yet.")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help=f"Show at most N (the count of all that match is still given; a table "
                   f"shows at most {TABLE_ROWS:,} unless told, --json every one).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, for scripts.")
def dlq_list(client: ClientSettings, dlq_topic: str, error_type: str | None, key: str | None,
             since: str | None, until: str | None, min_offset: int | None,
             max_offset: int | None, pending: bool, limit: int | None, as_json: bool) -> int:
    """List the dead letters of a DLQ: origin, key, attempts, error, last failure, age, and
    whether a redrive replayed it already (from the ledger <dlq>.redriven).

    One pass in bounded memory, whatever the DLQ's size (kworkers.dlq.listing): JSON lines are
    written as they are read; a table keeps the rows it shows."""
    from kworkers.dlq.format import as_json as to_json
    from kworkers.dlq.format import list_table
    from kworkers.dlq.ledger import read_marks
    from kworkers.dlq.listing import list_dlq
    from kworkers.dlq.redrive_plan import ledger_key

    flt = _filter(error_type, key, since, until, min_offset, max_offset)
    now = time.time()
    if as_json:
        # only a redriven dead letter's marker is wanted, but which ones come is not known
        # before the pass: the ledger's markers are read first (one per dead letter replayed),
        # unless only pending ones are listed (none of them has one)
        marks = {} if pending else read_marks(client, dlq_topic)

        def emit(d: DeadLetter) -> None:
            click.echo(json.dumps(to_json(d, now, marks.get(ledger_key(d)))))

        list_dlq(client, dlq_topic, flt, pending=pending, limit=limit, each=emit)
        return 0
    rows = TABLE_ROWS if limit is None else limit
    got = list_dlq(client, dlq_topic, flt, pending=pending, limit=rows)
    marks = read_marks(client, dlq_topic, {ledger_key(d) for d in got.shown})
    out = console()
    out.print(list_table(got.shown, now, f"{dlq_topic} on {client.bootstrap_servers}", marks))
    line = f"{got.matching} dead letters"
    if got.matching != got.total:
        line += f" match (of {got.total})"
    line += f", {got.redriven} redriven"
    if len(got.shown) < got.matching:
        line += (f"; {len(got.shown)} shown (--limit {limit})" if limit is not None else
                 f"; the first {len(got.shown):,} shown (--limit N for another count, --json "
                 "for every one)")
    out.print(line)
    for partition, offset, why in got.unreadable_sample:
        out.print(f"not a kworkers dead letter: {partition}@{offset} ({why}); "
                  f"see `kworkers dlq show`", markup=False)
    if got.unreadable > len(got.unreadable_sample):
        out.print(f"... {got.unreadable - len(got.unreadable_sample)} more records that are "
                  "not kworkers dead letters", markup=False)
    return 0


@dlq.command("show")
@_dlq_option
@registry_options
@click.option("--partition", "-p", type=click.IntRange(min=0), required=True)
@click.option("--offset", "-o", type=click.IntRange(min=0), required=True)
def dlq_show(client: ClientSettings, registry: RegistrySettings | None, dlq_topic: str,
             partition: int, offset: int) -> int:
    """Show one DLQ record in full: failure, headers, key and value.

    With --schema-registry, a value in Confluent framing is decoded through the registry
    (Avro, JSON Schema, Protobuf) and shown with its schema id and subject. The value is
    decoded as a kworkers task envelope when it is one, else shown as text or hex.
    """
    from kworkers.dlq.format import show_lines
    from kworkers.dlq.ledger import read_marks
    from kworkers.dlq.record import DeadLetter
    from kworkers.dlq.redrive_plan import ledger_key
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
    view = None
    if registry is not None:
        from kworkers.kafka.schema_registry import describe, registry_client

        view = describe(registry_client(registry), msg.value, registry)
    out = console()
    marks = read_marks(client, dlq_topic, {ledger_key(dead)}) if dead is not None else None
    for line in show_lines(msg, dead, problem, time.time(), view, marks):
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
@_filter_options
@click.option("--dry-run", is_flag=True, help="List what would be replayed; produce nothing.")
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
    never replays a dead letter twice; who ran it (your OS user), when, what and how it
    ended go to <dlq>.audit. Lists the replays (the dead letter, its key and error type, where
    it goes; with --dry-run, what would be replayed: the first 200, then a count) and ends
    with `redriven=N skipped_already=M selected=S`. A DLQ of any size is read once, in
    chunks, in bounded memory; on a terminal a bar shows the DLQ records gone through, the
    rate and the ETA.

    Replays go to the source topic the DLQ is named after (<source>.dlq), never where a dead
    letter's headers point: one whose recorded origin is another topic is refused with the
    reason (exit status 1) unless --to names the target.
    """
    from kworkers.cli.bars import progress_bar
    from kworkers.dlq.audit import Actor
    from kworkers.dlq.format import replay_line
    from kworkers.dlq.redrive import BATCH_SIZE
    from kworkers.dlq.redrive import redrive as do_redrive
    from kworkers.settings import parse_rate

    flt = _filter(error_type, key, since, until, min_offset, max_offset)
    per_second = None if rate is None else parse_rate(rate)
    out = console()
    with progress_bar(out, "redrive", " records") as bar:
        task = bar.add_task(dlq_topic, total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        summary = do_redrive(client, dlq_topic, target, flt, dry_run, per_second, progress,
                             batch_size=batch_size or BATCH_SIZE, crash_after=crash_after,
                             actor=Actor.of_process("cli"))
    done = summary.replays if dry_run else summary.replays[:summary.redriven]
    for r in done:
        out.print(replay_line(r, dry_run), markup=False, soft_wrap=True)  # one line each
    listed = summary.pending if dry_run else summary.redriven
    if listed > len(done):
        out.print(f"... and {listed - len(done)} more (the first {len(done)} are listed; "
                  "`kworkers dlq list` lists every dead letter)", markup=False)
    if summary.targets:
        verb = "would replay" if dry_run else "replayed"
        for topic, n in sorted(summary.targets.items()):
            out.print(f"{verb} {n} to {topic}", markup=False)
    if summary.unreadable:
        out.print(f"left {summary.unreadable} records that are not kworkers dead letters")
    for where, why in summary.refused:
        out.print(f"refused {where}: {why}", markup=False, soft_wrap=True)  # one line each
    if summary.refused_total > len(summary.refused):
        out.print(f"... and {summary.refused_total - len(summary.refused)} more refused",
                  markup=False)
    click.echo(summary.line())
    return 1 if summary.refused_total else 0
