"""A DLQ read back: its dead letters, and the records that are not kworkers dead letters.

The one way kworkers reads a DLQ (``kworkers dlq list``, the redrive, tests): every committed
record, read without a consumer group by ``kworkers.kafka.reader``, each parsed as a
``DeadLetter``. A record that does not parse (written by another tool, or with damaged headers)
is kept apart with the reason, never dropped and never fatal.

``read_dlq`` holds the whole DLQ (a listing shows it all); ``stream_dlq`` yields it in chunks,
for the redrive, which must go through a DLQ of any size in bounded memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from kworkers.dlq.record import DeadLetter
from kworkers.kafka.clients import require_topic
from kworkers.kafka.reader import scan, stream
from kworkers.kafka.settings import ClientSettings
from kworkers.message import Message
from kworkers.retry_tiers.headers import HeaderError
from kworkers.topic_names import check_dlq


@dataclass
class DlqContents:
    """A DLQ read back: the dead letters, and records that are not kworkers dead letters
    (written by another tool, or with damaged headers) with the reason each failed to parse."""

    topic: str
    dead_letters: list[DeadLetter] = field(default_factory=list)
    unreadable: list[tuple[Message, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Unreadable:
    """A DLQ record that is not a kworkers dead letter, and why."""

    message: Message
    problem: str


def parse(msg: Message) -> DeadLetter | Unreadable:
    try:
        return DeadLetter.from_message(msg)
    except HeaderError as exc:
        return Unreadable(msg, str(exc))


def read_dlq(client: ClientSettings | str, dlq: str, timeout: float = 60.0) -> DlqContents:
    """Every record of ``dlq``, parsed; ``ConfigError`` when ``dlq`` is not named as a DLQ
    (``topic_names.check_dlq``), ``TopicNotFound`` when there is no such topic."""
    check_dlq(dlq)
    require_topic(client, dlq, hint="is the DLQ name <topic>.dlq?")
    contents = DlqContents(dlq)
    for msg in scan(client, dlq, timeout=timeout).messages:
        got = parse(msg)
        if isinstance(got, Unreadable):
            contents.unreadable.append((got.message, got.problem))
        else:
            contents.dead_letters.append(got)
    return contents


def stream_dlq(client: ClientSettings | str, dlq: str, spans: Mapping[int, tuple[int, int]]
               ) -> Iterator[list[DeadLetter | Unreadable]]:
    """The records of ``dlq`` in ``spans`` (``partition: (start, end)``), parsed, in chunks
    as read (``kworkers.kafka.reader.stream``: each partition in offset order)."""
    for chunk in stream(client, dlq, spans):
        yield [parse(m) for m in chunk]
