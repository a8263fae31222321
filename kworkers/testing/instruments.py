"""What a test worker wears: a delivery recorder, certain kill points, a deliberately broken store.

- ``RecordingInvoker`` wraps the invoker a ``Worker`` runs handlers through (``invoke=``) and
  appends a ledger delivery row *before* the inner invoker claims, skips or runs, so a
  redelivery the idempotent receiver absorbs is still seen by the checker. A record its runner
  calls again after waiting for another attempt's lease (``LeaseBusy``: the same record
  object) is the same delivery, recorded once (``Deliveries``).
- ``KillPoint`` SIGKILLs its own process when a chosen key reaches a chosen step, once across
  restarts (a marker file says it fired). Certain, unlike a kill at a random moment: a canary
  built on it fails every run, not most runs.
- ``StoreProbe`` wraps a store: a hook after ``complete`` (for the "after-complete" kill
  step), and, for the duplicates canary, a claim that never says DONE or BUSY.
- ``RecordingConsumer`` wraps a consumer (``Worker(consumer=...)``) and appends every
  partition of every rebalance callback to the ledger before the worker's callback runs:
  which partitions a member was given, revoked or lost is known only inside the process, so a
  test reads it from the ledger instead of from the worker's own history.
"""

from __future__ import annotations

import inspect
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from kworkers.consumer.ports import TP, ConsumerPort, RebalanceCallback
from kworkers.errors import BatchError, LeaseBusy
from kworkers.idempotency.store import UNTRACKED, Claim, ClaimState, IdempotencyStore, Turn
from kworkers.message import Message
from kworkers.testing.checker import record_key
from kworkers.testing.ledger import Ledger

__all__ = ["Deliveries", "KillPoint", "RecordingConsumer", "RecordingInvoker", "StoreProbe",
           "message_key"]

#: The steps a kill point can name, in the order a record meets them.
STEPS = ("before-effect", "after-heartbeat", "after-effect", "after-complete", "after-commit")


def message_key(msg: Message) -> str:
    """The key the checker gives this record (``checker.record_key``)."""
    return record_key(msg.headers, msg.value)


class Deliveries:
    """Which calls of an invoker are deliveries. A record whose key another attempt held
    (``LeaseBusy``) is run again by its runner after a wait, with the same record object: the
    same delivery, not a new one (a check that counts deliveries must not count the waits)."""

    def __init__(self) -> None:
        self._waited: dict[int, Message] = {}  # the objects themselves: ids stay theirs
        self._lock = threading.Lock()

    def new(self, msg: Message) -> bool:
        """Whether this call of ``msg`` is a delivery (not its run after a lease wait)."""
        with self._lock:
            return self._waited.pop(id(msg), None) is not msg

    def call(self, inner: Callable[[Callable[..., Any], Any], Any],
             handler: Callable[..., Any], msg: Message | list[Message]) -> Any:
        """``inner(handler, msg)``, noting the records that met a busy lease."""
        try:
            result = inner(handler, msg)
        except BaseException as exc:
            self._busy(msg, exc)
            raise
        if result is not None and inspect.isawaitable(result):
            return self._await(result, msg)
        return result

    async def _await(self, pending: Awaitable[Any], msg: Message | list[Message]) -> Any:
        try:
            return await pending
        except BaseException as exc:
            self._busy(msg, exc)
            raise

    def _busy(self, msg: Message | list[Message], exc: BaseException) -> None:
        if isinstance(exc, LeaseBusy) and not isinstance(msg, list):
            busy = [msg]
        elif isinstance(exc, BatchError):
            busy = [m for m, e in exc.failures.items() if isinstance(e, LeaseBusy)]
        else:
            return
        with self._lock:
            for m in busy:
                self._waited[id(m)] = m


class RecordingInvoker:
    """An ``Invoker`` that records each delivery, then calls ``inner``."""

    def __init__(self, ledger: Ledger, inner: Callable[[Callable[..., Any], Any], Any],
                 key_of: Callable[[Message], str] = message_key) -> None:
        self.ledger = ledger
        self.inner = inner
        self.key_of = key_of
        self.deliveries = Deliveries()

    def __call__(self, handler: Callable[..., Any], msg: Message | list[Message]) -> Any:
        for m in msg if isinstance(msg, list) else (msg,):
            if self.deliveries.new(m):
                self.ledger.delivered(self.key_of(m), m)
        return self.deliveries.call(self.inner, handler, msg)


class KillPoint:
    """``KEY@STEP``: SIGKILL this process the first time ``KEY`` reaches ``STEP``.

    ``KEY`` ``*`` stands for every key (each key's first arrival at the step dies). ``markers``
    is a directory shared by every process of the test: the kill fires in whichever process gets
    there first, and never again for that key (the restarted process goes past it).
    """

    def __init__(self, spec: str | None, markers: str | os.PathLike[str] | None) -> None:
        self.key: str | None = None
        self.step: str | None = None
        self.markers = Path(markers) if markers is not None else None
        if spec:
            key, sep, step = spec.rpartition("@")
            if not sep or not key or step not in STEPS:
                raise ValueError(f"kill point {spec!r}: expected KEY@STEP, STEP one of {STEPS}")
            if self.markers is None:
                raise ValueError("a kill point needs a markers directory")
            self.key, self.step = key, step

    def fired(self, key: str | None = None) -> bool:
        """Whether the kill fired (for ``key``; default: the chosen key)."""
        key = key or self.key
        return key is not None and self.markers is not None and self._marker(key).exists()

    def _marker(self, key: str) -> Path:
        assert self.markers is not None
        return self.markers / ("killed-" + key.replace("/", "_"))

    def at(self, step: str, key: str) -> None:
        """Call at each step; dies here when this is the chosen key and step (first time)."""
        if step != self.step or self.key not in (key, "*"):
            return
        try:
            fd = os.open(self._marker(key), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.fsync(fd)
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


class StoreProbe:
    """A store wrapper for fault tests: ``on_complete(key)`` runs after each successful
    ``complete`` (where a kill point's "after-complete" step hooks in), and with
    ``claim_always_acquired`` it is the broken idempotent receiver of the duplicates canary:
    ``claim`` answers ACQUIRED even for a key that is done or leased by a live attempt.
    """

    def __init__(self, inner: IdempotencyStore, *,
                 on_complete: Callable[[str], None] | None = None,
                 claim_always_acquired: bool = False) -> None:
        self.inner = inner
        self.on_complete = on_complete
        self.claim_always_acquired = claim_always_acquired

    def claim(self, key: str, owner: str, lease_s: float, now: float,
              turn: Turn = UNTRACKED) -> Claim:
        real = self.inner.claim(key, owner, lease_s, now, turn)
        if real.state is ClaimState.ACQUIRED or not self.claim_always_acquired:
            return real
        return Claim(ClaimState.ACQUIRED, key, real.token, real.details, now + lease_s, False)

    def heartbeat(self, key: str, token: int, details: bytes | None, lease_s: float,
                  now: float) -> None:
        self.inner.heartbeat(key, token, details, lease_s, now)

    def complete(self, key: str, token: int, now: float) -> None:
        self.inner.complete(key, token, now)
        if self.on_complete is not None:
            self.on_complete(key)

    def release(self, key: str, token: int) -> None:
        self.inner.release(key, token)

    def details(self, key: str) -> bytes | None:
        return self.inner.details(key)

    def is_done(self, key: str) -> bool:
        return self.inner.is_done(key)

    def close(self) -> None:
        self.inner.close()


class RecordingConsumer:
    """A ``ConsumerPort`` that records each rebalance callback's partitions (``member`` names
    this consumer in the ledger), then calls the worker's; everything else goes to ``inner``."""

    def __init__(self, inner: ConsumerPort, ledger: Ledger, member: str) -> None:
        self.inner = inner
        self.ledger = ledger
        self.member = member
        self.group = inner.group

    def subscribe(self, topics: Iterable[str], on_assign: RebalanceCallback,
                  on_revoke: RebalanceCallback, on_lost: RebalanceCallback) -> None:
        def recorded(kind: str, callback: RebalanceCallback) -> RebalanceCallback:
            def call(tps: list[TP]) -> None:
                for topic, partition in tps:
                    self.ledger.rebalanced(kind, topic, partition, member=self.member)
                callback(tps)
            return call

        self.inner.subscribe(topics, recorded("assign", on_assign),
                             recorded("revoke", on_revoke), recorded("lost", on_lost))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
