"""``kworkers produce``: write a few records to a topic, to try a worker by hand.

Plain records (no headers) are keyed by where they land (``kworkers.record_key``); with
``--workflow-id``/``--activity-id`` they carry explicit ids, the headers
``kworkers.activity.id_headers`` makes, so the key is the same however often they are sent.
The producer is the hand-off producer's configuration (idempotent, acks from all replicas);
each record's place is printed from the broker's delivery report.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from kworkers.cli.options import client_options
from kworkers.errors import ConfigError, KworkersError
from kworkers.kafka.settings import ClientSettings

PLACEHOLDER = "{n}"


def _header(text: str) -> tuple[str, bytes]:
    name, eq, value = text.partition("=")
    if not eq or not name:
        raise click.BadParameter(f"expected NAME=VALUE, got {text!r}", param_hint="--header")
    if name.startswith("kw-"):
        raise click.BadParameter(f"{name!r}: kw-* headers are kworkers' own (use "
                                 "--workflow-id and --activity-id for ids)",
                                 param_hint="--header")
    return name, value.encode("utf-8")


def _ids(workflow: str | None, activity: str | None, count: int
         ) -> list[tuple[str, str]] | None:
    """Per record, its (workflow id, activity id); None for plain records."""
    if workflow is None and activity is None:
        return None
    if workflow is None or activity is None:
        raise ConfigError("--workflow-id and --activity-id go together (they make the key "
                          "<workflow_id>/<activity_id>)")
    if count > 1 and PLACEHOLDER not in workflow + activity:
        raise ConfigError(f"{count} records would share one key: put {PLACEHOLDER} (the "
                          "record's number, from 0) in --workflow-id or --activity-id")
    return [(workflow.replace(PLACEHOLDER, str(i)), activity.replace(PLACEHOLDER, str(i)))
            for i in range(count)]


@click.command()
@client_options
@click.option("--topic", "-t", required=True, help="The topic to write to.")
@click.option("--key", "-k", default=None, help="Record key (UTF-8) for every record.")
@click.option("--partition", "-p", type=click.IntRange(min=0), default=None,
              help="Write to this partition (default: by key, or spread).")
@click.option("--workflow-id", default=None, metavar="ID",
              help="Explicit ids: the workflow part of the key ({n}: the record's number).")
@click.option("--activity-id", default=None, metavar="ID",
              help="Explicit ids: the activity part of the key ({n}: the record's number).")
@click.option("--header", "-H", "headers", multiple=True, metavar="NAME=VALUE",
              help="A header for every record; repeat for several.")
@click.argument("values", nargs=-1)
def produce(client: ClientSettings, topic: str, key: str | None, partition: int | None,
            workflow_id: str | None, activity_id: str | None, headers: tuple[str, ...],
            values: tuple[str, ...]) -> int:
    """Write VALUES (UTF-8; none: one record per line of stdin) to a topic.

    Prints where each record landed (topic/partition@offset), then `produced=N`. Without ids
    a worker keys each record by that place; with --workflow-id and --activity-id by
    <workflow_id>/<activity_id>.
    """
    from kworkers.activity import id_headers
    from kworkers.kafka.clients import require_topic
    from kworkers.kafka.producer import write
    from kworkers.kafka.settings import producer_settings

    lines: Sequence[str] = values or [ln.rstrip("\n") for ln in sys.stdin]
    if not lines:
        raise ConfigError("nothing to produce: give values, or lines on stdin")
    extra = tuple(_header(h) for h in headers)
    ids = _ids(workflow_id, activity_id, len(lines))
    n = require_topic(client, topic)
    if partition is not None and partition >= n:
        raise ConfigError(f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
    raw_key = None if key is None else key.encode("utf-8")
    records = [(raw_key, text.encode("utf-8"),
                (*extra, *(id_headers(*ids[i]) if ids is not None else ())))
               for i, text in enumerate(lines)]
    places, failed = write(producer_settings(client), topic, records, partition)
    for part, off in places:
        click.echo(f"{topic}/{part}@{off}")
    if failed:
        raise KworkersError(f"{len(failed)} of {len(lines)} records not written to {topic}: "
                            f"{failed[0]}")
    click.echo(f"produced={len(places)}")
    return 0
