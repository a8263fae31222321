"""What ``kworkers dlq list`` shows, from one pass over the DLQ in bounded memory.

Why a pass and not ``read_dlq`` (which the listing used until issue #50's redrive work showed
the cost): a DLQ can hold millions of dead letters, and a listing that parsed every one into
memory before counting needed memory in proportion, to print a table nobody reads past its
first screens. Held here at once, whatever the DLQ's size: the chunk in hand
(``reader.stream_dlq``), the ledger as one bit per DLQ offset (``replayed.ReplayedOffsets``),
the rows kept to be shown (at most ``limit``) and the first ``SAMPLE`` records that are not
kworkers dead letters. Every dead letter is still counted, and ``each`` (the JSON lines) sees
every one that matches, as it is read.

Whether a dead letter was redriven is read from the same bits the redrive skips by, so a
listing's "pending" is exactly what the next redrive would replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kworkers.dlq.reader import Unreadable, stream_dlq
from kworkers.dlq.record import DeadLetter
from kworkers.dlq.redrive_plan import RedriveFilter
from kworkers.dlq.replayed import read_replayed
from kworkers.kafka.clients import require_topic
from kworkers.kafka.reader import watermarks
from kworkers.kafka.settings import ClientSettings
from kworkers.topic_names import check_dlq

#: records that are not kworkers dead letters kept to be named; the rest are counted
SAMPLE = 20


@dataclass
class Listing:
    """One pass's counts, and the rows kept to be shown (in the order read)."""

    #: dead letters read (the unreadable records apart)
    total: int = 0
    #: of those, matching the filter (and pending, when asked)
    matching: int = 0
    #: of the matching, replayed by a redrive already (its ledger)
    redriven: int = 0
    shown: list[DeadLetter] = field(default_factory=list)
    unreadable: int = 0
    #: the first ``SAMPLE`` unreadable records: (partition, offset, why)
    unreadable_sample: list[tuple[int, int, str]] = field(default_factory=list)


def list_dlq(client: ClientSettings | str, dlq: str, flt: RedriveFilter, *,
             pending: bool = False, limit: int | None = None,
             each: Callable[[DeadLetter], None] | None = None) -> Listing:
    """One pass over ``dlq`` (``ConfigError`` when it is not named as a DLQ, ``TopicNotFound``
    when there is none): the dead letters ``flt`` selects (and not redriven yet, with
    ``pending``) counted, the first ``limit`` (all when None) kept in ``shown``, or handed to
    ``each`` instead of kept."""
    check_dlq(dlq)
    require_topic(client, dlq, hint="is the DLQ name <topic>.dlq?")
    spans = watermarks(client, dlq)
    done = read_replayed(client, dlq, spans)
    out = Listing()
    for chunk in stream_dlq(client, dlq, spans):
        for item in chunk:
            if isinstance(item, Unreadable):
                out.unreadable += 1
                if len(out.unreadable_sample) < SAMPLE:
                    m = item.message
                    out.unreadable_sample.append((m.partition, m.offset, item.problem))
                continue
            out.total += 1
            replayed = done.has(item.dlq_partition, item.dlq_offset)
            if (pending and replayed) or not flt.matches(item):
                continue
            out.matching += 1
            out.redriven += replayed
            if limit is not None and out.matching > limit:
                continue
            if each is not None:
                each(item)
            else:
                out.shown.append(item)
    return out
