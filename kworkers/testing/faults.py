"""Fault injection at the hand-off seam: a ``Sender`` that fails or stalls on command."""

from __future__ import annotations

import threading
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from kworkers.consumer.ports import Delivered, Sender
from kworkers.message import Headers


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
             headers: Headers, done: Delivered) -> None:
        if not self.failing(topic):
            with self._lock:
                self.sent += 1
            self.inner.send(topic, key, value, headers, done)
            return
        with self._lock:
            self.failed += 1
        if self.mode == "timeout":
            err = KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "injected timeout"))
            threading.Timer(self.delay, lambda: done(err)).start()
        else:
            done(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                                           "injected: topic unavailable")))

    def close(self, timeout: float = 30.0) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close(timeout)
