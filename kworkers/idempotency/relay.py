"""The relay thread that runs beside a worker's loops: outbox rows to Kafka.

Every replica runs one; the outbox's row claims keep them from sending the same row at once
(``kworkers.idempotency.outbox``). A writer can wake the local relay, so a row is usually
produced within a round trip instead of after an idle wait; a relay that died (its process
killed) leaves claims that expire, and another replica's relay sends those rows.

Two users: ``Worker(outbox=...)`` (``OutboxRelay``, a run hook: ``kworkers run`` and
``worker.run()`` start it on every replica and stop it with the loops, with its own
idempotent producer made from the running worker's client settings), and the workflow
engine (``kworkers.workflow.engine``, whose checkpoints wake it).

What it says: ``kworkers_outbox_relayed_total{table}`` (rows the broker acknowledged and the
relay deleted), ``kworkers_outbox_relay_failures_total{table}`` (passes that failed: the store
or the broker unreachable; the pass is retried with a backoff), ``kworkers_outbox_pending{table}``
(rows not yet sent, counted up to 10,000 every ``PENDING_EVERY_S``: the relay's lag).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from kworkers.idempotency.outbox import Outbox, Send, SenderLike, blocking_send

if TYPE_CHECKING:
    from kworkers.config import WorkerConfig
    from kworkers.metrics import Metrics
    from kworkers.supervision import Supervisor


class RunningWorker(Protocol):
    """What a run hook reads of the worker it runs beside (``kworkers.worker.Worker``)."""

    @property
    def config(self) -> WorkerConfig: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def supervisor(self) -> Supervisor: ...

__all__ = ["OutboxRelay", "Relay"]

log = logging.getLogger("kworkers.outbox")

#: how often the pending gauge is counted (a bounded scan of the table)
PENDING_EVERY_S = 5.0


class _Observed:
    """The relay's metrics (``outbox.RelayObserver``); the pending gauge counted at most every
    ``PENDING_EVERY_S``, on the relay's own thread."""

    def __init__(self, outbox: Outbox, metrics: Metrics) -> None:
        table = outbox.table
        self.outbox = outbox
        self._sent = metrics.outbox_relayed.labels(table)
        self._failed = metrics.outbox_failures.labels(table)
        self._pending = metrics.outbox_pending.labels(table)
        self._counted = float("-inf")

    def relayed(self, n: int) -> None:
        if n:
            self._sent.inc(n)
        now = time.monotonic()
        if now - self._counted >= PENDING_EVERY_S or n:
            self._counted = now
            self._pending.set(self.outbox.pending_count())

    def failed(self, exc: BaseException) -> None:
        self._failed.inc()


class Relay:
    def __init__(self, outbox: Outbox, send: Send, *, idle_s: float = 0.5,
                 batch: int = 100, name: str = "kworkers-outbox-relay",
                 metrics: Metrics | None = None) -> None:
        self.outbox = outbox
        self.send = send
        self.idle_s = idle_s
        self.batch = batch
        self.name = name
        self.observer = _Observed(outbox, metrics) if metrics is not None else None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> Relay:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.outbox.relay_forever, name=self.name, daemon=True,
                args=(self.send, self._stop),
                kwargs={"limit": self.batch, "idle_s": self.idle_s, "wake": self._wake,
                        "observer": self.observer})
            self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the outbox relay (%s) did not stop within %.0fs (a send is "
                            "stuck); its claimed rows go to another relay when the lease "
                            "lapses", self.name, timeout)


class ClosableSender(SenderLike, Protocol):
    def close(self, timeout: float = 30.0) -> None: ...


def _kafka_sender(cfg: WorkerConfig) -> ClosableSender:
    from kworkers.kafka.producer import KafkaSender
    from kworkers.kafka.settings import producer_settings

    return KafkaSender(producer_settings(cfg.client, cfg.producer_config))


class OutboxRelay:
    """``Worker(outbox=...)``'s run hook: while the worker runs, a relay of ``outbox`` with a
    producer of its own, made from the *running* worker's client and producer settings (what
    ``kworkers run`` made of flags, variables and files); stopped after the loops, its
    producer flushed. Watched by the worker's supervisor: a relay thread that died is a
    fault, as any thread of the worker."""

    def __init__(self, outbox: Outbox, *, idle_s: float = 0.5,
                 make_sender: Callable[[WorkerConfig], ClosableSender] | None = None) -> None:
        self.outbox = outbox
        self.idle_s = idle_s
        #: the producer a run's relay sends with (a test's own; default: an idempotent
        #: ``KafkaSender`` on the running worker's client and producer settings)
        self.make_sender = make_sender or _kafka_sender
        #: the relay of the run in progress (None between runs)
        self.relay: Relay | None = None

    @contextmanager
    def __call__(self, worker: RunningWorker) -> Iterator[None]:
        sender = self.make_sender(worker.config)
        relay = self.relay = Relay(self.outbox, blocking_send(sender), idle_s=self.idle_s,
                                   metrics=worker.metrics).start()
        worker.supervisor.watch(relay.name, relay.alive)
        log.info("outbox relay of %s running", self.outbox.table)
        try:
            yield
        finally:
            self.relay = None
            worker.supervisor.unwatch(relay.name)
            relay.stop()
            sender.close()
