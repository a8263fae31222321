"""A share partition as one member sees it: its lanes and the delivery count of each record.

Builds on the consumer core's ``Partition`` on purpose: runners, the hand-off step and the
completion queue all speak in ``(Partition, offsets)``, which is exactly the
``(topic, partition, offset)`` a share acknowledgement needs. It takes nothing of a consumer
group's ``PartitionState`` (no offsets to track or commit, no pause, no revokes): records are
lent one by one, and a lane is made per fed chunk, so many lanes of one partition run at once.
"""

from __future__ import annotations

import itertools

from kworkers.clock import Clock
from kworkers.consumer.partition import Lane, Partition
from kworkers.consumer.runner import current_lane
from kworkers.message import Message


class SharePartition(Partition):
    __slots__ = ("_ids", "deliveries")

    def __init__(self, topic: str, partition: int, clock: Clock) -> None:
        super().__init__(topic, partition, clock)
        #: offset -> delivery count, for the records of this partition held now
        self.deliveries: dict[int, int] = {}
        self._ids = itertools.count()

    def new_lane(self) -> Lane:
        lane = self.lanes[next(self._ids)] = Lane(self)
        return lane


def delivery_count(msg: Message) -> int | None:
    """How many times the share group delivered ``msg`` (1 the first time), when called from
    the handler running it in share mode; None elsewhere (partitioned mode, retry tiers)."""
    lane = current_lane.get()
    if lane is None:
        return None
    part = lane.part
    if not isinstance(part, SharePartition) or part.tp != (msg.topic, msg.partition):
        return None
    return part.deliveries.get(msg.offset)
