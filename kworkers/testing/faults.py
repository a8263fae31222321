"""Fault injection at the hand-off seam: a ``Sender`` that fails or stalls on command."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from confluent_kafka import KafkaError, KafkaException

from kworkers.message import Headers
from kworkers.retry_tiers.router import Sender


class FaultySender:
    """Wraps a real sender; while ``failing(topic)`` is true, sends fail like the broker would.

    ``mode="error"`` fails the delivery report at once (e.g. a deleted topic), ``mode="timeout"``
    fails it after ``delay`` seconds with a delivery timeout.
    """

    def __init__(self, inner: Sender, failing: Callable[[str], bool], mode: str = "error",
                 delay: float = 0.2) -> None:
        self.inner = inner
        self.failing = failing
        self.mode = mode
        self.delay = delay
        self.failed = 0
        self.sent = 0
        self._lock = threading.Lock()

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers) -> Future[None]:
        if not self.failing(topic):
            with self._lock:
                self.sent += 1
            return self.inner.send(topic, key, value, headers)
        with self._lock:
            self.failed += 1
        fut: Future[None] = Future()
        if self.mode == "timeout":
            err = KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "injected timeout"))
            threading.Timer(self.delay, lambda: fut.set_exception(err)).start()
        else:
            fut.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                        "injected: topic unavailable")))
        return fut

    def close(self, timeout: float = 30.0) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close(timeout)
