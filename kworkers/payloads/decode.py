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

A registry that accepts and never answers is bounded here, not by the user's client
(``kworkers.payloads.bound``): a confluent-kafka client with no timeout of its own gets
``DecodeBackoff.timeout`` as its HTTP timeout (its answer is then a transient failure), an
async deserializer is awaited at most that long, and any call still unanswered past it (a
deserializer kworkers cannot bound) makes its partition wait for the registry while it lasts:
the call cannot be interrupted, but it is no longer taken for a stall.

Both kinds are counted (``kworkers_payload_decode_failures_total{field,kind}``), the waiting
partitions shown (``kworkers_payload_waiting_partitions``); an outage is one log line when the
first partition starts waiting and one when the last stops, and ``on_outage`` (readiness) is
told the reason, then None.

Async handlers: an awaitable answer (confluent-kafka's ``AsyncAvroDeserializer`` and friends)
is awaited; a synchronous deserializer runs in a worker thread so it never blocks the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kworkers.consumer.ports import TP
from kworkers.errors import ConfigError, NonRetryableError
from kworkers.message import Message
from kworkers.payloads.bound import bound_client, quiet_request_log
from kworkers.payloads.failures import PayloadFailure, failure_of
from kworkers.payloads.serde import ContextOf, Deserializer, Field, check_callable
from kworkers.retry_tiers.headers import SCHEMA_ID
from kworkers.topic_names import source_topic_of

#: the error type a record that cannot be decoded is dead-lettered with
DESERIALIZATION_ERROR = "DeserializationError"
#: how long one try may go unanswered before the registry counts as not answering (seconds)
DECODE_TIMEOUT_S = 10.0

log = logging.getLogger("kworkers.payloads")


class PayloadError(NonRetryableError):
    """A key or value that cannot be decoded: dead-lettered after this attempt, the handler
    never called. ``failure`` says why (the reason, the schema id)."""

    def __init__(self, field: Field, failure: PayloadFailure) -> None:
        sid = "" if failure.schema_id is None else f" (schema id {failure.schema_id})"
        super().__init__(DESERIALIZATION_ERROR, f"the {field}{sid} cannot be decoded: "
                                                f"{failure.error_type}: {failure.reason}")
        self.field = field
        self.failure = failure
        #: the dead letter's own headers (``retry_tiers.router.failure_headers``)
        self.failure_headers: tuple[tuple[str, bytes], ...] = (
            () if failure.schema_id is None else ((SCHEMA_ID, b"%d" % failure.schema_id),))


@dataclass(frozen=True)
class DecodeBackoff:
    """How a record waits for a registry that does not answer: ``initial`` seconds, doubled
    after each failed try up to ``max``. ``timeout``: how long one try may go unanswered
    before it counts as such a registry (the bound kworkers puts on a decode)."""

    initial: float = 0.2
    max: float = 10.0
    timeout: float = DECODE_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.max:
            raise ConfigError(f"decode backoff: need 0 < initial <= max, got {self.initial}, "
                              f"{self.max}")
        if not self.timeout > 0:
            raise ConfigError(f"decode backoff: need timeout > 0, got {self.timeout}")

    def delay(self, tries: int) -> float:
        return float(min(self.max, self.initial * 2.0 ** max(0, tries - 1)))


#: ``decode`` returns this when the partition halted (revoke, stop) while the record waited
ABANDONED = None


class RecordDecoder:
    """Decodes records for one worker's runners (thread-safe; one per worker). ``context``
    makes what a deserializer is called with (``kworkers.kafka.serialization.context``: the
    client's ``SerializationContext``), given by the worker so that this package imports no
    client adapter."""

    def __init__(self, value: Deserializer | None = None, key: Deserializer | None = None, *,
                 context: ContextOf,
                 backoff: DecodeBackoff | None = None,
                 on_failure: Callable[[Field, str], None] | None = None,
                 on_waiting: Callable[[int], None] | None = None,
                 on_outage: Callable[[str | None], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        check_callable(value, "value_deserializer")
        check_callable(key, "key_deserializer")
        if value is None and key is None:
            raise ConfigError("a RecordDecoder needs a value or a key deserializer")
        self.value = value
        self.key = key
        self._context = context
        self.backoff = backoff or DecodeBackoff()
        for fn in (value, key):
            self._bound(fn)
        quiet_request_log()
        self._on_failure = on_failure or (lambda _f, _k: None)
        self._on_waiting = on_waiting or (lambda _n: None)
        #: told why records wait when an outage begins, None when it ends (readiness)
        self.on_outage = on_outage or (lambda _why: None)
        #: reads a record's origin before it goes to the DLQ undecoded (``_note_origin``)
        self.on_condemned: Callable[[Message], object] | None = None
        self._sleep = sleep
        self._clock = clock
        self._lock = threading.Lock()
        #: partitions between tries (or in a retry) after a transient failure
        self._waiting: dict[TP, int] = {}
        #: when a waiting record of each partition last asked the registry (``asks_due``)
        self._asked: dict[TP, float] = {}
        #: first tries under way: token -> (partition, start); written without the lock
        #: (single dict operations), copied whole by ``waiting``
        self._calls: dict[int, tuple[TP, float]] = {}
        self._tokens = itertools.count()
        #: partitions whose first try is unanswered past the bound, as last seen
        self._overrun: frozenset[TP] = frozenset()
        #: what was last published: the waiting partitions, since when, and why
        self._shown: frozenset[TP] = frozenset()
        self._outage_since = 0.0
        self._why = ""

    def waiting(self) -> set[TP]:
        """The partitions whose next record waits for the registry now: after a transient
        failure, or with a try unanswered past ``backoff.timeout``. Publishes a change (the
        gauge, the outage's log lines, ``on_outage``): the poll thread calls it twice a
        second, which is how an unanswered call is noticed."""
        now = self._clock()
        late = frozenset(tp for tp, started in self._calls.copy().values()
                         if now - started >= self.backoff.timeout)
        with self._lock:
            if late - self._overrun:
                self._why = f"no answer within {self.backoff.timeout:g}s"
            self._overrun = late
        return set(self._publish())

    def asks_due(self) -> dict[TP, float]:
        """When each partition waiting after a transient failure should have asked the
        registry again by (on the decoder's clock): a waiting record tries at least every
        ``backoff.max`` and a try is answered within ``backoff.timeout``, so a wait past this
        time by the stall bound has stopped asking (``stall.overdue``), whatever it claims. A
        first try unanswered past the bound has no such time: that hold lasts while the call
        does (see the module doc)."""
        b = self.backoff
        with self._lock:
            return {tp: t + b.max + b.timeout for tp, t in self._asked.items()}

    def _asking(self, tp: TP) -> None:
        self._asked[tp] = self._clock()  # one store, under the GIL

    def _wait(self, tp: TP, delta: int) -> None:
        with self._lock:
            n = self._waiting.get(tp, 0) + delta
            if n > 0:
                self._waiting[tp] = n
                self._asked[tp] = self._clock()
            else:
                self._waiting.pop(tp, None)
                self._asked.pop(tp, None)
        self._publish()

    def _publish(self) -> frozenset[TP]:
        """The waiting partitions now; the gauge and, at an outage's start or end, one log
        line and ``on_outage``."""
        with self._lock:
            now = frozenset(self._waiting) | self._overrun
            was, self._shown = self._shown, now
            why = self._why
            began = bool(now) and not was
            if began:
                self._outage_since = self._clock()
            lasted = self._clock() - self._outage_since
        if len(now) != len(was):
            self._on_waiting(len(now))
        if began:
            log.warning("records wait for the schema registry (%s): %d partition(s) hold "
                        "their next record until it answers", why, len(now))
            self.on_outage(f"records of {len(now)} partition(s) wait for it: {why}")
        elif was and not now:
            log.warning("the schema registry answers again after %.0fs: the waiting "
                        "partitions resume", lasted)
            self.on_outage(None)
        return now

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
        if f.kind == "permanent":
            return PayloadError(field, f)
        self._why = f"{f.error_type}: {f.reason}"  # a plain store: the latest reason wins
        return None

    def _once(self, msg: Message) -> Message | PayloadError | None:
        """Decoded, condemned (permanent), or None (transient)."""
        topic = source_topic_of(msg.topic)
        got: dict[Field, Any] = {}
        for field, fn in self._fields():
            try:
                out = fn(self._raw(msg, field), self._context(topic, field, msg.headers))
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
            ctx = self._context(topic, field, msg.headers)
            raw = self._raw(msg, field)
            try:
                if _is_async_call(fn):  # cancellable: awaited at most the bound, in this task
                    async with asyncio.timeout(self.backoff.timeout):
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
        result = self._decode(msg, halted)
        if isinstance(result, PayloadError):
            self._note_origin(msg)
        return result

    async def adecode(self, msg: Message,
                      halted: Callable[[], bool]) -> Message | PayloadError | None:
        """``decode`` for the event loop: awaits, never blocks it."""
        result = await self._adecode(msg, halted)
        if isinstance(result, PayloadError) and self.on_condemned is not None:
            await asyncio.to_thread(self._note_origin, msg)
        return result

    def _note_origin(self, msg: Message) -> None:
        """What an attempt would have read about a record's origin (its topic id), read for
        one that goes to the DLQ unrun, so its dead letter records it (``kw-original-topic-
        id``): the hand-off itself never waits for the cluster. Best effort: a cluster that
        cannot say now leaves the header out, as before."""
        if self.on_condemned is None:
            return
        try:
            self.on_condemned(msg)
        except Exception as exc:
            log.debug("reading the origin of %s/%d@%d failed: %s", msg.topic, msg.partition,
                      msg.offset, exc)

    def _decode(self, msg: Message, halted: Callable[[], bool]) -> Message | PayloadError | None:
        tries = 0
        tp = (msg.topic, msg.partition)
        token = self._begin(tp)
        try:
            result = self._once(msg)
            if result is not None:
                return result
            self._wait(tp, 1)  # before the first try's end: no moment shows no wait
        finally:
            self._end(token)
        try:
            while True:
                tries += 1
                if self._sleep_unless(halted, self.backoff.delay(tries)):
                    return ABANDONED
                self._asking(tp)
                result = self._once(msg)
                if result is not None:
                    return result
        finally:
            self._wait(tp, -1)

    def _bound(self, fn: Deserializer | None) -> None:
        """A recognised registry client with no timeout gets the bound (``payloads.bound``)."""
        bound_client(fn, self.backoff.timeout)

    def _begin(self, tp: TP) -> int:
        """Watch a first try (``waiting`` tells one unanswered past the bound)."""
        token = next(self._tokens)
        self._calls[token] = (tp, self._clock())
        return token

    def _end(self, token: int) -> None:
        self._calls.pop(token, None)

    def _sleep_unless(self, halted: Callable[[], bool], seconds: float) -> bool:
        """Sleep ``seconds`` in short steps; True as soon as ``halted`` says so."""
        end = time.monotonic() + seconds
        while not halted():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._sleep(min(left, 0.1))
        return True

    async def _adecode(self, msg: Message,
                       halted: Callable[[], bool]) -> Message | PayloadError | None:
        tries = 0
        tp = (msg.topic, msg.partition)
        token = self._begin(tp)
        try:
            result = await self._aonce(msg)
            if result is not None:
                return result
            self._wait(tp, 1)
        finally:
            self._end(token)
        try:
            while True:
                tries += 1
                end = time.monotonic() + self.backoff.delay(tries)
                while not halted() and time.monotonic() < end:
                    await asyncio.sleep(min(0.1, max(0.0, end - time.monotonic())))
                if halted():
                    return ABANDONED
                self._asking(tp)
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
