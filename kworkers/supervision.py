"""Whether a worker still works, and if not, why: one verdict for /healthz and for the exit code.

A worker is a handful of threads (two poll loops, handler runtimes, the producer's poller, the
metrics server) and many lanes. A thread that died, or a lane whose runner raised or hangs past
its bound, leaves partitions that are assigned to this member but never processed: Kafka sees a
live consumer, KEDA sees lag, nothing moves. The only honest answer is to say so (``/healthz``
503 with the reason) and exit non-zero, so the orchestrator restarts the pod and the partitions
move to a member that works. Records are never lost by that: an unfinished record was never
committed.

The first fault wins and is kept: later faults are usually its consequences.

A *degraded* worker is different: it still runs, but a part of it is not doing its job for
now (partitions stalled, see ``kworkers.consumer.stall``). That is readiness, not health:
``/readyz`` answers 503 with the reason while it lasts, nothing stops, and it clears by itself
when the part moves again. What lasts too long is escalated to a fault by whoever degraded it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("kworkers.supervision")


@dataclass(frozen=True)
class Fault:
    component: str
    reason: str

    def __str__(self) -> str:
        return f"{self.component}: {self.reason}"


class Supervisor:
    """Collects faults from any thread; ``check`` also looks at the threads it was given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fault: Fault | None = None
        self._threads: list[tuple[str, Callable[[], bool]]] = []
        self._degraded: dict[str, str] = {}
        self.failed = threading.Event()
        #: called once, from the thread that reported the first fault (the worker stops)
        self.on_fault: Callable[[Fault], None] | None = None

    @property
    def fault(self) -> Fault | None:
        return self._fault

    @property
    def healthy(self) -> bool:
        return self._fault is None

    def fail(self, component: str, reason: str) -> None:
        with self._lock:
            if self._fault is not None:
                log.debug("further fault after the first (%s): %s: %s", self._fault,
                          component, reason)
                return
            self._fault = Fault(component, reason)
        log.error("worker unhealthy: %s: %s", component, reason)
        self.failed.set()
        if self.on_fault is not None:
            self.on_fault(self._fault)

    @property
    def degraded(self) -> dict[str, str]:
        """What is not doing its job right now, and why (empty: nothing)."""
        with self._lock:
            return dict(self._degraded)

    def degrade(self, component: str, reason: str) -> bool:
        """True when ``component`` was not degraded before: the caller's one log line (two
        poll loops judging one runtime both see its slow call; only one may say so)."""
        with self._lock:
            new = component not in self._degraded
            self._degraded[component] = reason
            return new

    def recover(self, component: str) -> None:
        with self._lock:
            self._degraded.pop(component, None)

    def watch(self, name: str, alive: Callable[[], bool]) -> None:
        """``alive()`` must stay True while the worker runs (a thread's ``is_alive``)."""
        with self._lock:
            self._threads.append((name, alive))

    def unwatch(self, name: str) -> None:
        with self._lock:
            self._threads = [(n, a) for n, a in self._threads if n != name]

    def check(self) -> None:
        for name, alive in list(self._threads):
            if not alive():
                self.fail(name, "thread died")
