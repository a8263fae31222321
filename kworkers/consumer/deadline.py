"""The per-message deadline for sync handlers, watched from the poll thread.

Python cannot stop a thread, so a sync handler past its deadline is left running and its lane
is taken from it instead: the incarnation is bumped (the stuck runner's late result is fenced),
and a fresh runner hands the record off as a ``TimeoutError`` attempt, then runs the rest of the
lane. Async handlers are bounded by their runtime (``AsyncRuntime._sweep_deadlines``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from kworkers.clock import Clock
from kworkers.consumer.partition import Item, Lane, Partition
from kworkers.message import Message

log = logging.getLogger("kworkers.consumer")

#: how often the watchdog looks (it walks every lane)
CHECK_INTERVAL_S = 0.05

#: (lane, remaining items, new incarnation, the timed-out record or batch)
Restart = Callable[[Lane, list[Item], int, Message | list[Message]], None]


class DeadlineWatch:
    def __init__(self, limit: float, clock: Clock, restart: Restart) -> None:
        self.limit = limit
        self.clock = clock
        #: starts a fresh runner on (lane, remaining items, new incarnation, timed-out record)
        self.restart = restart
        self._last = float("-inf")

    def check(self, parts: Iterable[Partition]) -> None:
        now = self.clock.monotonic()
        if now - self._last < CHECK_INTERVAL_S:
            return
        self._last = now
        for ps in list(parts):
            for lane in ps.all_lanes():
                cur = lane.current
                if cur is None or now - lane.started < self.limit:
                    continue
                taken = lane.take_over(cur)
                if taken is None:
                    continue
                rest, inc, timed_out = taken
                log.warning("%s/%d@%d exceeded its %.1fs deadline", cur.topic, cur.partition,
                            cur.offset, self.limit)
                self.restart(lane, rest, inc, timed_out)
