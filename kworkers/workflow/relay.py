"""The relay thread a workflow worker runs beside its consumer: outbox rows to Kafka.

Every replica runs one; the outbox's row claims keep them from sending the same row at once
(``kworkers.idempotency.outbox``). A checkpoint wakes the local relay, so the next activity is
usually produced within a round trip instead of after an idle wait; a relay that died (its
process killed) leaves claims that expire, and another replica's relay sends those rows.
"""

from __future__ import annotations

import logging
import threading

from kworkers.idempotency.outbox import Outbox, Send

__all__ = ["Relay"]

log = logging.getLogger("kworkers.workflow.relay")


class Relay:
    def __init__(self, outbox: Outbox, send: Send, *, idle_s: float = 0.5,
                 batch: int = 100) -> None:
        self.outbox = outbox
        self.send = send
        self.idle_s = idle_s
        self.batch = batch
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> Relay:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.outbox.relay_forever, name="kworkers-workflow-relay", daemon=True,
                args=(self.send, self._stop),
                kwargs={"limit": self.batch, "idle_s": self.idle_s, "wake": self._wake})
            self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the workflow relay did not stop within %.0fs (a send is stuck); "
                            "its claimed rows go to another relay when the lease lapses",
                            timeout)
