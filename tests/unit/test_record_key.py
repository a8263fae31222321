"""Keys of records without ids (``kworkers.record_key``): one record, one key, on every hop.

The hops are built by the real router (``FailureRouter``) and the real redrive headers, so
what is checked is what a worker writes; the cluster is two fakes that count their calls: the
topic-id look-up and the DLQ read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from kworkers import NonRetryableError, activity
from kworkers.activity import ActivityInvoker, keyed
from kworkers.clock import FakeClock
from kworkers.errors import DecodeError
from kworkers.message import Headers, Message
from kworkers.record_key import (
    DeadLetterCheck,
    KeyedInvoke,
    RecordKeys,
    TopicIds,
    bound,
    origin_key,
)
from kworkers.retry_tiers.headers import (
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
    ORIGINAL_TOPIC_ID,
    REDRIVE_OF,
    Origin,
    redrive_headers,
)
from kworkers.retry_tiers.policy import RetryPolicy, no_jitter
from kworkers.retry_tiers.router import FailureRouter
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.tracing import TracedInvoke

OLD_ID, NEW_ID = "AAAAAAAAAAAAAAAAAAAAAQ", "AAAAAAAAAAAAAAAAAAAAAg"


class Cluster:
    """The two look-ups, counted: ``ids`` per topic, ``dlq`` records per topic."""

    def __init__(self) -> None:
        self.ids = {"orders": OLD_ID, "other": NEW_ID}
        self.dlq: dict[str, list[Message]] = {}
        self.described: list[str] = []
        self.reads = 0

    def describe(self, topic: str) -> str:
        self.described.append(topic)
        return self.ids[topic]

    def read(self, dlq: str, partition: int, offset: int, n: int) -> Sequence[Message]:
        self.reads += 1
        got = [m for m in self.dlq.get(dlq, []) if m.partition == partition and
               m.offset >= offset]
        return got[:n]

    def keys(self) -> RecordKeys:
        return RecordKeys(TopicIds(self.describe), DeadLetterCheck(self.read, window=3))


def _msg(offset: int, topic: str = "orders", partition: int = 2, value: bytes = b"v",
         headers: Headers = (), ts: int | None = 1_000, attempt: int = 1) -> Message:
    return Message(topic, partition, offset, b"k", value, headers, ts, attempt)


CLOCK = FakeClock(1_700_000_000.0)
POLICY = RetryPolicy(initial=1.0, max_attempts=3)


def _router(keys: RecordKeys | None) -> FailureRouter:
    return FailureRouter(POLICY, TierLadder((1.0,)), "g", no_jitter, CLOCK, keys)


def _hop(router: FailureRouter, msg: Message, exc: Exception, offset: int) -> Message:
    """``msg`` failed with ``exc``: the record the router writes, as read back at ``offset``."""
    h = router.plan(msg, exc)
    return Message(h.topic, msg.partition, offset, h.key, h.value, h.headers, msg.timestamp_ms,
                   msg.attempt + 1 if h.destination.label == "retry" else msg.attempt)


def test_the_key_is_the_origin_and_never_an_explicit_key() -> None:
    o = Origin("orders", 2, 41, None, None, OLD_ID)
    assert origin_key(o) == f"orders@{OLD_ID}/2/41"
    assert origin_key(o).count("/") == 2  # an explicit "<workflow>/<activity>" has one
    with pytest.raises(ValueError, match="topic id"):
        origin_key(Origin("orders", 2, 41, None, None, None))


def test_topic_ids_are_read_per_partition_and_again_when_it_is_read_from_earlier() -> None:
    c = Cluster()
    ids = TopicIds(c.describe)
    assert ids.peek(_msg(5)) is None  # never read: peek does not read
    assert [ids.id_for(_msg(o)) for o in (5, 6, 7, 9)] == [OLD_ID] * 4
    assert c.described == ["orders"]  # one read for the partition
    assert ids.id_for(_msg(5)) == OLD_ID and c.described == ["orders"]  # the same record again
    assert ids.id_for(_msg(3, partition=1)) == OLD_ID and len(c.described) == 2  # another one
    ids.id_for(_msg(4))  # fetched before the read, finished after it: read again, same id
    assert len(c.described) == 3 and ids.peek(_msg(5)) == OLD_ID
    # the topic is created again: its first record comes at an offset read before
    c.ids["orders"] = NEW_ID
    assert ids.id_for(_msg(0)) == NEW_ID
    assert ids.peek(_msg(3, partition=1)) is None  # vouched under the old id: read again
    assert ids.id_for(_msg(1)) == NEW_ID


def test_a_new_record_at_the_lowest_offset_is_told_apart_by_its_timestamp() -> None:
    c = Cluster()
    ids = TopicIds(c.describe)
    ids.id_for(_msg(0, ts=1_000))
    c.ids["orders"] = NEW_ID
    assert ids.id_for(_msg(0, ts=1_000)) == OLD_ID  # the same record
    assert ids.id_for(_msg(0, ts=2_000)) == NEW_ID  # another record at that offset


def test_one_key_from_the_source_through_a_tier_the_dlq_and_a_redrive() -> None:
    c = Cluster()
    keys = c.keys()
    router = _router(keys)
    first = _msg(41)
    key = keys.key(first)
    assert key == f"orders@{OLD_ID}/2/41"

    retry = _hop(router, first, RuntimeError("db down"), offset=7)
    assert retry.topic == "orders.retry.1s"
    assert dict(retry.headers)[ORIGINAL_TOPIC_ID] == OLD_ID.encode()
    assert keys.key(retry) == key
    dead = _hop(router, retry, NonRetryableError("Bad", "no"), offset=3)
    assert dead.topic == "orders.dlq"
    h = dict(dead.headers)
    assert (h[ORIGINAL_TOPIC], h[ORIGINAL_PARTITION], h[ORIGINAL_OFFSET],
            h[ORIGINAL_TOPIC_ID]) == (b"orders", b"2", b"41", OLD_ID.encode())
    c.dlq["orders.dlq"] = [dead]

    replay = _msg(90, headers=redrive_headers(dead))  # what `kworkers dlq redrive` writes
    assert dict(replay.headers)[REDRIVE_OF] == b"orders.dlq/2/3"
    assert keys.key(replay) == key
    assert c.reads == 1
    again = _hop(router, replay, RuntimeError("still down"), offset=8)  # a tier hop of it
    assert keys.key(again) == key
    assert c.reads == 1  # the dead letter was read once
    assert c.described == ["orders"]


@pytest.mark.parametrize("case", ["other bytes", "another DLQ", "no such dead letter",
                                  "not a dead letter", "garbage reference"])
def test_a_replay_that_the_dlq_does_not_vouch_for_keys_by_itself(case: str) -> None:
    c = Cluster()
    keys = c.keys()
    router = _router(keys)
    dead = _hop(router, _msg(41), NonRetryableError("Bad", "no"), offset=3)
    c.dlq["orders.dlq"] = [dead]
    c.dlq["other.dlq"] = [dead._replace(topic="other.dlq")]
    ref, value = b"orders.dlq/2/3", b"v"
    if case == "other bytes":
        value = b"v2"
    elif case == "another DLQ":
        ref = b"other.dlq/2/3"
    elif case == "no such dead letter":
        ref = b"orders.dlq/2/4"
    elif case == "not a dead letter":
        c.dlq["orders.dlq"] = [dead._replace(headers=())]
    else:
        ref = b"orders.dlq/two/3"
    replay = _msg(90, value=value, headers=((REDRIVE_OF, ref), ("kw-attempt", b"1")))
    assert keys.key(replay) == f"orders@{OLD_ID}/2/90"


def test_a_source_records_own_kw_headers_never_choose_its_key() -> None:
    c = Cluster()
    keys = c.keys()
    forged = _msg(90, headers=((ORIGINAL_TOPIC, b"orders"), (ORIGINAL_PARTITION, b"2"),
                               (ORIGINAL_OFFSET, b"41"), (ORIGINAL_TOPIC_ID, OLD_ID.encode()),
                               ("kw-attempt", b"3")))
    assert keys.key(forged) == f"orders@{OLD_ID}/2/90"
    # and the hand-off records the forger's own place, not the one it named
    retry = _hop(_router(keys), forged, RuntimeError("x"), offset=1)
    assert dict(retry.headers)[ORIGINAL_OFFSET] == b"90"


def test_the_hand_off_never_waits_for_the_cluster() -> None:
    c = Cluster()

    def unreachable(topic: str) -> str:
        raise AssertionError("the hand-off read a topic id")

    def unreadable(dlq: str, partition: int, offset: int, n: int) -> Sequence[Message]:
        raise AssertionError("the hand-off read the DLQ")

    keys = RecordKeys(TopicIds(unreachable), DeadLetterCheck(unreadable))
    router = _router(keys)
    retry = _hop(router, _msg(41), RuntimeError("x"), offset=1)  # no attempt asked for a key
    assert ORIGINAL_TOPIC_ID not in dict(retry.headers)
    _hop(router, _msg(42, headers=((REDRIVE_OF, b"orders.dlq/2/3"),)), RuntimeError("x"), 2)
    # the id is read when a later attempt asks for the key: the same key as a vouched one
    late = c.keys()
    assert late.key(retry) == f"orders@{OLD_ID}/2/41" == c.keys().key(_msg(41))


def test_a_recreated_topic_gives_new_keys_to_the_same_offsets() -> None:
    c = Cluster()
    keys = c.keys()
    before = keys.key(_msg(0, ts=1_000))
    c.ids["orders"] = NEW_ID
    after = keys.key(_msg(0, ts=5_000))
    assert before != after and after == f"orders@{NEW_ID}/2/0"


def test_handlers_read_it_inside_a_worker_and_only_explicit_workers_refuse() -> None:
    c = Cluster()
    keys = c.keys()
    seen: list[str] = []

    def handler(msg: Message) -> None:
        seen.append(activity.idempotency_key())

    KeyedInvoke(ActivityInvoker(), keys)(handler, _msg(41))
    KeyedInvoke(ActivityInvoker(), keys)(handler, _msg(42, headers=activity.id_headers(
        "order-42", "charge")))
    assert seen == [f"orders@{OLD_ID}/2/41", "order-42/charge"]

    def batch(msgs: list[Message]) -> None:
        seen.extend(activity.key_of(m) for m in msgs)

    KeyedInvoke(ActivityInvoker(), keys)(batch, [_msg(43), _msg(44)])
    assert seen[-2:] == [f"orders@{OLD_ID}/2/43", f"orders@{OLD_ID}/2/44"]

    with pytest.raises(DecodeError) as refused:
        KeyedInvoke(ActivityInvoker(require_ids=True), keys)(handler, _msg(45))
    assert refused.value.type == "MissingActivityIds"


def test_an_async_handler_behind_tracing_gets_the_same_key() -> None:
    c = Cluster()
    keys = c.keys()
    seen: list[str] = []

    async def handler(msg: Message) -> None:
        seen.append(activity.idempotency_key())

    invoke = KeyedInvoke(TracedInvoke(inner=ActivityInvoker(), auto=False), keys)
    asyncio.run(invoke(handler, _msg(41)))
    assert seen == [f"orders@{OLD_ID}/2/41"]


def test_the_direct_and_the_wrapped_ways_give_the_same_keys() -> None:
    """``keyed`` hands the keys to the worker's own invoker directly and to anything else
    through the context (``KeyedInvoke``): a sync, an async and a batch handler see the same
    keys both ways, and nothing stays bound after a call."""
    keys = Cluster().keys()

    def run(invoke: Any) -> list[str]:
        seen: list[str] = []

        def handler(msg: Message) -> None:
            seen.append(activity.idempotency_key())

        async def async_handler(msg: Message) -> None:
            seen.append(activity.idempotency_key())

        def batch(msgs: list[Message]) -> None:
            seen.extend(activity.key_of(m) for m in msgs)

        invoke(handler, _msg(41))
        asyncio.run(invoke(async_handler, _msg(42)))
        invoke(batch, [_msg(43)])
        assert bound() is None
        return seen

    inner = ActivityInvoker()
    direct = keyed(inner, keys)
    wrapped = keyed(lambda h, m: inner(h, m), keys)
    assert not isinstance(direct, KeyedInvoke) and isinstance(wrapped, KeyedInvoke)
    want = [f"orders@{OLD_ID}/2/{o}" for o in (41, 42, 43)]
    assert run(direct) == want
    assert run(wrapped) == want


class _TrustingKeys(RecordKeys):
    """Canary: believes a source record's kw-* headers, as a naive implementation would."""

    def _origin(self, msg: Message, read: bool) -> Origin:
        from kworkers.retry_tiers.headers import failure_of

        info = failure_of(msg.headers)
        if info is None:
            return super()._origin(msg, read)
        return Origin(info.original_topic, info.original_partition, info.original_offset,
                      None, None, info.original_topic_id)


class _IdlessKeys(RecordKeys):
    """Canary: keys by coordinates alone, without the topic id."""

    def key(self, msg: Message) -> str:
        o = self.origin(msg)
        return f"{o.topic}/{o.partition}/{o.offset}"


def test_canaries_the_checks_above_catch() -> None:
    c = Cluster()
    victim = f"orders@{OLD_ID}/2/41"
    forged = _msg(90, headers=((ORIGINAL_TOPIC, b"orders"), (ORIGINAL_PARTITION, b"2"),
                               (ORIGINAL_OFFSET, b"41"), (ORIGINAL_TOPIC_ID, OLD_ID.encode()),
                               ("kw-attempt", b"3"), ("kw-group", b"g"),
                               ("kw-first-failure-at", b"1"), ("kw-last-failure-at", b"1"),
                               ("kw-error-type", b"X"), ("kw-error-message", b"x")))
    trusting = _TrustingKeys(TopicIds(c.describe), DeadLetterCheck(c.read))
    assert trusting.key(forged) == victim  # what the header test refuses
    idless = _IdlessKeys(TopicIds(c.describe), DeadLetterCheck(c.read))
    before = idless.key(_msg(0, ts=1_000))
    c.ids["orders"] = NEW_ID
    assert idless.key(_msg(0, ts=5_000)) == before  # what the recreated-topic test refuses


def test_topic_ids_are_written_as_kafka_prints_them() -> None:
    """librdkafka's text for a Uuid uses the standard base64 alphabet ('+', '/'); Kafka's
    tools and the kw-original-topic-id header use the URL-safe one, without padding."""
    from confluent_kafka import Uuid

    from kworkers.kafka.lookups import kafka_form

    assert str(Uuid(-1, -1)) == "/////////////////////w"
    assert kafka_form(Uuid(-1, -1)) == "_____________________w"
    assert kafka_form(Uuid(1234, 5678)) == "AAAAAAAABNIAAAAAAAAWLg" == str(Uuid(1234, 5678))
    assert kafka_form(Uuid(-(1 << 58) - 1, 0)) == "-_________8AAAAAAAAAAA"
