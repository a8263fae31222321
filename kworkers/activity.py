"""The activity context a handler reads: its idempotency key, attempt and heartbeat checkpoint.

    from kworkers import activity
    activity.idempotency_key()   # "<workflow_id>/<activity_id>", the same on every attempt
    activity.attempt()           # 1 on first delivery, +1 per retry, 1 again after a redrive
    activity.heartbeat_details() # bytes from the last heartbeat of an earlier attempt, or None
    activity.record_heartbeat(b"ckpt-3")  # checkpoint; also extends the message deadline
    activity.key_of(msg)         # in a batch handler: the key of one record of the batch

The key comes from the record, never from the attempt, the worker or the offset: the ids travel
in the Avro task envelope (when the worker has a codec) or in ``kw-workflow-id`` /
``kw-activity-id`` headers. With an ``IdempotencyStore`` the invoker claims the key with a lease
before the handler runs: a key already done is skipped (the redelivery is absorbed), a key
leased by a live attempt elsewhere is retried later, an expired lease is taken over with the
last heartbeat details. The handler's effect must itself be keyed (a unique constraint, or
``apply_once`` in the store's transaction): the lease makes "claim, then work" safe against a
worker dying between the two, the key makes the effect happen once.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from kworkers.clock import Clock, SystemClock
from kworkers.consumer.partition import Lane
from kworkers.consumer.runner import current_lane
from kworkers.envelope.envelope import ActivityTask, EnvelopeCodec, ids_from_headers
from kworkers.errors import BatchError, ConfigError, DecodeError, FencedError, RetryableError
from kworkers.idempotency.store import ClaimState, IdempotencyStore
from kworkers.message import Message

_UNSET: Any = object()


class _Context:
    """One attempt's context; the key and the lane hooks are worked out only when asked for,
    so a handler that never calls into ``activity`` pays almost nothing per record."""

    __slots__ = ("attempt", "details", "heartbeats", "invoker", "key", "lane", "msg", "task",
                 "token")

    def __init__(self, msg: Message, invoker: ActivityInvoker | None, key: str | None = _UNSET,
                 task: ActivityTask | None = None, details: bytes | None = None,
                 token: int | None = None, attempt: int | None = None) -> None:
        self.msg = msg
        self.invoker = invoker
        self.key = key
        self.task = task
        self.details = details
        self.token = token
        self.attempt = msg.attempt if attempt is None else attempt
        self.lane: Lane | None = current_lane.get()
        self.heartbeats = 0


_current: contextvars.ContextVar[_Context | None] = contextvars.ContextVar(
    "kworkers_activity", default=None)


class _Batch:
    """A batch handler's context: keys of the batch's records, worked out when claimed."""

    __slots__ = ("invoker", "keys")

    def __init__(self, invoker: ActivityInvoker, keys: dict[Message, str | None]) -> None:
        self.invoker = invoker
        self.keys = keys


_batch: contextvars.ContextVar[_Batch | None] = contextvars.ContextVar(
    "kworkers_activity_batch", default=None)


def _ctx() -> _Context:
    ctx = _current.get()
    if ctx is None:
        if _batch.get() is not None:
            raise RuntimeError("a batch handler has no single current record: read each "
                               "record's key with activity.key_of(msg)")
        raise RuntimeError("no activity context: call this from inside a kworkers handler")
    return ctx


def key_of(msg: Message) -> str:
    """The idempotency key of ``msg``: for batch handlers, which see many records at once (the
    same ``<workflow_id>/<activity_id>`` a single-record handler reads with
    ``idempotency_key()``). DecodeError when the record carries no activity ids."""
    b = _batch.get()
    key = b.keys.get(msg) if b is not None else None
    if key is None:
        inv = b.invoker if b is not None else None
        key = inv._prepare(msg)[0] if inv is not None else _header_key(msg)
    if key is None:
        raise DecodeError(
            "this record carries no activity ids: send an Avro task envelope or the "
            "kw-workflow-id and kw-activity-id headers", type="MissingActivityIds")
    return key


def _header_key(msg: Message) -> str | None:
    ids = ids_from_headers(msg.headers)
    return f"{ids[0]}/{ids[1]}" if ids else None


def idempotency_key() -> str:
    ctx = _ctx()
    if ctx.key is _UNSET:
        ids = ids_from_headers(ctx.msg.headers)
        ctx.key = f"{ids[0]}/{ids[1]}" if ids else None
    if ctx.key is None:
        raise DecodeError(
            "this record carries no activity ids: send an Avro task envelope or the "
            "kw-workflow-id and kw-activity-id headers", type="MissingActivityIds")
    return str(ctx.key)


def attempt() -> int:
    """The record's attempt; a takeover of a crashed attempt's expired lease counts as one more."""
    return _ctx().attempt


def task() -> ActivityTask | None:
    """The decoded task envelope, when the worker has a codec."""
    return _ctx().task


def heartbeat_details() -> bytes | None:
    return _ctx().details


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
    inv = ctx.invoker
    if inv is not None and inv.store is not None and ctx.token is not None:
        inv.store.heartbeat(idempotency_key(), ctx.token, details, inv.lease_s, inv.clock.now())
    if lane is not None:
        lane.touch()  # extends the per-message deadline


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ActivityInvoker:
    """An ``Invoker`` for the poll loop: sets the activity context around each handler call."""

    def __init__(self, store: IdempotencyStore | None = None, codec: EnvelopeCodec | None = None,
                 lease_s: float = 30.0, clock: Clock | None = None,
                 busy_retry: bool = True) -> None:
        if lease_s <= 0:
            raise ConfigError(f"lease_s: must be > 0, got {lease_s}")
        self.store = store
        self.codec = codec
        self.lease_s = lease_s
        self.clock = clock or SystemClock()
        self.owner = _owner()
        self.busy_retry = busy_retry
        self.skipped = 0
        self._plain = store is None and codec is None
        self._last_handler: Callable[[Message], Any] | None = None
        self._last_async = False

    def _prepare(self, msg: Message) -> tuple[str | None, ActivityTask | None]:
        if self.codec is not None:
            t = self.codec.decode(msg.value)  # DecodeError: non-retryable, to the DLQ
            return t.idempotency_key, t
        ids = ids_from_headers(msg.headers)
        return (f"{ids[0]}/{ids[1]}" if ids else None), None

    def _claim(self, key: str | None) -> tuple[int | None, bytes | None, bool, bool]:
        """(token, details, skip, takeover)."""
        if self.store is None or key is None:
            return None, None, False, False
        claim = self.store.claim(key, self.owner, self.lease_s, self.clock.now())
        if claim.state is ClaimState.DONE:
            self.skipped += 1
            return None, None, True, False
        if claim.state is ClaimState.BUSY:
            raise RetryableError("LeaseBusy", f"{key} is being worked on by a live attempt")
        return claim.token, claim.details, False, claim.takeover

    def _context(self, msg: Message, key: str | None, t: ActivityTask | None, token: int | None,
                  details: bytes | None, takeover: bool) -> _Context:
        return _Context(msg, self, key, t, details, token,
                        msg.attempt + (1 if takeover else 0))

    def _done(self, ctx: _Context, ok: bool) -> None:
        if self.store is None or ctx.key is None or ctx.key is _UNSET or ctx.token is None:
            return
        if ok:
            try:
                self.store.complete(ctx.key, ctx.token, self.clock.now())
            except FencedError:
                # The handler marked the key done itself (``apply_once`` in the store's
                # transaction bumps the token): the effect is committed, nothing is left to
                # complete. Failing the record here would only send it through a retry tier.
                if not self.store.is_done(ctx.key):
                    raise
        else:
            self.store.release(ctx.key, ctx.token)

    def _is_async(self, handler: Callable[..., Any]) -> bool:
        if handler is not self._last_handler:
            self._last_handler = handler
            self._last_async = inspect.iscoroutinefunction(handler)
        return self._last_async

    def __call__(self, handler: Callable[..., Any], msg: Message | list[Message]) -> Any:
        if isinstance(msg, list):
            if self._is_async(handler):
                return self._call_batch_async(handler, msg)
            return self._call_batch(handler, msg)
        if self._plain:
            # No store, no codec: only the context (the key is read lazily from headers).
            if self._is_async(handler):
                return self._call_plain_async(handler, msg)
            _current.set(_Context(msg, self))
            return handler(msg)
        if self._is_async(handler):
            return self._call_async(handler, msg)
        key, t = self._prepare(msg)
        token, details, skip, takeover = self._claim(key)
        if skip:
            return None
        ctx = self._context(msg, key, t, token, details, takeover)
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

    def _claim_batch(self, msgs: list[Message]) -> tuple[
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
                key, _task = self._prepare(m)
                keys[m] = key
                token, _details, skip, _takeover = self._claim(key)
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
            now = self.clock.now()
            for m, (key, token) in claims.items():
                if m in failed:
                    store.release(key, token)
                else:
                    store.complete(key, token, now)
        if failed:
            raise BatchError(failed)

    def _call_batch(self, handler: Callable[..., Any], msgs: list[Message]) -> Any:
        if self._plain:
            reset = _batch.set(_Batch(self, {}))
            try:
                return handler(msgs)
            finally:
                _batch.reset(reset)
        run, keys, claims, failed = self._claim_batch(msgs)
        reset = _batch.set(_Batch(self, keys))
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

    async def _call_batch_async(self, handler: Callable[..., Any], msgs: list[Message]) -> Any:
        _batch.set(_Batch(self, {}))  # a task's own context: no reset needed
        if self._plain:
            return await handler(msgs)
        run, keys, claims, failed = await asyncio.to_thread(self._claim_batch, msgs)
        _batch.set(_Batch(self, keys))
        err: BaseException | None = None
        try:
            if run:
                await handler(run)
        except Exception as exc:
            err = exc
        await asyncio.to_thread(self._settle_batch, run, claims, failed, err)
        return None

    # ------------------------------------------------------------------ single records

    async def _call_plain_async(self, handler: Callable[[Message], Any], msg: Message) -> Any:
        _current.set(_Context(msg, self))  # a task's own context: no reset needed
        return await handler(msg)

    async def _call_async(self, handler: Callable[[Message], Any], msg: Message) -> Any:
        key, t = self._prepare(msg)
        token, details, skip, takeover = await asyncio.to_thread(self._claim, key)
        if skip:
            return None
        ctx = self._context(msg, key, t, token, details, takeover)
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
