"""The hand-off step: a failed attempt goes to its tier or the DLQ, acknowledged by the broker.

Beside the router on purpose: ``FailureRouter`` decides where a record goes and with which
headers (pure); this step sends it and owns what a failed send means. The source offset may
complete only after the broker acknowledged the hand-off, so a send that fails is retried in
place (with a growing wait) while the offset stays uncommitted; it is abandoned only when the
partition is revoked or the worker stops, and then the record is simply delivered again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Literal

from kworkers.message import Message
from kworkers.metrics import Metrics
from kworkers.retry_tiers.router import FailureRouter, Sender

log = logging.getLogger("kworkers.consumer")

#: how long one send may wait for its delivery report before it counts as failed
HANDOFF_TIMEOUT = 60.0
FIRST_WAIT_S = 0.1
MAX_WAIT_S = 5.0

Destination = Literal["retry", "dlq"]


class HandOffStep:
    def __init__(self, router: FailureRouter, sender: Sender, metrics: Metrics, group: str,
                 stop: threading.Event) -> None:
        self.router = router
        self.sender = sender
        self.metrics = metrics
        self.group = group
        #: set when the worker stops for good: blocked hand-offs give up (the record is
        #: redelivered to the next owner)
        self.stop = stop
        self._m_blocked = metrics.handoff_blocked.labels(group)

    def __call__(self, msg: Message, exc: BaseException,
                 cancelled: Callable[[], bool]) -> Destination | None:
        """Returns where the record went once acknowledged, or None when ``cancelled()`` (the
        partition was revoked) or the worker stopped first: then nothing may be completed."""
        plan = self.router.plan(msg, exc)
        log.warning("%s/%d@%d attempt %d failed (%s: %s) -> %s %s", msg.topic, msg.partition,
                    msg.offset, msg.attempt, type(exc).__name__, str(exc)[:200],
                    plan.destination, plan.topic)
        wait = FIRST_WAIT_S
        blocked = False
        try:
            while True:
                if cancelled() or self.stop.is_set():
                    return None
                try:
                    self.sender.send(plan.topic, plan.key, plan.value, plan.headers).result(
                        timeout=HANDOFF_TIMEOUT)
                except Exception as err:
                    self.metrics.handoff_failures.labels(self.group, plan.destination).inc()
                    if not blocked:
                        blocked = True
                        self._m_blocked.inc()
                    log.error("hand-off of %s/%d@%d to %s failed (%s); retrying in %.1fs, the "
                              "source offset stays uncommitted", msg.topic, msg.partition,
                              msg.offset, plan.topic, err, wait)
                    if self.stop.wait(wait):
                        return None
                    wait = min(wait * 2, MAX_WAIT_S)
                    continue
                if plan.destination == "retry":
                    self.metrics.retries.labels(self.group, plan.label).inc()
                else:
                    self.metrics.dead_letters.labels(self.group, plan.label).inc()
                return plan.destination
        finally:
            if blocked:
                self._m_blocked.dec()
