"""The activity context a handler reads: its idempotency key, attempt and heartbeat checkpoint.

    from kworkers import activity
    activity.idempotency_key()   # the same on every attempt (see below)
    activity.attempt()           # 1 on first delivery, +1 per retry, 1 again after a redrive
    activity.heartbeat_details() # bytes from the last heartbeat of an earlier attempt, or None
    activity.record_heartbeat(b"ckpt-3")  # checkpoint; also extends the message deadline
    activity.key_of(msg)         # in a batch handler: the key of one record of the batch
    activity.produce("charges", value, key=b"order-42")  # an output (see below)

The key comes from the record, never from the attempt or the worker:
``"<workflow_id>/<activity_id>"`` when the record carries ids (in the Avro task envelope when
the worker has a codec, or in ``kw-workflow-id`` / ``kw-activity-id`` headers: ``id_headers``
makes them); else the place where the work first entered Kafka,
``"<topic>@<topic_id>/<partition>/<offset>"``, carried through the retry tiers, the DLQ and a
redrive (``kworkers.record_key``). A worker made with ``require_ids=True`` refuses records
without ids instead (``MissingActivityIds``, to the DLQ).
With an ``IdempotencyStore`` the invoker claims the key with a lease
before the handler runs: a key already done is skipped (the redelivery is absorbed); a key
leased by a live attempt elsewhere (or by another attempt of this process) is ``LeaseBusy``:
not the record's failure, its runner waits for the lease's end and runs it again, spending no
attempt; an expired lease means the attempt before never finished (its worker died or hung
holding it: seed 000 counts that as a failed attempt), so the record does not run in this
attempt: it is ``AttemptCrashed``, routed like any failed attempt (retried after the policy's
backoff with the last heartbeat details, which stay with the key; dead-lettered past
``max_attempts``), so a record that kills its worker every time ends in the DLQ instead of
holding its partition. A claim also says where its delivery stands (``turn_of``): a record
delivered again after its work was handed on to a later attempt (its commit lost in a crash) is
stale and skipped, so attempts never count backwards. The handler's effect must itself be
keyed (a unique constraint, or ``apply_once`` in the store's transaction): the lease makes
"claim, then work" safe against a worker dying between the two, the key makes the effect
happen once.

Heartbeat details also travel on the retry record (``kw-checkpoint``, up to 4 KiB), so the
next attempt resumes from them without a store too.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import logging
import os
import socket
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from kworkers.clock import Clock, SystemClock
from kworkers.consumer.outputs import Output, current_sink
from kworkers.consumer.partition import Lane
from kworkers.consumer.ports import Invoker
from kworkers.consumer.runner import current_lane
from kworkers.envelope.envelope import ActivityTask, EnvelopeCodec, ids_from_headers, ids_to_headers
from kworkers.errors import (
    AttemptCrashed,
    BatchError,
    ConfigError,
    DecodeError,
    FencedError,
    LeaseBusy,
)
from kworkers.idempotency.attempts import LiveAttempts
from kworkers.idempotency.store import UNTRACKED, ClaimState, IdempotencyStore, Turn
from kworkers.kafka.serialization import serialize
from kworkers.message import Headers, Message
from kworkers.payloads.serde import Serializer
from kworkers.record_key import KeyedInvoke, RecordKeys, bound
from kworkers.retry_tiers.headers import CHECKPOINT, REDRIVE_OF, last_value, origin_of
from kworkers.topic_names import is_tier_topic

log = logging.getLogger(__name__)
_UNSET: Any = object()
#: a takeover of an expired lease is the dead attempt's failure (``AttemptCrashed``); False
#: only in the canary that shows the crash-loop test has teeth (the rule before issue #43: the
#: takeover runs, counted as the record's attempt + 1, which a redelivery never moves past)
CRASHES_COUNT = True
#: a claim says where its delivery stands, so a redelivery of work already handed on is skipped
#: (``ClaimState.STALE``); False only in the canary of the crash-loop test (the rule before:
#: such a redelivery ran again, counted as its own, older attempt)
TURNS_TRACKED = True


class _Context:
    """One attempt's context; the key and the lane hooks are worked out only when asked for,
    so a handler that never calls into ``activity`` pays almost nothing per record."""

    __slots__ = ("attempt", "details", "heartbeats", "invoker", "key", "keys", "lane", "msg",
                 "task", "token")

    def __init__(self, msg: Message, invoker: ActivityInvoker, keys: RecordKeys | None,
                 key: str | None = _UNSET, task: ActivityTask | None = None,
                 details: bytes | None = None, token: int | None = None,
                 attempt: int | None = None) -> None:
        self.msg = msg
        self.invoker = invoker
        self.keys = keys
        self.key = key
        self.task = task
        self.details = details
        self.token = token
        self.attempt = msg.attempt if attempt is None else attempt
        self.lane: Lane | None = current_lane.get()
        self.heartbeats = 0


#: A plain call (no store, no codec) sets only what its context is made of: the record here,
#: its invoker and keys in ``_caller``: most handlers never ask, and building the context for
#: each record was a tenth of a no-op record's handler-thread CPU. ``_ctx`` makes it on the
#: first question.
_current: contextvars.ContextVar[_Context | Message | None] = contextvars.ContextVar(
    "kworkers_activity", default=None)

#: a plain call's (invoker, keys), one tuple per invoker, set only when it changes: a tuple
#: per call alive as long as the call was one more object per record in flight for the
#: collector to walk (issue #50: thousands of async handlers awaiting I/O)
_Caller = tuple["ActivityInvoker", "RecordKeys | None"]
_caller: contextvars.ContextVar[_Caller | None] = contextvars.ContextVar(
    "kworkers_activity_caller", default=None)


class _Batch:
    """A batch handler's context: keys of the batch's records, worked out when claimed."""

    __slots__ = ("invoker", "keys", "record_keys")

    def __init__(self, invoker: ActivityInvoker, keys: dict[Message, str | None],
                 record_keys: RecordKeys | None) -> None:
        self.invoker = invoker
        self.keys = keys
        self.record_keys = record_keys


_batch: contextvars.ContextVar[_Batch | None] = contextvars.ContextVar(
    "kworkers_activity_batch", default=None)


def _ctx() -> _Context:
    ctx = _current.get()
    if isinstance(ctx, Message):
        caller = _caller.get()
        assert caller is not None  # set with the record, in ``call_with``
        made = _Context(ctx, caller[0], caller[1])
        _current.set(made)  # the same context for the rest of this call
        return made
    if ctx is None:
        if _batch.get() is not None:
            raise RuntimeError("a batch handler has no single current record: read each "
                               "record's key with activity.key_of(msg)")
        raise RuntimeError("no activity context: call this from inside a kworkers handler")
    return ctx


def _missing_ids() -> DecodeError:
    return DecodeError(
        "this record carries no activity ids, which this worker requires (require_ids=True): "
        "send an Avro task envelope or the kw-workflow-id and kw-activity-id headers "
        "(kworkers.activity.id_headers)", type="MissingActivityIds")


def key_of(msg: Message) -> str:
    """The idempotency key of ``msg``: for batch handlers, which see many records at once (the
    same key a single-record handler reads with ``idempotency_key()``)."""
    b = _batch.get()
    if b is not None:
        key = b.keys.get(msg)
        if key is None:
            key = b.invoker._prepare(msg, b.record_keys)[0]
    else:  # from a single-record handler: keyed like its own record
        ctx = _ctx()
        key = ctx.invoker._prepare(msg, ctx.keys)[0]
    if key is None:
        raise _missing_ids()
    return key


def idempotency_key() -> str:
    """The record's key: ``"<workflow_id>/<activity_id>"`` when it carries ids, else where its
    work first entered Kafka, ``"<topic>@<topic_id>/<partition>/<offset>"``; the same on every
    attempt, through the retry tiers, the DLQ and a redrive. ``MissingActivityIds`` only from
    a worker made with ``require_ids=True``."""
    ctx = _ctx()
    if ctx.key is _UNSET:
        ctx.key = ctx.invoker._prepare(ctx.msg, ctx.keys)[0]
    if ctx.key is None:
        raise _missing_ids()
    return str(ctx.key)


def id_headers(workflow_id: str, activity_id: str) -> Headers:
    """The headers that give a record explicit ids, for a producer that sends plain records::

        producer.produce("orders", value, headers=activity.id_headers("order-42", "charge"))

    The key is then ``"order-42/charge"`` however often (and wherever) the record is produced:
    a retried send from the producer side is absorbed too, which a record's coordinates
    cannot do. Neither id may be empty or contain ``/``."""
    return ids_to_headers(workflow_id, activity_id)


def attempt() -> int:
    """The record's attempt (an attempt whose worker died holding the record counted: it
    reached this one through a retry tier as ``AttemptCrashed``)."""
    return _ctx().attempt


def task() -> ActivityTask | None:
    """The decoded task envelope, when the worker has a codec."""
    return _ctx().task


def heartbeat_details() -> bytes | None:
    """The last heartbeat details of an earlier attempt (or of this one), or None: from the
    idempotency store, else from the retry record this attempt runs (``kw-checkpoint``, which
    the hand-off wrote; read only on a tier record, which the tier gate checked)."""
    ctx = _ctx()
    if ctx.details is None and ctx.heartbeats == 0 and is_tier_topic(ctx.msg.topic):
        return last_value(ctx.msg.headers, CHECKPOINT)
    return ctx.details


def record_heartbeat(details: bytes) -> None:
    """Checkpoints ``details`` with the key, extends the lease and the message deadline.

    Refused (``FencedError``) once the partition was revoked or another attempt took the lease.
    """
    ctx = _ctx()
    lane = ctx.lane
    if lane is not None and lane.part.revoking:
        raise FencedError(f"partition of {ctx.msg.topic}/{ctx.msg.partition} was revoked: "
                          "heartbeat refused")
    ctx.details = details
    ctx.heartbeats += 1
    sink = current_sink.get()
    if sink is not None:  # the runner hands it on with a failure (``errors.keep_checkpoint``)
        sink.checkpoint = (ctx.msg, details)
    inv = ctx.invoker
    if inv is not None and inv.store is not None and ctx.token is not None:
        key, now = idempotency_key(), inv.clock.now()
        inv.store.heartbeat(key, ctx.token, details, inv.lease_s, now)
        inv.live.hold(key, ctx.token, now + inv.lease_s)
    if lane is not None:
        lane.touch()  # extends the per-message deadline


def produce(topic: str, value: Any, key: Any = None,
            headers: dict[str, str | bytes] | Headers | None = None, *,
            record: Message | None = None) -> None:
    """Produces a record to ``topic`` as an output of the handler call under way: sent only if
    the call succeeds, and the record it belongs to completes only once it is durable (see the
    module doc). ``value`` and ``key``: bytes, str (UTF-8), None, or anything the worker's
    ``value_serializer`` / ``key_serializer`` takes (serialized now, so a value its schema
    refuses fails this attempt). In a batch handler ``record=`` names the record of the batch
    an output belongs to; without it the output is the batch's."""
    sink = current_sink.get()
    if sink is None:
        raise RuntimeError("activity.produce: no handler call under way (call it from inside "
                           "a kworkers handler)")
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"activity.produce: topic must be a topic name, got {topic!r}")
    hs = _headers(headers)
    ctx: _Context | _Batch | None = (_ctx() if _current.get() is not None else None) \
        or _batch.get()
    ser = ctx.invoker.serializers if ctx is not None else (None, None)
    sink.add(Output(topic, _bytes(key, "key", topic, hs, ser[1]),
                    _bytes(value, "value", topic, hs, ser[0]), hs, record))


def _bytes(obj: Any, field: str, topic: str, headers: Headers,
           serializer: Serializer | None) -> bytes | None:
    if obj is None or isinstance(obj, bytes):
        return obj
    if serializer is not None:
        return serialize(serializer, obj, topic, "key" if field == "key" else "value", headers)
    if isinstance(obj, str):
        return obj.encode()
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    raise TypeError(f"activity.produce: the {field} is a {type(obj).__name__}: give bytes or "
                    f"str, or make the worker with {field}_serializer=... to produce objects")


def _headers(headers: dict[str, str | bytes] | Headers | None) -> Headers:
    if not headers:
        return ()
    pairs = headers.items() if isinstance(headers, dict) else headers
    out: list[tuple[str, bytes]] = []
    for name, v in pairs:
        if not isinstance(name, str):
            raise TypeError(f"activity.produce: header names are str, got {name!r}")
        if isinstance(v, str):
            v = v.encode()
        elif not isinstance(v, bytes):
            raise TypeError(f"activity.produce: header {name!r} is a {type(v).__name__}: "
                            "give bytes or str")
        out.append((name, v))
    return tuple(out)


def turn_of(msg: Message) -> Turn:
    """Where ``msg`` stands in its key's life (``idempotency.store.Turn``): its run is the
    dead letter a redrive replays (``kw-redrive-of``, kept on every hop after it), else where
    the work entered Kafka (the ``kw-original-*`` coordinates every tier hop carries, or the
    record's own); a digest, so a hostile header cannot bloat the store."""
    redrive_of = last_value(msg.headers, REDRIVE_OF) if msg.headers else None
    if redrive_of is not None:
        raw = b"r:" + redrive_of
    else:
        o = origin_of(msg)
        raw = b"o:%s/%d/%d" % (o.topic.encode(), o.partition, o.offset)
    return Turn(hashlib.blake2b(raw, digest_size=8).hexdigest(), msg.attempt)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ActivityInvoker:
    """An ``Invoker`` for the poll loop: sets the activity context around each handler call."""

    def __init__(self, store: IdempotencyStore | None = None, codec: EnvelopeCodec | None = None,
                 lease_s: float = 30.0, clock: Clock | None = None,
                 busy_retry: bool = True, require_ids: bool = False) -> None:
        if lease_s <= 0:
            raise ConfigError(f"lease_s: must be > 0, got {lease_s}")
        self.store = store
        self.codec = codec
        self.lease_s = lease_s
        self.clock = clock or SystemClock()
        self.owner = _owner()
        #: the keys this process's attempts hold (a store's lease is re-entrant for its owner)
        self.live = LiveAttempts()
        self.busy_retry = busy_retry
        #: records without ids are refused (``MissingActivityIds``) instead of keyed by origin
        self.require_ids = require_ids
        #: what ``produce`` turns objects into bytes with: (value, key)
        self.serializers: tuple[Serializer | None, Serializer | None] = (None, None)
        self.skipped = 0
        #: deliveries skipped as stale (``idempotency.store.Turn``)
        self.stale = 0
        self._plain = store is None and codec is None
        #: what a plain call sets in ``_caller`` (a new tuple only when the keys change)
        self._caller: _Caller = (self, None)
        self._last_handler: Callable[[Message], Any] | None = None
        self._last_async = False

    def _prepare(self, msg: Message, keys: RecordKeys | None
                 ) -> tuple[str | None, ActivityTask | None]:
        """(key, task): None for the key only when ids are required and missing."""
        if self.codec is not None:
            t = self.codec.decode(msg.value)  # DecodeError: non-retryable, to the DLQ
            return t.idempotency_key, t
        ids = ids_from_headers(msg.headers)
        if ids:
            return f"{ids[0]}/{ids[1]}", None
        if self.require_ids:
            return None, None
        if keys is None:
            raise RuntimeError("a record without ids is keyed by where it was first read, "
                               "which only the Worker that consumed it knows: run this "
                               "invoker inside a Worker (or give records ids)")
        return keys.key(msg), None

    def _claim(self, key: str | None, msg: Message
               ) -> tuple[int | None, bytes | None, bool, bool]:
        """(token, details, skip, takeover). ``LeaseBusy`` while another attempt holds the
        key; ``AttemptCrashed`` for the takeover of an expired lease; skip for a key done or a
        stale delivery (see the module doc)."""
        if self.store is None or key is None:
            return None, None, False, False
        now = self.clock.now()
        if not self.live.begin(key, now, self.lease_s):  # see kworkers.idempotency.attempts
            until = self.live.until(key) or now
            raise LeaseBusy(key, until, f"{key} is being worked on by another attempt in this "
                            f"process (its lease ends in {until - now:.1f}s)")
        try:
            claim = self.store.claim(key, self.owner, self.lease_s, now,
                                     turn_of(msg) if TURNS_TRACKED else UNTRACKED)
        except BaseException:
            self.live.end(key, None)
            raise
        if claim.state is not ClaimState.ACQUIRED:
            self.live.end(key, None)
            if claim.state is ClaimState.DONE:
                self.skipped += 1
                return None, None, True, False
            if claim.state is ClaimState.STALE:
                self.stale += 1
                log.info("%s: skipped a stale delivery (%s/%d@%d, attempt %d): a later attempt "
                         "of its work already claimed the key", key, msg.topic, msg.partition,
                         msg.offset, msg.attempt)
                return None, None, True, False
            raise LeaseBusy(key, claim.lease_until, f"{key} is being worked on by a live "
                            f"attempt (its lease ends in {claim.lease_until - now:.1f}s)")
        if claim.expired and CRASHES_COUNT:
            # The attempt before never finished: counted as failed, this one does not run.
            # The lease is given back (details kept) so the retry claims it at once.
            try:
                self.store.release(key, claim.token)
            finally:
                self.live.end(key, None)
            raise AttemptCrashed(f"the attempt before this one never finished: {key}'s lease "
                                 "ran out with no heartbeat (its worker died or hung "
                                 "holding it)")
        self.live.hold(key, claim.token, claim.lease_until)
        return claim.token, claim.details, False, claim.takeover

    def _context(self, msg: Message, keys: RecordKeys | None, key: str | None,
                 t: ActivityTask | None, token: int | None, details: bytes | None,
                 takeover: bool) -> _Context:
        # (a crashed attempt is counted by the record itself now: it came here through a tier;
        # the rule before issue #43, kept for its canary, counted a takeover here)
        bump = 1 if takeover and not CRASHES_COUNT else 0
        return _Context(msg, self, keys, key, t, details, token, msg.attempt + bump)

    def _done(self, ctx: _Context, ok: bool) -> None:
        if self.store is None or ctx.key is None or ctx.key is _UNSET or ctx.token is None:
            return
        if not ok:
            try:
                self.store.release(ctx.key, ctx.token)
            finally:
                self.live.end(ctx.key, ctx.token)
            return
        sink = current_sink.get()
        if sink is not None and sink.outputs:  # done only once its outputs are durable
            sink.then(partial(self._complete, str(ctx.key), ctx.token))
        else:
            self._complete(str(ctx.key), ctx.token)

    def _complete(self, key: str, token: int) -> None:
        assert self.store is not None
        try:
            self.store.complete(key, token, self.clock.now())
        except FencedError:
            # The handler marked the key done itself (``apply_once`` in the store's
            # transaction bumps the token): the effect is committed, nothing is left to
            # complete. Failing the record here would only send it through a retry tier.
            if not self.store.is_done(key):
                raise
        finally:
            self.live.end(key, token)

    def _is_async(self, handler: Callable[..., Any]) -> bool:
        if handler is not self._last_handler:
            self._last_handler = handler
            self._last_async = inspect.iscoroutinefunction(handler)
        return self._last_async

    def __call__(self, handler: Callable[..., Any], msg: Message | list[Message]) -> Any:
        # the worker's keys, read here: a coroutine below runs after this returns
        return self.call_with(bound(), handler, msg)

    def call_with(self, keys: RecordKeys | None, handler: Callable[..., Any],
                  msg: Message | list[Message]) -> Any:
        """The call, for the worker whose records ``keys`` keys: what the worker calls
        directly when this invoker is its own, unwrapped (``activity.keyed``); through any
        other wrapper the keys travel in the context variable ``__call__`` reads."""
        if self._plain and not isinstance(msg, list):
            # No store, no codec: only the context (the key is worked out when asked for),
            # set here for an async handler too: its coroutine is made here and awaited by
            # the caller in the same context (a task made for it copies this one), one
            # coroutine per record rather than two.
            caller = self._caller
            if caller[1] is not keys:
                caller = self._caller = (self, keys)
            if _caller.get() is not caller:
                _caller.set(caller)
            _current.set(msg)
            return handler(msg)
        if isinstance(msg, list):
            if self._is_async(handler):
                return self._call_batch_async(handler, msg, keys)
            return self._call_batch(handler, msg, keys)
        if self._is_async(handler):
            return self._call_async(handler, msg, keys)
        key, t = self._prepare(msg, keys)
        token, details, skip, takeover = self._claim(key, msg)
        if skip:
            return None
        ctx = self._context(msg, keys, key, t, token, details, takeover)
        reset = _current.set(ctx)
        try:
            result = handler(msg)
        except BaseException:
            self._done(ctx, ok=False)
            raise
        finally:
            _current.reset(reset)
        self._done(ctx, ok=True)
        return result

    # ------------------------------------------------------------------ batches

    def _claim_batch(self, msgs: list[Message], record_keys: RecordKeys | None) -> tuple[
            list[Message], dict[Message, str | None], dict[Message, tuple[str, int]],
            dict[Message, BaseException]]:
        """(records to run, keys, claims held, records failed before running). A record whose
        key is done already is neither run nor failed: its redelivery is absorbed."""
        run: list[Message] = []
        keys: dict[Message, str | None] = {}
        claims: dict[Message, tuple[str, int]] = {}
        failed: dict[Message, BaseException] = {}
        for m in msgs:
            try:
                key, _task = self._prepare(m, record_keys)
                keys[m] = key
                token, _details, skip, _takeover = self._claim(key, m)
            except Exception as exc:
                failed[m] = exc
                continue
            if skip:
                continue
            run.append(m)
            if key is not None and token is not None:
                claims[m] = (key, token)
        return run, keys, claims, failed

    def _settle_batch(self, run: list[Message], claims: dict[Message, tuple[str, int]],
                      failed: dict[Message, BaseException], err: BaseException | None) -> None:
        """Completes the claims of records that succeeded, releases the others; raises the
        batch's failures as one ``BatchError`` (or nothing when all succeeded)."""
        if err is not None:
            named = err.failures if isinstance(err, BatchError) else dict.fromkeys(run, err)
            ran = set(run)
            failed.update({m: e for m, e in named.items() if m in ran})
        store = self.store
        if store is not None:
            done: list[tuple[str, int]] = []
            for m, (key, token) in claims.items():
                if m in failed:
                    try:
                        store.release(key, token)
                    finally:
                        self.live.end(key, token)
                else:
                    done.append((key, token))
            sink = current_sink.get()
            if sink is not None and sink.outputs:  # done only once the outputs are durable
                sink.then(partial(self._complete_many, done))
            else:
                self._complete_many(done)
        if failed:
            raise BatchError(failed)

    def _complete_many(self, done: list[tuple[str, int]]) -> None:
        assert self.store is not None
        now = self.clock.now()
        try:
            for key, token in done:
                self.store.complete(key, token, now)
        finally:
            for key, token in done:
                self.live.end(key, token)

    def _call_batch(self, handler: Callable[..., Any], msgs: list[Message],
                    record_keys: RecordKeys | None) -> Any:
        if self._plain:
            reset = _batch.set(_Batch(self, {}, record_keys))
            try:
                return handler(msgs)
            finally:
                _batch.reset(reset)
        run, keys, claims, failed = self._claim_batch(msgs, record_keys)
        reset = _batch.set(_Batch(self, keys, record_keys))
        err: BaseException | None = None
        try:
            if run:
                handler(run)
        except Exception as exc:
            err = exc
        finally:
            _batch.reset(reset)
        self._settle_batch(run, claims, failed, err)
        return None

    async def _call_batch_async(self, handler: Callable[..., Any], msgs: list[Message],
                                record_keys: RecordKeys | None) -> Any:
        _batch.set(_Batch(self, {}, record_keys))  # a task's own context: no reset needed
        if self._plain:
            return await handler(msgs)
        run, keys, claims, failed = await asyncio.to_thread(self._claim_batch, msgs,
                                                            record_keys)
        _batch.set(_Batch(self, keys, record_keys))
        err: BaseException | None = None
        try:
            if run:
                await handler(run)
        except Exception as exc:
            err = exc
        await asyncio.to_thread(self._settle_batch, run, claims, failed, err)
        return None

    # ------------------------------------------------------------------ single records

    def _prepare_and_claim(self, msg: Message, keys: RecordKeys | None) -> tuple[
            str | None, ActivityTask | None, tuple[int | None, bytes | None, bool, bool]]:
        key, t = self._prepare(msg, keys)  # may read a topic id or the DLQ: off the loop
        return key, t, self._claim(key, msg)

    async def _call_async(self, handler: Callable[[Message], Any], msg: Message,
                          keys: RecordKeys | None) -> Any:
        key, t, claimed = await asyncio.to_thread(self._prepare_and_claim, msg, keys)
        token, details, skip, takeover = claimed
        if skip:
            return None
        ctx = self._context(msg, keys, key, t, token, details, takeover)
        reset = _current.set(ctx)
        try:
            result = await handler(msg)
        except BaseException:
            await asyncio.to_thread(self._done, ctx, False)
            raise
        finally:
            _current.reset(reset)
        await asyncio.to_thread(self._done, ctx, True)
        return result


def keyed(inner: Invoker, keys: RecordKeys) -> Invoker:
    """``inner``, keying records by ``keys``. The worker's own invoker, unwrapped (the usual
    case), is given them as an argument: a context variable set and reset around every record
    cost a no-op handler's call half its CPU. Any other (tracing, a test's instrument) is
    wrapped in ``KeyedInvoke``, so whatever it wraps finds them in the context. (Here, beside
    the invoker it tells apart, so ``record_key`` need not know the activity module.)"""
    if type(inner) is ActivityInvoker:
        return partial(inner.call_with, keys)
    return KeyedInvoke(inner, keys)
