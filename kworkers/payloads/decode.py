"""Record keys and values through the worker's deserializers, before the handler sees them.

``Worker(value_deserializer=AvroDeserializer(client), key_deserializer=...)`` (or any callable
``(bytes, SerializationContext) -> object``): each record is decoded by its lane's runner, on a
handler thread or awaited on the event loop, never on the poll thread (a registry client blocks
on HTTP, with retries of its own), and before the record's deadline starts.

What the handler sees: ``msg.value`` (and ``msg.key`` with a key deserializer) decoded, and the
bytes as read in ``msg.raw_value`` / ``msg.raw_key`` (``msg.decoded`` is True). Every hand-off
(tiers, DLQ, and so a redrive) writes the original record, never a re-encoding: the runner
hands off the record it took from the lane, not the decoded copy. Lanes keep using the raw key.
The ``SerializationContext`` names the record's *source* topic (for a retry tier's record, the
topic the tier belongs to, whose subject the schema is registered under) and its headers.

What a failure means (``kworkers.payloads.failures``):

- *permanent* (bytes that cannot be decoded, an unknown schema id): the record goes to the DLQ
  after this one attempt, the handler is never called; the failure headers say
  ``DeserializationError`` with the field, the schema id and the deserializer's reason;
- *transient* (the registry unreachable, timing out, 401/403/5xx): the record waits where it
  is and is tried again with a doubling backoff; the wait is not an attempt, no deadline runs
  meanwhile, and the partition waits behind it (its lane does not move, so backpressure pauses
  it once its share of ``max_in_flight`` is fetched). A revoke or a stop ends the wait (the
  record stays uncommitted: the next owner reads it again). ``waiting()`` names the partitions
  that wait for the registry (the stall detector's ``Hold.REGISTRY``).

Both kinds are counted (``kworkers_payload_decode_failures_total{field,kind}``), the waiting
partitions shown (``kworkers_payload_waiting_partitions``).

Async handlers: an awaitable answer (confluent-kafka's ``AsyncAvroDeserializer`` and friends)
is awaited; a synchronous deserializer runs in a worker thread so it never blocks the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kworkers.consumer.ports import TP
from kworkers.errors import ConfigError, NonRetryableError
from kworkers.message import Message
from kworkers.payloads.failures import PayloadFailure, failure_of
from kworkers.payloads.serde import Deserializer, Field, check_callable, context
from kworkers.topic_names import source_topic_of

#: the error type a record that cannot be decoded is dead-lettered with
DESERIALIZATION_ERROR = "DeserializationError"


class PayloadError(NonRetryableError):
    """A key or value that cannot be decoded: dead-lettered after this attempt, the handler
    never called. ``failure`` says why (the reason, the schema id)."""

    def __init__(self, field: Field, failure: PayloadFailure) -> None:
        sid = "" if failure.schema_id is None else f" (schema id {failure.schema_id})"
        super().__init__(DESERIALIZATION_ERROR, f"the {field}{sid} cannot be decoded: "
                                                f"{failure.error_type}: {failure.reason}")
        self.field = field
        self.failure = failure


@dataclass(frozen=True)
class DecodeBackoff:
    """How a record waits for a registry that does not answer: ``initial`` seconds, doubled
    after each failed try up to ``max``."""

    initial: float = 0.2
    max: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.max:
            raise ConfigError(f"decode backoff: need 0 < initial <= max, got {self.initial}, "
                              f"{self.max}")

    def delay(self, tries: int) -> float:
        return float(min(self.max, self.initial * 2.0 ** max(0, tries - 1)))


#: ``decode`` returns this when the partition halted (revoke, stop) while the record waited
ABANDONED = None


class RecordDecoder:
    """Decodes records for one worker's runners (thread-safe; one per worker)."""

    def __init__(self, value: Deserializer | None = None, key: Deserializer | None = None, *,
                 backoff: DecodeBackoff | None = None,
                 on_failure: Callable[[Field, str], None] | None = None,
                 on_waiting: Callable[[int], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        check_callable(value, "value_deserializer")
        check_callable(key, "key_deserializer")
        if value is None and key is None:
            raise ConfigError("a RecordDecoder needs a value or a key deserializer")
        self.value = value
        self.key = key
        self.backoff = backoff or DecodeBackoff()
        self._on_failure = on_failure or (lambda _f, _k: None)
        self._on_waiting = on_waiting or (lambda _n: None)
        self._sleep = sleep
        self._lock = threading.Lock()
        self._waiting: dict[TP, int] = {}

    def waiting(self) -> set[TP]:
        """The partitions whose next record waits for the registry now."""
        with self._lock:
            return set(self._waiting)

    def _wait(self, tp: TP, delta: int) -> None:
        with self._lock:
            n = self._waiting.get(tp, 0) + delta
            if n > 0:
                self._waiting[tp] = n
            else:
                self._waiting.pop(tp, None)
            count = len(self._waiting)
        self._on_waiting(count)

    # -- one try -------------------------------------------------------------------------------

    def _fields(self) -> list[tuple[Field, Deserializer]]:
        out: list[tuple[Field, Deserializer]] = []
        if self.key is not None:
            out.append(("key", self.key))
        if self.value is not None:
            out.append(("value", self.value))
        return out

    @staticmethod
    def _raw(msg: Message, field: Field) -> bytes | None:
        return msg.key if field == "key" else msg.value

    def _decoded(self, msg: Message, got: dict[Field, Any]) -> Message:
        return msg._replace(key=got.get("key", msg.key), value=got.get("value", msg.value),
                            raw_key=msg.key, raw_value=msg.value, decoded=True)

    def _failed(self, field: Field, exc: BaseException, msg: Message) -> PayloadError | None:
        """The permanent failure, or None (transient: the caller waits and tries again)."""
        if isinstance(exc, ConfigError):
            raise exc  # a deserializer wired wrong: no record is at fault
        f = failure_of(exc, self._raw(msg, field))
        self._on_failure(field, f.kind)
        return PayloadError(field, f) if f.kind == "permanent" else None

    def _once(self, msg: Message) -> Message | PayloadError | None:
        """Decoded, condemned (permanent), or None (transient)."""
        topic = source_topic_of(msg.topic)
        got: dict[Field, Any] = {}
        for field, fn in self._fields():
            try:
                out = fn(self._raw(msg, field), context(topic, field, msg.headers))
                if inspect.isawaitable(out):
                    _close(out)
                    raise ConfigError(f"the {field} deserializer is asynchronous: a sync "
                                      "handler needs the synchronous one (AvroDeserializer)")
            except Exception as exc:
                return self._failed(field, exc, msg)
            got[field] = out
        return self._decoded(msg, got)

    async def _aonce(self, msg: Message) -> Message | PayloadError | None:
        topic = source_topic_of(msg.topic)
        got: dict[Field, Any] = {}
        for field, fn in self._fields():
            ctx = context(topic, field, msg.headers)
            raw = self._raw(msg, field)
            try:
                if _is_async_call(fn):
                    out = await fn(raw, ctx)
                else:
                    out = await asyncio.to_thread(fn, raw, ctx)
                    if inspect.isawaitable(out):
                        out = await out
            except Exception as exc:
                return self._failed(field, exc, msg)
            got[field] = out
        return self._decoded(msg, got)

    # -- until decoded, condemned, or the partition halts ----------------------------------------

    def decode(self, msg: Message, halted: Callable[[], bool]) -> Message | PayloadError | None:
        """The record decoded, its ``PayloadError``, or ``ABANDONED`` (None) when ``halted``
        turned true while it waited for the registry. Blocks while the registry is down."""
        tries = 0
        result = self._once(msg)
        if result is not None:
            return result
        tp = (msg.topic, msg.partition)
        self._wait(tp, 1)
        try:
            while True:
                tries += 1
                if self._sleep_unless(halted, self.backoff.delay(tries)):
                    return ABANDONED
                result = self._once(msg)
                if result is not None:
                    return result
        finally:
            self._wait(tp, -1)

    def _sleep_unless(self, halted: Callable[[], bool], seconds: float) -> bool:
        """Sleep ``seconds`` in short steps; True as soon as ``halted`` says so."""
        end = time.monotonic() + seconds
        while not halted():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._sleep(min(left, 0.1))
        return True

    async def adecode(self, msg: Message,
                      halted: Callable[[], bool]) -> Message | PayloadError | None:
        """``decode`` for the event loop: awaits, never blocks it."""
        tries = 0
        result = await self._aonce(msg)
        if result is not None:
            return result
        tp = (msg.topic, msg.partition)
        self._wait(tp, 1)
        try:
            while True:
                tries += 1
                end = time.monotonic() + self.backoff.delay(tries)
                while not halted() and time.monotonic() < end:
                    await asyncio.sleep(min(0.1, max(0.0, end - time.monotonic())))
                if halted():
                    return ABANDONED
                result = await self._aonce(msg)
                if result is not None:
                    return result
        finally:
            self._wait(tp, -1)


def _is_async_call(fn: Callable[..., Any]) -> bool:
    call = getattr(fn, "__call__", None)  # noqa: B004 - the object's own __call__
    return inspect.iscoroutinefunction(fn) or (call is not None
                                               and inspect.iscoroutinefunction(call))


def _close(awaitable: object) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
