"""Deliberately broken consumers for the checker's canaries on the real broker: the real Kafka
adapter, wrapped (``Worker(consumer=factory)``), doing one thing a correct worker never does.

Each breaks one guarantee the checker judges, so each finding is shown firing on a real run
(``tests/faults/test_checker_canaries.py``):

- ``seek-back``: after each assignment, the first record fetched of a partition (at its
  committed position) makes it seek ``BACK`` records below: committed work runs again
  (``rerun_committed``);
- ``skip``: the record at offset ``SKIP_OFFSET`` of partition 0 never reaches the loop, which
  commits past it (``skipped``);
- ``drop-after-kill``: once a kill point fired (a marker in the markers directory), the first
  record fetched of each partition after an assignment is dropped: the killed process's
  uncommitted work goes nowhere (``not_redelivered``);
- ``commit-backwards``: after each revoke (a rebalance, or the leave at a clean stop) the
  partition's commit is set ``BACK`` records below where it was (``non_monotonic``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kworkers.message import Message
from tests.apps.adapters import KafkaConsumerAdapter, consumer_settings, raw_client

log = logging.getLogger("tests.broken_consumer")

MODES = ("seek-back", "skip", "drop-after-kill", "commit-backwards")
BACK = 3
SKIP_OFFSET = 7
TP = tuple[str, int]


class BrokenConsumer:
    """The real adapter with one deliberate defect (``mode``); everything else delegated."""

    def __init__(self, inner: KafkaConsumerAdapter, mode: str, markers: str | None) -> None:
        if mode not in MODES:
            raise ValueError(f"broken consumer {mode!r}: one of {MODES}")
        self.inner = inner
        self.group = inner.group
        self.mode = mode
        self.markers = Path(markers) if markers else None
        self._fresh: set[TP] = set()  # assigned, nothing fetched yet since
        self._committed: dict[TP, int] = {}  # what the loop committed
        #: seeked back from this offset: records from it on are stale until one below arrives
        self._sought: dict[TP, int] = {}

    def subscribe(self, topics: Iterable[str], on_assign: Callable[[list[TP]], None],
                  on_revoke: Callable[[list[TP]], None],
                  on_lost: Callable[[list[TP]], None]) -> None:
        def assigned(tps: list[TP]) -> None:
            on_assign(tps)
            self._fresh |= set(tps)
            for tp in tps:
                self._sought.pop(tp, None)

        def revoked(tps: list[TP]) -> None:
            on_revoke(tps)
            self._fresh -= set(tps)
            if self.mode == "commit-backwards":
                self._commit_back(tps)

        self.inner.subscribe(topics, assigned, revoked, on_lost)

    def commit_async(self, positions: Mapping[TP, int]) -> None:
        self.inner.commit_async(dict(positions))
        self._committed.update(positions)

    def _commit_back(self, tps: list[TP]) -> None:
        older = {tp: self._committed[tp] - BACK for tp in tps
                 if self._committed.get(tp, 0) >= BACK}
        if older:
            self.inner.commit_async(older)
            log.warning("canary: committed %s after the revoke", older)

    def poll_batch(self, n: int, timeout: float) -> list[Message]:
        msgs = self.inner.poll_batch(n, timeout)
        if self.mode == "skip":
            return [m for m in msgs if (m.partition, m.offset) != (0, SKIP_OFFSET)]
        if not (self._fresh or self._sought) or self.mode not in ("seek-back",
                                                                   "drop-after-kill"):
            return msgs
        out: list[Message] = []
        for m in msgs:
            tp = (m.topic, m.partition)
            if tp in self._sought:
                if m.offset >= self._sought[tp]:
                    continue  # fetched before the seek: the loop must not see it
                del self._sought[tp]
            if tp not in self._fresh:
                out.append(m)
                continue
            self._fresh.discard(tp)
            if self.mode == "seek-back" and m.offset > 0:
                self._sought[tp] = m.offset
                self._seek(tp, max(0, m.offset - BACK))
            elif self.mode == "drop-after-kill" and self._killed():
                log.warning("canary: dropped %s/%d@%d", m.topic, m.partition, m.offset)
                continue
            else:
                out.append(m)
        return out

    def _seek(self, tp: TP, offset: int) -> None:
        from confluent_kafka import TopicPartition

        raw_client(self.inner).seek(TopicPartition(tp[0], tp[1], offset))
        log.warning("canary: seeked %s/%d back to %d", tp[0], tp[1], offset)

    def _killed(self) -> bool:
        return self.markers is not None and any(self.markers.glob("killed-*"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def factory(bootstrap: str, main_group: str, mode: str, markers: str | None, protocol: str,
            overrides: dict[str, Any]) -> Callable[[str], Any]:
    """``Worker(consumer=...)``: the main group's consumer broken, the retry group's not."""

    def make(group: str) -> Any:
        inner = KafkaConsumerAdapter(consumer_settings(bootstrap, group, protocol, overrides))
        return BrokenConsumer(inner, mode, markers) if group == main_group else inner

    return make
