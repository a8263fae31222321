"""What a share-group loop needs from the cluster, and the vocabulary it speaks.

One small protocol, so the Kafka adapter (``kworkers.kafka.share_consumer``) and a test double are
interchangeable behind ``Worker(consumer=...)``. It is wider than ``ConsumerPort`` on purpose:
a share group's settings (acquisition lock, delivery limit, where a new group starts) live on
the broker as *group configs*, and the loop cannot work safely without reading them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from kworkers.consumer.ports import TP
from kworkers.message import Message

#: how the broker should treat a record: done, give it to another member now, or archive it
AckType = Literal["accept", "release", "reject"]
OffsetReset = Literal["earliest", "latest"]
#: a record by its coordinates (share-group acknowledgements are per record, not per position)
RecordKey = tuple[str, int, int]


class Acquired(NamedTuple):
    """A record this member holds under the broker's acquisition lock."""

    msg: Message
    #: 1 on the first acquisition; +1 each time it is acquired again (released, lock expired,
    #: or its holder's connection closed, as when the process was killed)
    deliveries: int


@dataclass(frozen=True)
class GroupSettings:
    """The share group's configs that decide what the loop may do (read at start)."""

    #: ``share.record.lock.duration.ms``: how long a record stays ours once acquired
    lock_s: float
    #: ``share.delivery.count.limit``: the broker archives a record after this many deliveries
    delivery_limit: int
    #: ``share.auto.offset.reset``: where a share partition starts when the group has no state
    offset_reset: OffsetReset
    #: ``share.renew.acknowledge.enable`` (KIP-1222): the broker would accept RENEW
    renew_enabled: bool


@dataclass(frozen=True)
class AckFailure:
    """Acknowledgements the broker refused (e.g. INVALID_RECORD_STATE: the lock had expired)."""

    topic: str
    partition: int
    offsets: frozenset[int]
    error: str


class SharePort(Protocol):
    """The share consumer, single-threaded: every call comes from the poll thread."""

    group: str

    def subscribe(self, topics: Iterable[str]) -> None: ...
    def poll(self, timeout: float) -> list[Acquired]:
        """Records now acquired by this member. Only called once every record of the previous
        poll was acknowledged (the client refuses otherwise). Sends pending acknowledgements."""
        ...
    def acknowledge(self, key: RecordKey, kind: AckType) -> None:
        """Recorded locally; sent with the next ``poll`` or ``flush``."""
        ...
    def flush(self, wait: float | None = None) -> None:
        """Sends pending acknowledgements now (``wait``: block up to that many seconds for the
        broker's answer)."""
        ...
    def ack_failures(self) -> list[AckFailure]:
        """Refusals reported since the last call (the client reports them during ``poll`` and
        ``flush``)."""
        ...
    def close(self) -> None: ...
    def group_settings(self) -> GroupSettings: ...
    def ensure_offset_reset(self, reset: OffsetReset) -> None:
        """Sets the group's ``share.auto.offset.reset`` to ``reset`` unless it already is."""
        ...
    def high_watermarks(self, tps: Iterable[TP]) -> Mapping[TP, int]:
        """The log end of each partition (a broker round trip; called off the poll thread)."""
        ...
