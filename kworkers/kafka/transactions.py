"""A transactional producer as kworkers uses it (an adapter): begin, produce, commit or abort.

Why a wrapper: the rules of a Kafka transaction are the client's (an error that requires an
abort, a retriable one on a transactional call, a full local queue), and the modules that run
transactions (the redrive) should not have to read client error codes to follow them. Every
refusal comes out as ``TransactionAborted`` (nothing of the transaction is visible: run it
again) or ``TransactionFailed`` (stop: fenced, or the broker refused for good).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from kworkers.consumer.ports import TP, SendErrorKind
from kworkers.errors import TransactionAborted, TransactionFailed
from kworkers.kafka import clients
from kworkers.kafka.offsets import BrokerOffsets
from kworkers.kafka.producer import MISSING_TOPIC, classify_send_error
from kworkers.kafka.settings import ClientSettings, Prop
from kworkers.message import Headers

__all__ = ["LoopTransactions", "TransactionAborted", "TransactionFailed", "Transactions"]

#: how long one ``produce`` waits at most for room in a full local queue
QUEUE_WAIT_S = 30.0


def _reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


#: the error codes that mean "no longer the owner": the group moved on (KIP-447's check of
#: the group metadata) or another producer took the transactional id over
FENCES = frozenset({
    KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID,
    KafkaError.FENCED_MEMBER_EPOCH, KafkaError.STALE_MEMBER_EPOCH, KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED})


def _refusal(exc: KafkaException) -> TransactionAborted | TransactionFailed:
    err = exc.args[0] if exc.args else None
    fenced = isinstance(err, KafkaError) and err.code() in FENCES
    if isinstance(err, KafkaError) and err.txn_requires_abort():
        return TransactionAborted(_reason(exc), fenced=fenced)
    return TransactionFailed(_reason(exc), fenced=fenced)


class Transactions:
    """One transactional id's producer. ``init`` fences an earlier producer with the same id
    and aborts the transaction it left open."""

    def __init__(self, client: ClientSettings, transactional_id: str) -> None:
        self._p: Producer = clients.transactional_producer(client, transactional_id)

    def init(self, timeout: float = 30.0) -> None:
        self._call(self._p.init_transactions, timeout)

    def begin(self) -> None:
        try:
            self._p.begin_transaction()
        except KafkaException as exc:
            raise TransactionFailed(_reason(exc)) from None

    def produce(self, topic: str, key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes]] = (), partition: int | None = None) -> None:
        hs: list[tuple[str, str | bytes | None]] = list(headers)
        deadline = time.monotonic() + QUEUE_WAIT_S
        while True:
            try:
                if partition is None:
                    self._p.produce(topic, value=value, key=key, headers=hs)
                else:
                    self._p.produce(topic, value=value, key=key, headers=hs,
                                    partition=partition)
                return
            except KafkaException as exc:
                raise TransactionFailed(_reason(exc)) from None
            except BufferError:  # the local queue is full: let deliveries drain
                if time.monotonic() >= deadline:
                    raise TransactionFailed(
                        f"the producer queue stayed full producing to {topic}") from None
                self._p.poll(0.05)

    def flush(self, timeout: float) -> None:
        self._p.flush(timeout)

    def commit(self, timeout: float = 60.0) -> None:
        """Commits; ``TransactionAborted`` when the client had to abort it instead."""
        try:
            self._call(self._p.commit_transaction, timeout)
        except TransactionAborted:
            self.abort()
            raise

    def abort(self, timeout: float = 30.0) -> None:
        self._call(self._p.abort_transaction, timeout)

    @staticmethod
    def _call(call: Callable[[float], None], timeout: float) -> None:
        """A transactional call, retried while the client says the error is retriable."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                call(timeout)
                return
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if (isinstance(err, KafkaError) and err.retriable()
                        and time.monotonic() < deadline):
                    time.sleep(0.2)
                    continue
                if isinstance(err, KafkaError) and err.txn_requires_abort():
                    raise TransactionAborted(_reason(exc)) from None
                raise TransactionFailed(_reason(exc)) from None


def _delivered(on_error: Callable[[BaseException], None], err: KafkaError | None,
               _msg: object) -> None:
    if err is not None:
        on_error(KafkaException(err))


class LoopTransactions:
    """A poll loop's transactional producer (``consumer.ports.TransactionPort``): one
    transactional id per loop, a new producer under the same id when the old one can go on no
    more (``renew``), and the group's committed offsets read with ``require_stable`` to learn
    what an uncertain transaction did."""

    def __init__(self, client: ClientSettings, transactional_id: str,
                 transaction_timeout_s: float, overrides: Mapping[str, Prop] | None = None,
                 offsets: BrokerOffsets | None = None) -> None:
        self._args = (client, transactional_id, int(transaction_timeout_s * 1000), overrides)
        self.transactional_id = transactional_id
        self._p: Producer = self._make()
        self._offsets = offsets if offsets is not None else BrokerOffsets(client)

    def _make(self) -> Producer:
        return clients.transactional_producer(*self._args)

    def init(self, timeout: float) -> None:
        Transactions._call(self._p.init_transactions, timeout)

    def begin(self) -> None:
        try:
            self._p.begin_transaction()
        except KafkaException as exc:
            raise _refusal(exc) from None

    def produce(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers,
                on_error: Callable[[BaseException], None]) -> None:
        delivered = partial(_delivered, on_error)
        hs: list[tuple[str, str | bytes | None]] | None = list(headers) if headers else None
        try:
            self._p.produce(topic, value=value, key=key, headers=hs, on_delivery=delivered)
            return
        except BufferError:  # the local queue is full: let deliveries drain
            pass
        except KafkaException as exc:  # refused before it was queued (too large, ...)
            on_error(exc)
            return
        deadline = time.monotonic() + QUEUE_WAIT_S
        while True:
            self._p.poll(0.05)
            try:
                self._p.produce(topic, value=value, key=key, headers=hs, on_delivery=delivered)
                return
            except BufferError:
                if time.monotonic() >= deadline:
                    on_error(BufferError(f"the producer queue stayed full producing to {topic}"))
                    return
            except KafkaException as exc:
                on_error(exc)
                return

    def send_offsets(self, positions: dict[TP, int], group_metadata: object,
                     timeout: float) -> None:
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        Transactions._call(lambda t: self._p.send_offsets_to_transaction(
            offsets, group_metadata, t), timeout)

    def commit(self, timeout: float) -> None:
        Transactions._call(self._p.commit_transaction, timeout)

    def abort(self, timeout: float) -> None:
        Transactions._call(self._p.abort_transaction, timeout)

    def renew(self, timeout: float) -> None:
        old, self._p = self._p, self._make()
        with contextlib.suppress(Exception):
            old.purge()  # what it still queues would only be fenced
        self.init(timeout)

    def committed(self, group: str, tps: list[TP], timeout: float) -> dict[TP, int | None]:
        return self._offsets.committed(group, tps, timeout, require_stable=True)

    def classify(self, exc: BaseException) -> SendErrorKind:
        return classify_send_error(exc)

    def missing(self, topics: list[str], timeout: float) -> dict[str, str]:
        """Those of ``topics`` the broker's metadata says do not exist, with its reason (asked
        one topic at a time: a cluster's whole list can be long). A topic the broker would
        create on use is created by the ask, as the produce would have."""
        out: dict[str, str] = {}
        for topic in topics:
            md = self._p.list_topics(topic=topic, timeout=timeout).topics.get(topic)
            err = None if md is None else md.error
            if md is None:
                out[topic] = "not in the broker's metadata"
            elif err is not None and err.code() in MISSING_TOPIC:
                out[topic] = err.str()
        return out

    def close(self) -> None:
        self._p.flush(5.0)
