"""The transactional outbox: records to produce, written in the same transaction as the effect.

Why: a handler that writes to its database *and* produces to Kafka cannot make the two atomic;
crash between them and one happens without the other. Instead, the handler ``enqueue``s the
record on the connection of its effect transaction (``store.transaction`` / ``apply_once``),
so the row exists exactly when the effect committed. A relay then sends pending rows and deletes
them once ``send`` returned (delivery confirmed).

The relay is at least once: a crash between ``send`` and ``mark_sent`` sends those rows again,
so consumers of the produced topic dedupe on the idempotency key carried in the headers. Run one
relay per outbox table; two relays would each send every pending row.

Kafka stays out of this module: the relay takes a ``send(topic, key, value, headers)`` callable
that returns only once the broker acknowledged the record (and raises otherwise).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from kworkers.errors import ConfigError
from kworkers.idempotency.store import SqlConnection, TransactionalStore, check_identifier
from kworkers.message import Headers

__all__ = ["Outbox", "OutboxRecord", "Send"]

#: Produce one record and return once it is acknowledged; raise when it is not.
Send = Callable[[str, bytes | None, bytes | None, Headers], None]


class SenderLike(Protocol):
    """kworkers' ``Sender`` seam (``kworkers.retry_tiers.router.Sender``), restated here so the
    outbox needs no import from the consumer side."""

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers) -> Future[None]: ...


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


def _opt_bytes(b: Any) -> bytes | None:
    return None if b is None else bytes(b)


class Outbox:
    """An outbox table next to ``store``'s idempotency table, in the same database."""

    def __init__(self, store: TransactionalStore[Any], *, table: str = "kworkers_outbox") -> None:
        self.store = store
        self.table = check_identifier(table)
        self._postgres = store.dialect == "postgres"
        self._ensure_schema()

    def _sql(self, sql: str) -> str:
        sql = sql.replace("{t}", self.table)
        return sql.replace("?", "%s") if self._postgres else sql

    def _ensure_schema(self) -> None:
        with self.store.atomic() as conn:
            if self._postgres:
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
                conn.execute(
                    self._sql(
                        "CREATE TABLE IF NOT EXISTS {t} (id BIGSERIAL PRIMARY KEY, "
                        "topic TEXT NOT NULL, key BYTEA, value BYTEA, headers TEXT NOT NULL)"
                    ),
                    (),
                )
            else:
                conn.execute(
                    self._sql(
                        "CREATE TABLE IF NOT EXISTS {t} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                        "topic TEXT NOT NULL, key BLOB, value BLOB, headers TEXT NOT NULL)"
                    ),
                    (),
                )

    def enqueue(
        self,
        conn: SqlConnection,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers = (),
    ) -> None:
        """Add a record on ``conn``, inside the caller's open transaction: it commits or rolls
        back together with the effect."""
        if not topic:
            raise ConfigError("an outbox record needs a topic")
        conn.execute(
            self._sql("INSERT INTO {t} (topic, key, value, headers) VALUES (?, ?, ?, ?)"),
            (topic, _opt_bytes(key), _opt_bytes(value), _encode_headers(headers)),
        )

    def pending(self, limit: int = 100) -> list[OutboxRecord]:
        """The oldest unsent records, in the order they were enqueued (by id)."""
        if limit <= 0:
            raise ConfigError(f"limit must be > 0, got {limit!r}")
        with self.store.atomic() as conn:
            cur = conn.execute(
                self._sql("SELECT id, topic, key, value, headers FROM {t} ORDER BY id LIMIT ?"),
                (limit,),
            )
            rows = cur.fetchall()
        return [
            OutboxRecord(int(i), str(t), _opt_bytes(k), _opt_bytes(v), _decode_headers(h))
            for i, t, k, v, h in rows
        ]

    def mark_sent(self, ids: Sequence[int]) -> int:
        """Forget records the broker acknowledged (deleted: the outbox is a queue, not a log).
        Returns how many were still pending."""
        done = 0
        with self.store.atomic() as conn:
            for start in range(0, len(ids), 500):
                chunk = [int(i) for i in ids[start : start + 500]]
                marks = ", ".join("?" for _ in chunk)
                cur = conn.execute(self._sql(f"DELETE FROM {{t}} WHERE id IN ({marks})"), chunk)
                done += max(cur.rowcount, 0)
        return done

    def relay_once(self, send: Send, limit: int = 100) -> int:
        """Send up to ``limit`` pending records in order, then mark the sent ones. When ``send``
        raises, the records sent before it are still marked and the error propagates."""
        sent: list[int] = []
        try:
            for rec in self.pending(limit):
                send(rec.topic, rec.key, rec.value, rec.headers)
                sent.append(rec.id)
        finally:
            if sent:
                self.mark_sent(sent)
        return len(sent)

    def relay_forever(
        self, send: Send, stop: threading.Event, *, limit: int = 100, idle_s: float = 0.5
    ) -> None:
        """Relay until ``stop`` is set; waits ``idle_s`` (on ``stop``) when a pass found less
        than a full batch, so an empty outbox is not polled in a hot loop."""
        while not stop.is_set():
            if self.relay_once(send, limit) < limit:
                stop.wait(idle_s)


def blocking_send(sender: SenderLike, timeout: float = 30.0) -> Send:
    """A relay ``send`` over kworkers' hand-off producer (``KafkaSender``): returns only once the
    broker acknowledged the record, so ``mark_sent`` never forgets an unsent one."""

    def send(topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        sender.send(topic, key, value, headers).result(timeout)

    return send
