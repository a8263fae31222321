"""The hand-off producer: confluent-kafka behind the ``Sender`` seam (an adapter module)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from kworkers.message import Headers


class KafkaSender:
    """Idempotent producer whose futures resolve on delivery reports.

    A thread of its own serves delivery callbacks, so neither the poll loop nor a handler has
    to remember to call ``poll``.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._p = Producer(dict(conf))
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kworkers-producer",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            self._p.poll(0.05)

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers) -> Future[None]:
        fut: Future[None] = Future()

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                fut.set_exception(KafkaException(err))
            else:
                fut.set_result(None)

        for _ in range(100):
            try:
                self._p.produce(topic, value=value, key=key, headers=list(headers),
                                on_delivery=delivered)
                return fut
            except BufferError:  # local queue full: let deliveries drain, then try again
                self._p.poll(0.05)
            except KafkaException as exc:
                fut.set_exception(exc)
                return fut
        fut.set_exception(BufferError("producer queue stayed full"))
        return fut

    def flush(self, timeout: float = 30.0) -> int:
        return int(self._p.flush(timeout))

    def close(self, timeout: float = 30.0) -> None:
        self._p.flush(timeout)
        self._closed.set()
        self._thread.join(timeout=5)
