"""The idempotency key of a record that carries no activity ids: where it was first read.

A record produced with a plain client (no task envelope, no ``kw-workflow-id`` /
``kw-activity-id`` headers) still needs a key that is the same on every attempt, through the
retry tiers, the DLQ and a redrive, and different for different records. Its place in the log
is that identity, so the key is ``"<topic>@<topic_id>/<partition>/<offset>"`` of the record
the work began as (``Origin``):

1. read from a source topic: the record's own coordinates. The topic's id is part of the key
   because a topic deleted and created again starts its offsets at 0: without the id, its new
   records would take the keys of the old ones, and a receiver would skip them as done.
2. read from a retry tier: the origin kworkers recorded when it first handed the record off
   (``kw-original-topic``, ``-partition``, ``-offset``, ``-topic-id``). Believed only because the
   tier gate checked the record (``retry_tiers.tier_record.check_tier_record``: its group, its
   origin is this tier's source, ...) before it runs; one that fails the checks never runs.
3. a redrive's replay on the source (``kw-redrive-of: <dlq>/<partition>/<offset>``), and its
   tier hops: the dead letter's origin, when the DLQ of this very source holds a dead letter
   at that place whose key and value are byte for byte the replay's. Anything else (no such
   dead letter, another DLQ, other bytes) is rule 1 (or 2): a source record's own ``kw-*``
   headers never choose a key. A forger who copies a dead letter exactly gets its key by doing
   its exact work: the work then happens once, under one key, whoever's copy ran first.

Keys with ids are ``"<workflow_id>/<activity_id>"`` with one ``/`` (an id may not contain one);
these have two, so the two kinds never meet. ``RecordKeys`` is built once per worker run (it
reads topic ids and the DLQ through ``kworkers.kafka.lookups``) and reaches the activity
context through ``activity.keyed``: handed to the worker's own invoker with every call, or bound
in a context variable by ``KeyedInvoke`` around any other invoker.
"""

from __future__ import annotations

import contextvars
import hashlib
import inspect
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from kworkers.message import Message
from kworkers.retry_tiers.headers import (
    REDRIVE_OF,
    HeaderError,
    Origin,
    failure_of,
    last_value,
    origin_of,
)
from kworkers.topic_names import dlq_topic, is_tier_topic, source_topic_of

if TYPE_CHECKING:
    from kworkers.consumer.ports import Handler, Invoker, Records
    from kworkers.kafka.settings import ClientSettings

#: ``describe(topic) -> topic id`` (``kafka.lookups.KafkaTopicIds``)
Describe = Callable[[str], str]
#: ``read(dlq, partition, offset, n) -> at most n records from there`` (``KafkaDlqWindow``)
ReadWindow = Callable[[str, int, int, int], Sequence[Message]]


def origin_key(o: Origin) -> str:
    """The key of work that began as the record at ``o`` (whose topic id must be known)."""
    if o.topic_id is None:
        raise ValueError(f"the topic id of {o.topic} is not known")
    return f"{o.topic}@{o.topic_id}/{o.partition}/{o.offset}"


class TopicIds:
    """Topic ids, read once per partition and again whenever a record could belong to a
    topic created again under the same name.

    An id read now holds for the records read after it, so each partition is vouched for
    from the lowest offset read under that id: a record further on keeps the id; the first
    record of a partition, or one before that lowest offset (the partition is read again from
    earlier: a new topic's offsets start again at 0, or a group reset), reads the id again.
    Handlers finish out of order, so a few records fetched before the id was read may ask
    again; that costs a read, never a wrong key. The record at the lowest offset itself is
    recognised by its timestamp too, so a new topic's first record at the same offset is not
    taken for the old one.
    """

    def __init__(self, describe: Describe) -> None:
        self._describe = describe
        self._lock = threading.Lock()
        #: (topic -> id, per partition: (lowest offset read under the current id, that
        #: record's timestamp)), replaced whole under the lock, never changed in place: every
        #: hand-off and every key reads it, from many runner threads at once, without a lock
        #: (a contended lock on that path cost more than the rest of a hand-off's routing)
        self._view: tuple[dict[str, str], dict[tuple[str, int], tuple[int, int | None]]] = (
            {}, {})

    def peek(self, msg: Message) -> str | None:
        """The id when ``msg``'s partition vouches for it; None when it would have to be read
        (this never waits for the cluster)."""
        ids, since_of = self._view
        known = ids.get(msg.topic)
        since = since_of.get((msg.topic, msg.partition))
        if known is not None and since is not None and (
                msg.offset > since[0] or (msg.offset, msg.timestamp_ms) == since):
            return known
        return None

    def id_for(self, msg: Message) -> str:
        """The id of the topic ``msg`` was read from, read again unless vouched for."""
        known = self.peek(msg)
        if known is not None:
            return known
        tp = (msg.topic, msg.partition)
        fresh = self._describe(msg.topic)  # outside the lock: a round trip to the cluster
        with self._lock:
            ids, since_of = dict(self._view[0]), dict(self._view[1])
            if ids.get(msg.topic) != fresh:
                # another topic now: nothing vouched under the old id holds any more
                since_of = {k: v for k, v in since_of.items() if k[0] != msg.topic}
                ids[msg.topic] = fresh
            since = since_of.get(tp)
            if since is None or msg.offset <= since[0]:
                since_of[tp] = (msg.offset, msg.timestamp_ms)
            self._view = (ids, since_of)
        return fresh

    def current(self, topic: str) -> str:
        """The id as known (read when not yet), for an origin recorded without one."""
        known = self._view[0].get(topic)
        if known is not None:
            return known
        fresh = self._describe(topic)
        with self._lock:
            ids, since_of = self._view
            if topic in ids:
                return ids[topic]
            self._view = ({**ids, topic: fresh}, since_of)
            return fresh


def _digest(key: bytes | None, value: bytes | None) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    for part in (key, value):
        h.update(b"\x00" if part is None else b"\x01" + len(part).to_bytes(8, "big") + part)
    return h.digest()


def _redrive_ref(msg: Message) -> tuple[str, int, int] | None:
    raw = last_value(msg.headers, REDRIVE_OF)
    if raw is None:
        return None
    try:
        dlq, partition, offset = raw.decode("utf-8").rsplit("/", 2)
        p, o = int(partition), int(offset)
    except (UnicodeDecodeError, ValueError):
        return None
    return (dlq, p, o) if p >= 0 and o >= 0 else None


class DeadLetterCheck:
    """Finds the origin of a redrive's replay in the DLQ it names (rule 3 above).

    Replays come in runs (a redrive replays in DLQ order), so a miss reads ``window`` records
    from that offset on and keeps, per dead letter, only a digest of its key and value and its
    origin, at most ``capacity`` of them.
    """

    def __init__(self, read: ReadWindow, window: int = 200, capacity: int = 4096) -> None:
        self._read = read
        self._window = window
        self._capacity = capacity
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, int, int], tuple[bytes, Origin | None]] = (
            OrderedDict())

    def origin_of(self, msg: Message, source: str, read: bool = True) -> Origin | None:
        """The dead letter's origin when ``msg`` (read from ``source`` or one of its tiers) is
        an exact replay of a dead letter of ``source``'s DLQ; None otherwise. ``read`` False:
        only what was read before (this then never waits for the cluster)."""
        ref = _redrive_ref(msg)
        if ref is None or ref[0] != dlq_topic(source):
            return None
        entry = self._entry(ref, read)
        if entry is None or entry[0] != _digest(msg.key, msg.value):
            return None
        origin = entry[1]
        return origin if origin is not None and origin.topic == source else None

    def _entry(self, ref: tuple[str, int, int], read: bool
               ) -> tuple[bytes, Origin | None] | None:
        with self._lock:
            if ref in self._seen or not read:
                return self._seen.get(ref)
        got = self._read(ref[0], ref[1], ref[2], self._window)
        with self._lock:
            for m in got:
                self._seen[(m.topic, m.partition, m.offset)] = (_digest(m.key, m.value),
                                                                _dead_origin(m))
            while len(self._seen) > self._capacity:
                self._seen.popitem(last=False)
            return self._seen.get(ref)


def _dead_origin(dead: Message) -> Origin | None:
    try:
        info = failure_of(dead.headers)
    except HeaderError:
        return None
    if info is None:
        return None
    return Origin(info.original_topic, info.original_partition, info.original_offset,
                  info.original_timestamp_ms, None, info.original_topic_id)


class RecordKeys:
    """One worker's keys for records without ids: the rules of this module's docstring."""

    def __init__(self, topic_ids: TopicIds, dead_letters: DeadLetterCheck) -> None:
        self.topic_ids = topic_ids
        self.dead_letters = dead_letters
        self._places: dict[str, tuple[bool, str]] = {}

    @classmethod
    def for_cluster(cls, client: ClientSettings) -> RecordKeys:
        from kworkers.kafka.lookups import KafkaDlqWindow, KafkaTopicIds

        return cls(TopicIds(KafkaTopicIds(client)), DeadLetterCheck(KafkaDlqWindow(client)))

    def origin(self, msg: Message) -> Origin:
        """Where the work ``msg`` carries began, with its topic id (``RetryableError`` when
        the cluster cannot say now): what the key of a record without ids is made of."""
        o = self._origin(msg, read=True)
        if o.topic_id is None:  # recorded without one (by an older kworkers, or see below)
            o = o._replace(topic_id=self.topic_ids.current(o.topic))
        return o

    def recorded(self, msg: Message) -> Origin:
        """The origin a hand-off of ``msg`` records, from what is known already: the hand-off
        never waits for the cluster (it may run on the poll thread or an event loop). What is
        not known yet (a partition whose id was never read, because no attempt asked for a
        key) is left out, and read when the next attempt asks."""
        return self._origin(msg, read=False)

    def _place(self, topic: str) -> tuple[bool, str]:
        """(read from a tier, its source), worked out once per topic (names are parsed with
        regular expressions, and a failure storm asks once per record)."""
        got = self._places.get(topic)
        if got is None:
            tier = is_tier_topic(topic)
            got = (tier, source_topic_of(topic) if tier else topic)
            if len(self._places) >= 1024:
                self._places.clear()
            self._places[topic] = got
        return got

    def _origin(self, msg: Message, read: bool) -> Origin:
        tier, source = self._place(msg.topic)
        if msg.headers and _redrive_ref(msg) is not None:  # a replay, or a tier hop of one
            found = self.dead_letters.origin_of(msg, source, read)
            if found is not None:
                return found
        if tier:
            return origin_of(msg)  # checked by the tier gate before it ran
        topic_id = self.topic_ids.id_for(msg) if read else self.topic_ids.peek(msg)
        return Origin(msg.topic, msg.partition, msg.offset, msg.timestamp_ms, None, topic_id)

    def key(self, msg: Message) -> str:
        return origin_key(self.origin(msg))


_bound: contextvars.ContextVar[RecordKeys | None] = contextvars.ContextVar(
    "kworkers_record_keys", default=None)


#: the keys of the worker whose handler is running here (None outside a worker); the context
#: variable's own reader, read once per handler call (a Python function around it cost a frame)
bound: Callable[[], RecordKeys | None] = _bound.get


class KeyedInvoke:
    """An ``Invoker`` that makes ``keys`` the bound ones while ``inner`` runs a handler (for
    an async handler, while its coroutine runs), so every invoker inside, however wrapped
    (tracing, test instruments), keys records by the worker that consumed them."""

    def __init__(self, inner: Invoker, keys: RecordKeys) -> None:
        self.inner = inner
        self.keys = keys

    def __call__(self, handler: Handler, msg: Records) -> Any:
        token = _bound.set(self.keys)
        try:
            result = self.inner(handler, msg)
        finally:
            _bound.reset(token)
        if result is not None and inspect.isawaitable(result):  # None: most sync handlers
            return self._run(result)
        return result

    async def _run(self, pending: Awaitable[Any]) -> Any:
        _bound.set(self.keys)  # a task's own context: no reset needed
        return await pending
