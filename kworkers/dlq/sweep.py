"""One pass over a DLQ: each record read, decided, counted, handed on, and forgotten.

The redrive, its dry run and the console's plan page all go through a DLQ this way, so what a
plan counts is what the redrive it confirms does. Why a pass and not a list (as before issue
#50): a DLQ can hold millions of dead letters, and a redrive that held them all (and the
ledger's keys, and every replay in its summary) needed memory in proportion. Held here at
once, whatever the DLQ's size:

- the chunk of records in hand (``kworkers.kafka.reader.CHUNK``) and librdkafka's read-ahead
  (``STREAM_READ_AHEAD``: a thousand records a partition);
- the ledger as one bit per DLQ offset (``replayed.ReplayedOffsets``: 125 KB a million);
- the ``Tally``: counts, and the first ``SAMPLE`` replays and refusals (what the CLI lists and
  the console's plan page shows);
- the replayer's one batch (``replayer.BATCH_SIZE``), when replaying.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kworkers.dlq.reader import Unreadable, stream_dlq
from kworkers.dlq.redrive_plan import RedriveFilter, Refused, Replay, decide
from kworkers.dlq.replayed import ReplayedOffsets
from kworkers.kafka.settings import ClientSettings

#: Replays (and refusals) a tally keeps to be listed; the rest are counted only.
SAMPLE = 200

Progress = Callable[[int, int], None]
"""``progress(done, total)``: DLQ records gone through (read and decided; a replay commits with
its batch) of those the redrive reads (its span, pinned at the start); called at the start,
after each chunk read, and at the end."""


@dataclass
class Tally:
    """What a pass went through: ``read`` DLQ records, ``unreadable`` of them not kworkers dead
    letters; of the dead letters ``selected`` matched the filter, of those ``skipped_already``
    were in the ledger, ``refused`` have no trustworthy target, ``todo`` are replayed (or would
    be). ``replays``/``refusals``: the first ``SAMPLE`` of each, in the order read."""

    read: int = 0
    unreadable: int = 0
    selected: int = 0
    skipped_already: int = 0
    todo: int = 0
    refused: int = 0
    targets: Counter[str] = field(default_factory=Counter)
    replays: list[Replay] = field(default_factory=list)
    refusals: list[Refused] = field(default_factory=list)


def sweep(client: ClientSettings | str, dlq: str, flt: RedriveFilter, to: str | None,
          partitions: Mapping[str, int], spans: Mapping[int, tuple[int, int]],
          done: ReplayedOffsets, send: Callable[[Replay], None] | None = None,
          progress: Progress | None = None) -> Tally:
    """Reads ``spans`` of ``dlq`` once; each dead letter ``flt`` selects that ``done`` does not
    hold is decided (``redrive_plan.decide``) and each replay handed to ``send``."""
    tally = Tally()
    low = {p: lo for p, (lo, _hi) in spans.items()}
    position = dict(low)
    total = sum(max(0, hi - lo) for lo, hi in spans.values())
    if progress is not None:
        progress(0, total)
    for chunk in stream_dlq(client, dlq, spans):
        for item in chunk:
            tally.read += 1
            if isinstance(item, Unreadable):
                tally.unreadable += 1
                position[item.message.partition] = item.message.offset + 1
                continue
            position[item.dlq_partition] = item.dlq_offset + 1
            if not flt.matches(item):
                continue
            tally.selected += 1
            if done.has(item.dlq_partition, item.dlq_offset):
                tally.skipped_already += 1
                continue
            got = decide(dlq, item, to, partitions)
            if isinstance(got, Refused):
                tally.refused += 1
                if len(tally.refusals) < SAMPLE:
                    tally.refusals.append(got)
                continue
            tally.todo += 1
            tally.targets[got.topic] += 1
            if len(tally.replays) < SAMPLE:
                tally.replays.append(got)
            if send is not None:
                send(got)
        if progress is not None:
            progress(sum(position[p] - low[p] for p in position), total)
    return tally
