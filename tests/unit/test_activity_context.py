"""The activity context: key from headers, attempt, heartbeats fenced after a revoke."""

from __future__ import annotations

import pytest

from kworkers import activity
from kworkers.activity import ActivityInvoker
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.runner import current_lane
from kworkers.envelope.envelope import ids_to_headers
from kworkers.errors import DecodeError, FencedError
from kworkers.message import Message


def _msg(headers: tuple[tuple[str, bytes], ...] = (), attempt: int = 1) -> Message:
    return Message("orders", 0, 5, b"k", b"v", headers, None, attempt)


def test_key_and_attempt_inside_a_handler() -> None:
    seen = []
    invoke = ActivityInvoker()
    invoke(lambda m: seen.append((activity.idempotency_key(), activity.attempt())),
           _msg(ids_to_headers("wf-7", "charge"), attempt=3))
    assert seen == [("wf-7/charge", 3)]


def test_missing_ids_is_a_decode_error_only_where_ids_are_required() -> None:
    def handler(_m: Message) -> None:
        activity.idempotency_key()

    with pytest.raises(DecodeError) as missing:
        ActivityInvoker(require_ids=True)(handler, _msg())
    assert missing.value.type == "MissingActivityIds"
    assert "require_ids=True" in str(missing.value)
    # without require_ids the key is the record's origin, which only a Worker knows
    with pytest.raises(RuntimeError, match="run this invoker inside a Worker"):
        ActivityInvoker()(handler, _msg())


def test_heartbeat_is_refused_once_the_partition_is_revoked() -> None:
    part = PartitionState("orders", 0)
    token = current_lane.set(part.lane)
    try:
        beats = []

        def handler(_m: Message) -> None:
            activity.record_heartbeat(b"ckpt-1")
            beats.append(activity.heartbeat_details())
            part.stop_dispatch()  # the partition is revoked mid-handler
            activity.record_heartbeat(b"ckpt-2")

        with pytest.raises(FencedError):
            ActivityInvoker()(handler, _msg(ids_to_headers("wf", "a")))
        assert beats == [b"ckpt-1"]
    finally:
        current_lane.reset(token)


def test_outside_a_handler_is_a_clear_error() -> None:
    import contextvars

    ctx = contextvars.Context()
    with pytest.raises(RuntimeError, match="inside a kworkers handler"):
        ctx.run(activity.attempt)
