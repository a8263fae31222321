"""The transactional outbox: records to produce, written in the same transaction as the effect.

Why: a handler that writes to its database *and* produces to Kafka cannot make the two atomic;
crash between them and one happens without the other. Instead, the handler ``enqueue``s the
record on the connection of its effect transaction (``store.transaction`` / ``apply_once``),
so the row exists exactly when the effect committed. A relay then sends pending rows and deletes
them once ``send`` returned (delivery confirmed).

**Many relays, one table.** Every worker replica may run a relay on the same table. A relay
*claims* rows before sending them: in one transaction it picks claimable rows, writes its lease
(``lease_until``, ``claimed_by``) on them and commits; then it sends, then deletes what was
acknowledged. A row whose lease is live is left alone by the others; a relay that dies leaves
leases that expire, and the next relay sends those rows again. On PostgreSQL the pick is
``FOR UPDATE SKIP LOCKED`` (relays never wait for each other); on SQLite ``BEGIN IMMEDIATE``
serializes the picks.

**Order per key.** Only the *head* of a key (its oldest pending row in a topic) can be claimed,
and with it the relay takes the rows queued behind it. So all pending rows of one key are in
one relay's hands at a time and go out in the order they were enqueued, whichever relay sends
them; rows without a key have no order to keep and are each their own head. Two limits: ids
come from a sequence, so two transactions that enqueue the same key concurrently commit in an
order the ids may not follow; and a relay stalled past its lease (longer than ``lease_s``) can
send a row again after its successor did, so keep ``lease_s`` well above the send timeout.

The relay is at least once either way: a crash between ``send`` and ``mark_sent`` sends those
rows again, so consumers of the produced topic dedupe on the idempotency key carried in the
record.

Kafka stays out of this module: the relay takes a ``send(topic, key, value, headers)`` callable
that returns only once the broker acknowledged the record (and raises otherwise).

**Typed records.** ``Outbox(store, value_serializer=AvroSerializer(client, schema))`` (and
``key_serializer``) turns what ``enqueue`` is given into bytes *at enqueue time*, in the
effect's transaction, with the record's topic in the ``SerializationContext``
(``kworkers.payloads.serde``): the row holds the exact bytes the relay will produce, so a
resend after a crash is byte-for-byte the same record, and a value the schema refuses fails
the handler's attempt (its transaction rolls back) instead of a relay that can never send it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from kworkers.clock import Clock, SystemClock
from kworkers.consumer.ports import settle
from kworkers.errors import ConfigError
from kworkers.idempotency.capabilities import dialect_of
from kworkers.idempotency.store import TransactionalStore
from kworkers.kafka.serialization import serialize
from kworkers.message import Headers
from kworkers.payloads.serde import Serializer, check_callable
from kworkers.sqlbase import SqlConnection, check_identifier

__all__ = ["Outbox", "OutboxRecord", "RelayObserver", "Send"]

log = logging.getLogger("kworkers.outbox")

#: Produce one record and return once it is acknowledged; raise when it is not.
Send = Callable[[str, bytes | None, bytes | None, Headers], None]

_COLUMNS = "id, topic, key, value, headers"
#: the longest a relay backs off after an error (store or broker unreachable)
MAX_ERROR_BACKOFF_S = 5.0


class SenderLike(Protocol):
    """kworkers' ``Sender`` seam (``kworkers.consumer.ports.Sender``), restated here so the
    outbox depends on no more of the consumer side than ``settle``."""

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers, done: Callable[[BaseException | None], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    id: int
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


def _encode_headers(headers: Headers) -> str:
    out = []
    entries: Sequence[tuple[object, object]] = headers  # checked: callers are not typed
    for name, value in entries:
        if not isinstance(name, str) or not isinstance(value, bytes | bytearray):
            raise ConfigError(f"an outbox header must be (str, bytes), got ({name!r}, {value!r})")
        out.append([name, base64.b64encode(bytes(value)).decode("ascii")])
    return json.dumps(out, separators=(",", ":"))


def _decode_headers(text: str | None) -> Headers:
    if not text:
        return ()
    return tuple((str(n), base64.b64decode(v)) for n, v in json.loads(text))


def _opt_bytes(b: Any, what: str = "a stored key or value") -> bytes | None:
    if b is None or isinstance(b, bytes):
        return b
    if isinstance(b, bytearray | memoryview):
        return bytes(b)
    raise ConfigError(f"{what} must be bytes, got {type(b).__name__} (an Outbox with a "
                      "key_serializer / value_serializer takes objects)")


def _record(row: Sequence[Any]) -> OutboxRecord:
    i, t, k, v, h = row
    return OutboxRecord(int(i), str(t), _opt_bytes(k), _opt_bytes(v), _decode_headers(h))


def _relay_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Outbox:
    """An outbox table next to ``store``'s idempotency table, in the same database.

    ``lease_s``: how long a relay's claim on rows lasts (a dead relay's rows wait this long
    before another relay sends them). ``clock``: the wall clock leases are measured on (shared
    by every relay of the table, so wall time).
    """

    def __init__(self, store: TransactionalStore[Any], *, table: str = "kworkers_outbox",
                 lease_s: float = 60.0, clock: Clock | None = None,
                 key_serializer: Serializer | None = None,
                 value_serializer: Serializer | None = None) -> None:
        if not lease_s > 0:
            raise ConfigError(f"lease_s must be > 0, got {lease_s!r}")
        check_callable(key_serializer, "key_serializer")
        check_callable(value_serializer, "value_serializer")
        self.key_serializer = key_serializer
        self.value_serializer = value_serializer
        self.store = store
        self.table = check_identifier(table)
        check_identifier(f"{table}_key")
        self.lease_s = lease_s
        self.clock = clock or SystemClock()
        self.relay_id = _relay_id()
        #: the SQL of the store's database (its few differences: ``kworkers.sqlbase.Dialect``)
        self._dialect = dialect_of(store)
        self._ensure_schema()

    def _sql(self, sql: str) -> str:
        return self._dialect.sql(sql, t=self.table)

    def _ensure_schema(self) -> None:
        d = self._dialect
        with self.store.atomic() as conn:
            d.lock_ddl(conn, self.table)
            conn.execute(self._sql(
                f"CREATE TABLE IF NOT EXISTS {{t}} (id {d.serial}, topic TEXT NOT NULL, "
                f"key {d.blob}, value {d.blob}, headers TEXT NOT NULL, "
                f"lease_until {d.real} NOT NULL DEFAULT 0, claimed_by TEXT, "
                f"not_before {d.real} NOT NULL DEFAULT 0)"), ())
            self._add_lease_columns(conn)
            conn.execute(self._sql("CREATE INDEX IF NOT EXISTS {t}_key ON {t} (topic, key, id)"),
                         ())

    def _add_lease_columns(self, conn: SqlConnection) -> None:
        """Tables made before relays claimed rows have no lease columns, and tables made before
        rows could be due later no ``not_before``: add them."""
        real = self._dialect.real
        have = self._dialect.columns(conn, self.table)
        if "lease_until" not in have:
            conn.execute(self._sql(f"ALTER TABLE {{t}} ADD COLUMN lease_until {real} NOT NULL "
                                   "DEFAULT 0"), ())
        if "claimed_by" not in have:
            conn.execute(self._sql("ALTER TABLE {t} ADD COLUMN claimed_by TEXT"), ())
        if "not_before" not in have:
            conn.execute(self._sql(f"ALTER TABLE {{t}} ADD COLUMN not_before {real} NOT NULL "
                                   "DEFAULT 0"), ())

    def enqueue(
        self,
        conn: SqlConnection,
        topic: str,
        key: Any,
        value: Any,
        headers: Headers = (),
        not_before: float = 0.0,
    ) -> None:
        """Add a record on ``conn``, inside the caller's open transaction: it commits or rolls
        back together with the effect. ``key`` and ``value`` are bytes, or what the outbox's
        serializers take. ``not_before`` (epoch seconds on the outbox's clock): no relay claims
        the row before then; it is a durable timer (a workflow's ``ctx.sleep``): the row waits
        in the table, holding no thread, memory or connection, and a crash changes nothing.
        A not-yet-due row also holds back the rows of its key queued behind it (order per
        key)."""
        if not topic:
            raise ConfigError("an outbox record needs a topic")
        if self.key_serializer is not None:
            key = serialize(self.key_serializer, key, topic, "key", headers)
        if self.value_serializer is not None:
            value = serialize(self.value_serializer, value, topic, "value", headers)
        conn.execute(
            self._sql("INSERT INTO {t} (topic, key, value, headers, not_before) "
                      "VALUES (?, ?, ?, ?, ?)"),
            (topic, _opt_bytes(key, "an outbox key"), _opt_bytes(value, "an outbox value"),
             _encode_headers(headers), float(not_before)),
        )

    def due_now(self, conn: SqlConnection, topic: str, key: bytes) -> int:
        """Make the not-yet-due rows of ``key`` due at once (a timer woken early, e.g. by a
        workflow signal), on the caller's transaction; how many there were."""
        cur = conn.execute(self._sql(
            "UPDATE {t} SET not_before = 0 WHERE topic = ? AND key = ? AND not_before > 0"),
            (topic, key))
        return max(int(cur.rowcount), 0)

    def pending(self, limit: int = 100) -> list[OutboxRecord]:
        """The oldest unsent records, claimed or not, in the order they were enqueued (by id)."""
        _check_limit(limit)
        with self.store.atomic() as conn:
            rows = conn.execute(
                self._sql(f"SELECT {_COLUMNS} FROM {{t}} ORDER BY id LIMIT ?"), (limit,)
            ).fetchall()
        return [_record(r) for r in rows]

    def claim(self, limit: int = 100) -> list[OutboxRecord]:
        """Claim up to ``limit`` records for this relay (see the module docstring), oldest first.

        The heads of keys whose lease has lapsed, each with the rows queued behind it; the
        heads get this relay's lease, the rows behind them need none (they are not heads, so no
        other relay can claim them while the head exists).
        """
        _check_limit(limit)
        now = self.clock.now()
        lock = self._dialect.skip_locked
        with self.store.atomic() as conn:
            heads = [_record(r) for r in conn.execute(self._sql(
                f"SELECT {_COLUMNS} FROM {{t}} o WHERE o.lease_until <= ? AND o.not_before <= ? "
                "AND NOT EXISTS "
                "(SELECT 1 FROM {t} p WHERE p.topic = o.topic AND p.key = o.key AND p.id < o.id)"
                f" ORDER BY o.id LIMIT ?{lock}"), (now, now, limit)).fetchall()]
            if not heads:
                return []
            claimed = {r.id: r for r in heads}
            for ids in _chunks([r.id for r in heads]):
                marks = ", ".join("?" for _ in ids)
                conn.execute(self._sql(
                    f"UPDATE {{t}} SET lease_until = ?, claimed_by = ? WHERE id IN ({marks})"),
                    (now + self.lease_s, self.relay_id, *ids))
            for head in heads:
                room = limit - len(claimed)
                if room <= 0:
                    break
                if head.key is None:
                    continue
                for r in conn.execute(self._sql(
                        f"SELECT {_COLUMNS}, not_before FROM {{t}} WHERE topic = ? AND key = ? "
                        "AND id > ? ORDER BY id LIMIT ?"),
                        (head.topic, head.key, head.id, room)).fetchall():
                    if float(r[5]) > now:
                        break  # not due yet: it and the rows behind it wait (order per key)
                    claimed[int(r[0])] = _record(r[:5])
        return [claimed[i] for i in sorted(claimed)]

    def release(self, ids: Sequence[int]) -> None:
        """Give up this relay's claim on unsent records, so any relay retries them at once."""
        with self.store.atomic() as conn:
            for chunk in _chunks([int(i) for i in ids]):
                marks = ", ".join("?" for _ in chunk)
                conn.execute(self._sql(
                    f"UPDATE {{t}} SET lease_until = 0, claimed_by = NULL WHERE id IN ({marks}) "
                    "AND claimed_by = ?"), (*chunk, self.relay_id))

    def mark_sent(self, ids: Sequence[int]) -> int:
        """Forget records the broker acknowledged (deleted: the outbox is a queue, not a log).
        Returns how many were still pending."""
        done = 0
        with self.store.atomic() as conn:
            for chunk in _chunks([int(i) for i in ids]):
                marks = ", ".join("?" for _ in chunk)
                cur = conn.execute(self._sql(f"DELETE FROM {{t}} WHERE id IN ({marks})"), chunk)
                done += max(cur.rowcount, 0)
        return done

    def relay_once(self, send: Send, limit: int = 100) -> int:
        """Claim up to ``limit`` records, send them in order, then mark the sent ones. When
        ``send`` raises, the records sent before it are still marked, the rest released, and
        the error propagates."""
        records = self.claim(limit)
        sent: list[int] = []
        try:
            for rec in records:
                send(rec.topic, rec.key, rec.value, rec.headers)
                sent.append(rec.id)
        finally:
            if sent:
                self.mark_sent(sent)
            if len(sent) < len(records):
                self.release([r.id for r in records[len(sent):]])
        return len(sent)

    def pending_count(self, bound: int = 10_000) -> int:
        """Rows not yet sent, counted up to ``bound`` (a bounded scan: the relay's lag gauge
        reads it every few seconds, and a table that grew large must not cost a full count)."""
        _check_limit(bound)
        with self.store.atomic() as conn:
            row = conn.execute(self._sql(
                "SELECT COUNT(*) FROM (SELECT 1 FROM {t} LIMIT ?) AS pending"), (bound,)
            ).fetchone()
        return int(row[0]) if row is not None else 0

    def relay_forever(
        self, send: Send, stop: threading.Event, *, limit: int = 100, idle_s: float = 0.5,
        wake: threading.Event | None = None, observer: RelayObserver | None = None,
    ) -> None:
        """Relay until ``stop`` is set.

        After a pass that found less than a full batch it waits ``idle_s``, or less when
        ``wake`` is set (a writer that just enqueued can wake it). An error (store or broker
        unreachable) is logged and the pass retried after a backoff that grows to
        ``MAX_ERROR_BACKOFF_S``: a relay thread must outlive an outage, never die of one.
        ``observer`` is told what each pass sent and each failure (the metrics).
        """
        backoff = 0.1
        while not stop.is_set():
            try:
                n = self.relay_once(send, limit)
                full = n >= limit
                backoff = 0.1
                if observer is not None:
                    observer.relayed(n)
            except Exception as exc:
                log.warning("outbox relay on %s failed (%s: %s); retrying in %.1fs",
                            self.table, type(exc).__name__, exc, backoff)
                if observer is not None:
                    observer.failed(exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, MAX_ERROR_BACKOFF_S)
                continue
            if not full:
                _idle(stop, wake, idle_s)


class RelayObserver(Protocol):
    """What a relay tells the outside after each pass (``kworkers.idempotency.relay``)."""

    def relayed(self, n: int) -> None: ...
    def failed(self, exc: BaseException) -> None: ...


def _idle(stop: threading.Event, wake: threading.Event | None, idle_s: float) -> None:
    """Wait ``idle_s``, ending early on ``stop`` or ``wake`` (checked every 0.25 s at most)."""
    if wake is None:
        stop.wait(idle_s)
        return
    left = idle_s
    while left > 0 and not stop.is_set():
        if wake.wait(min(left, 0.25)):
            wake.clear()
            return
        left -= 0.25


def _check_limit(limit: int) -> None:
    if limit <= 0:
        raise ConfigError(f"limit must be > 0, got {limit!r}")


def _chunks(ids: list[int], size: int = 500) -> list[list[int]]:
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def blocking_send(sender: SenderLike, timeout: float = 30.0) -> Send:
    """A relay ``send`` over kworkers' hand-off producer (``KafkaSender``): returns only once the
    broker acknowledged the record, so ``mark_sent`` never forgets an unsent one."""

    def send(topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        fut: Future[None] = Future()
        sender.send(topic, key, value, headers, settle(fut))
        fut.result(timeout)

    return send
