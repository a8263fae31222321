"""The hand-off producer: confluent-kafka behind the ``Sender`` seam (an adapter module)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from kworkers.consumer.ports import Delivered, SendErrorKind
from kworkers.message import Headers

log = logging.getLogger("kworkers.handoff")

#: every this many sends, the sending thread serves the delivery reports ready (a poll drops
#: and takes back the GIL: once a send cost a failure storm 14 % more CPU per record)
SERVE_EVERY = 32

#: refusals no retry can change: the record goes to its DLQ instead (see ``handoff``)
_PERMANENT = frozenset({
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError._INVALID_ARG,
})
#: refusals that mean the destination does not exist (``transactions`` asks for it too)
MISSING_TOPIC = frozenset({
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
})


def classify_send_error(exc: BaseException) -> SendErrorKind:
    """What a refused produce means (everything else is transient: retried in place)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        code = exc.args[0].code()
        if code in _PERMANENT:
            return "permanent"
        if code in MISSING_TOPIC:
            return "missing"
    return "transient"


class KafkaSender:
    """Idempotent producer that reports each record's fate to its ``done`` from the delivery
    reports.

    Every ``SERVE_EVERY``-th send serves the delivery reports that are ready (``poll(0)``, as
    librdkafka asks of a producer), and a thread of its own serves them meanwhile, so neither
    the poll loop nor a handler has to remember to call ``poll``. The thread alone was not
    enough: in a failure storm it got the CPU so seldom beside eight handler threads that
    reports waited ~300 ms (p50) in librdkafka's queue for a broker acknowledgement of ~5 ms,
    and every unreported hand-off held its partition's share (33-37 ms p50 this way).
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._p = Producer(dict(conf))
        self._closed = threading.Event()
        #: a delivery report's callback raised while a send served the reports ready
        self._broken: Exception | None = None
        #: sends so far (approximate: counted from every sending thread without a lock)
        self._sends = 0
        self._thread = threading.Thread(target=self._serve, name="kworkers-producer",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            self._p.poll(0.05)

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers, done: Delivered) -> None:
        def delivered(err: KafkaError | None, _msg: Any) -> None:
            done(None if err is None else KafkaException(err))

        for _ in range(100):
            try:
                self._p.produce(topic, value=value, key=key, headers=list(headers),
                                on_delivery=delivered)
            except BufferError:  # local queue full: let deliveries drain, then try again
                self._p.poll(0.05)
            except KafkaException as exc:
                done(exc)
                return
            else:
                self._sends += 1
                if self._sends % SERVE_EVERY == 0:
                    self._serve_ready()
                return
        done(BufferError("producer queue stayed full"))

    def _serve_ready(self) -> None:
        """The reports ready now, on the sending thread. A report's callback that raises is
        another record's failure, not this send's: the sender turns dead (``alive``), as its
        thread would have."""
        try:
            self._p.poll(0)
        except Exception as exc:
            log.exception("a delivery report's callback failed: the hand-off producer stops")
            self._broken = exc

    def flush(self, timeout: float = 30.0) -> int:
        return int(self._p.flush(timeout))

    def alive(self) -> bool:
        """The thread serving delivery reports runs and no report's callback failed (without
        them no hand-off completes)."""
        return self._broken is None and (self._thread.is_alive() or self._closed.is_set())

    def close(self, timeout: float = 30.0) -> None:
        self._p.flush(timeout)
        self._closed.set()
        self._thread.join(timeout=5)


Record = tuple[bytes | None, bytes | None, Headers]


def write(conf: Mapping[str, Any], topic: str, records: Iterable[Record],
          partition: int | None = None, timeout: float = 30.0
          ) -> tuple[list[tuple[int, int]], list[str]]:
    """Produces ``records`` (key, value, headers) to ``topic`` and waits for them: where each
    landed (partition, offset), in delivery order, and why any did not (the client's words).
    For operator commands (``kworkers produce``), not for a worker's hand-offs."""
    landed: list[tuple[int, int]] = []
    failed: list[str] = []

    def report(err: KafkaError | None, m: Any) -> None:
        if err is not None:
            failed.append(err.str())
        else:
            landed.append((int(m.partition()), int(m.offset())))

    p = Producer(dict(conf))
    for key, value, headers in records:
        hs: list[tuple[str, str | bytes | None]] = list(headers)
        if partition is None:
            p.produce(topic, value=value, key=key, headers=hs, on_delivery=report)
        else:
            p.produce(topic, value=value, key=key, headers=hs, on_delivery=report,
                      partition=partition)
        p.poll(0)
    left = int(p.flush(timeout))
    if left:
        failed += ["delivery timed out"] * left
    return landed, failed
