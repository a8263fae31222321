"""A DLQ read back: its dead letters, and the records that are not kworkers dead letters.

The one way kworkers reads a DLQ (``kworkers dlq list``, the redrive, tests): every committed
record, read without a consumer group by ``kworkers.kafka.reader.scan``, each parsed as a
``DeadLetter``. A record that does not parse (written by another tool, or with damaged headers)
is kept apart with the reason, never dropped and never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kworkers.dlq.record import DeadLetter
from kworkers.kafka.clients import require_topic
from kworkers.kafka.reader import scan
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


def read_dlq(client: ClientSettings | str, dlq: str, timeout: float = 60.0) -> DlqContents:
    """Every record of ``dlq``, parsed; ``ConfigError`` when ``dlq`` is not named as a DLQ
    (``topic_names.check_dlq``), ``TopicNotFound`` when there is no such topic."""
    check_dlq(dlq)
    require_topic(client, dlq, hint="is the DLQ name <topic>.dlq?")
    contents = DlqContents(dlq)
    for msg in scan(client, dlq, timeout=timeout).messages:
        try:
            contents.dead_letters.append(DeadLetter.from_message(msg))
        except HeaderError as exc:
            contents.unreadable.append((msg, str(exc)))
    return contents
