"""The share-group backlog each worker exports, because nothing else can measure it here.

KEDA's Kafka scaler reads consumer-group offsets; a share group has none (its state is the
share-partition start offset and the per-record states), so KEDA cannot scale one (KEDA issue
7920). The admin API that reads a share group's offsets (KIP-932 ``DescribeShareGroupOffsets``)
is not in confluent-kafka 2.16.1's ``AdminClient``: no ``list_share_group_offsets``, no
``describe_share_groups``, ``ConsumerGroupType`` has no SHARE member, and
``list_consumer_group_offsets`` on a share group answers -1001 for every partition.

So each worker estimates what it can see: per partition, the log end (high watermark) minus one
past the highest offset *it* has acquired. The group hands records out in offset order, so the
true "not yet acquired" backlog is at most this, and the worker that fetched last is closest:
the cluster-wide figure is, per partition, the **minimum** over replicas, summed over
partitions (never a sum over replicas, which would count one backlog once per replica). Records
released back to the group (lower offsets) are not in it; at most the records in flight are.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from kworkers.consumer.ports import TP

log = logging.getLogger("kworkers.share")

#: how often a worker reads the log ends and refreshes its backlog gauge
INTERVAL_S = 5.0


def estimate(positions: Mapping[TP, int], ends: Mapping[TP, int]) -> dict[TP, int]:
    """Per partition this worker acquired from: log end minus its acquisition position."""
    return {tp: max(0, ends[tp] - pos) for tp, pos in positions.items() if tp in ends}


class _Watermarks(Protocol):
    def high_watermarks(self, tps: Any) -> Mapping[TP, int]: ...


class BacklogReporter:
    """A daemon thread: every ``INTERVAL_S`` it reads the log ends of the partitions this
    worker acquired from (an admin round trip, never the share consumer, which belongs to the
    poll thread) and sets ``kworkers_share_backlog``."""

    def __init__(self, source: _Watermarks, positions: Mapping[TP, int], gauge: Any,
                 group: str, interval: float = INTERVAL_S) -> None:
        self.source = source
        self.positions = positions
        self.gauge = gauge
        self.group = group
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kworkers-share-backlog",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def report_once(self) -> dict[TP, int]:
        positions = dict(self.positions)  # a copy: the poll thread keeps writing
        if not positions:
            return {}
        backlog = estimate(positions, self.source.high_watermarks(list(positions)))
        for (topic, partition), n in backlog.items():
            self.gauge.labels(self.group, topic, str(partition)).set(n)
        return backlog

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.report_once()
            except Exception as exc:  # the broker is away: keep the last figures
                log.debug("%s: cannot read log ends for the backlog: %s", self.group, exc)
