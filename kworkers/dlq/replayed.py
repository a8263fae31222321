"""Which dead letters a DLQ's redrives replayed already, in one bit per DLQ offset.

Why not the set of ledger keys (as the redrive read them before issue #50): a redrive of a
million dead letters leaves a million markers in ``<dlq>.redriven``, and a rerun needs to ask
of each dead letter only "replayed?". A string per marker is ~100 bytes; here each DLQ offset
in the span the redrive reads (``reader.watermarks``: low to high) is one bit, set when the
ledger has a marker for it: 125 KB a million dead letters, whatever the markers or filters.
A marker for an offset outside the span (its dead letter was deleted by retention, or came
after the span's end) can match nothing this redrive reads and is not kept.

The ledger is read as a ``stream`` (no marker is kept, only its key parsed): the markers'
values (where and when) are for people, read by ``ledger.read_marks``.
"""

from __future__ import annotations

from collections.abc import Mapping

from kworkers.kafka import clients
from kworkers.kafka.reader import stream, watermarks
from kworkers.kafka.settings import ClientSettings
from kworkers.topic_names import ledger_topic


class ReplayedOffsets:
    """Per DLQ partition, a bit for each offset of its span: set = a redrive replayed it."""

    def __init__(self, spans: Mapping[int, tuple[int, int]]) -> None:
        self._low = {p: lo for p, (lo, _hi) in spans.items()}
        self._bits = {p: bytearray((max(0, hi - lo) + 7) // 8) for p, (lo, hi) in spans.items()}
        self._count = 0

    def add(self, partition: int, offset: int) -> bool:
        """Marks ``partition@offset`` replayed; False (nothing kept) when it is outside the
        span (or marked already)."""
        bits = self._bits.get(partition)
        if bits is None:
            return False
        i = offset - self._low[partition]
        if not 0 <= i < len(bits) * 8:
            return False
        byte, bit = divmod(i, 8)
        if bits[byte] >> bit & 1:
            return False
        bits[byte] |= 1 << bit
        self._count += 1
        return True

    def has(self, partition: int, offset: int) -> bool:
        bits = self._bits.get(partition)
        if bits is None:
            return False
        i = offset - self._low[partition]
        return 0 <= i < len(bits) * 8 and bool(bits[i >> 3] >> (i & 7) & 1)

    def __len__(self) -> int:
        """How many offsets of the span are marked."""
        return self._count

    @property
    def nbytes(self) -> int:
        """The bits' size: one bit per offset of the span, rounded up per partition."""
        return sum(len(b) for b in self._bits.values())


def coordinates(key: bytes | None, dlq: str) -> tuple[int, int] | None:
    """``(partition, offset)`` of a ledger key ``<dlq>/<partition>/<offset>``
    (``redrive_plan.ledger_key``); None when it names another DLQ or does not parse."""
    text = (key or b"").decode("utf-8", "replace")
    head, _, offset = text.rpartition("/")
    topic, _, partition = head.rpartition("/")
    if topic != dlq or not partition.isdigit() or not offset.isdigit():
        return None
    return int(partition), int(offset)


def read_replayed(client: ClientSettings | str, dlq: str,
                  spans: Mapping[int, tuple[int, int]]) -> ReplayedOffsets:
    """The committed markers of ``dlq``'s ledger, as the offsets of ``spans`` they mark (none
    without a ledger). Read after the redrive's ``init_transactions``, it is final."""
    out = ReplayedOffsets(spans)
    name = ledger_topic(dlq)
    if name not in clients.list_topics(client):
        return out
    for chunk in stream(client, name, watermarks(client, name)):
        for m in chunk:
            at = coordinates(m.key, dlq)
            if at is not None:
                out.add(*at)
    return out
