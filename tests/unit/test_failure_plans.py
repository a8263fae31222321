"""The failure path's kept plans: a router keeps the record-independent part of a decision and
its headers per distinct failure (a storm fails thousands of records alike). What a kept plan
must never do: give one record another's coordinates, times or due time; give a failure
another failure's type, message or attempt; or grow without bound.

Judged against the one-shot functions (``route``, ``retry_headers``, ``dead_letter_headers``),
which build everything per call: the router's hand-off must be byte for byte what they make.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kworkers.clock import FakeClock
from kworkers.errors import NonRetryableError, RetryableError, keep_checkpoint
from kworkers.memory import header_bytes, message_bytes
from kworkers.message import Message
from kworkers.retry_tiers import router as router_mod
from kworkers.retry_tiers.headers import (
    CHECKPOINT,
    Origin,
    dead_letter_headers,
    failure_of,
    origin_of,
    retry_headers,
)
from kworkers.retry_tiers.policy import RetryPolicy, SeededJitter, no_jitter
from kworkers.retry_tiers.router import FailureRouter
from kworkers.retry_tiers.routing import DeadLetterDecision, RetryDecision, route
from kworkers.retry_tiers.tiers import TierLadder

POLICY = RetryPolicy(initial=1.0, backoff=2.0, max_interval=30.0, max_attempts=3)
LADDER = TierLadder((1.0, 5.0, 30.0))


def _router(clock: FakeClock, jitter: object = no_jitter) -> FailureRouter:
    return FailureRouter(POLICY, LADDER, "g", jitter, clock)  # type: ignore[arg-type]


def _msg(offset: int, topic: str = "orders", headers: tuple[tuple[str, bytes], ...] = (),
         attempt: int = 1) -> Message:
    return Message(topic, offset % 3, offset, b"k%d" % offset, b"v%d" % offset, headers,
                   1_700_000_000_000 + offset, attempt)


def test_a_kept_plan_is_byte_for_byte_the_one_shot_hand_off() -> None:
    """Many records failing alike, at moving times: each hand-off equals what ``route`` and
    the header functions build for that record alone (same jitter draws on both sides)."""
    clock = FakeClock(1_000.0)
    router = _router(clock, SeededJitter(7))
    oneshot = SeededJitter(7)
    for i in range(200):
        clock.advance(0.013)
        msg = _msg(i, headers=(("traceparent", b"00-%032d-%016d-01" % (i, i)),))
        exc = ConnectionError("downstream is down")
        got = router.plan(msg, exc)
        want = route(POLICY, LADDER, "orders", 1, exc, clock.now(), oneshot)
        assert isinstance(want, RetryDecision)
        assert got.decision == want
        assert got.topic == want.tier.topic
        assert got.headers == retry_headers(msg, "g", want, clock.now())
        info = failure_of(got.headers)
        assert info is not None
        assert (info.original_offset, info.original_partition) == (i, i % 3)
        assert info.last_failure_at == round(clock.now(), 3)


def test_failures_that_differ_in_type_message_or_attempt_get_their_own_plan() -> None:
    clock = FakeClock(50.0)
    router = _router(clock)
    cases = [
        (_msg(1), ConnectionError("a")),
        (_msg(2), ConnectionError("b")),  # another message
        (_msg(3), TimeoutError("a")),  # another type
        (_msg(4, attempt=2), ConnectionError("a")),  # another attempt
        (_msg(5, attempt=3), ConnectionError("a")),  # exhausted: the DLQ
        (_msg(6), NonRetryableError("Poison", "a")),  # marked: the DLQ at once
        (_msg(7), RetryableError("Flaky", "a")),  # typed: its own type
        (_msg(8), ConnectionError("a")),  # the first one's plan again
    ]
    for msg, exc in cases:
        got = router.plan(msg, exc)
        want = route(POLICY, LADDER, "orders", msg.attempt, exc, clock.now(), no_jitter)
        assert got.decision == want, (msg.offset, exc)
        if isinstance(want, DeadLetterDecision):
            assert got.topic == "orders.dlq"
            assert got.headers == dead_letter_headers(msg, "g", want, clock.now())
        else:
            assert got.headers == retry_headers(msg, "g", want, clock.now())


def test_canary_a_plan_kept_per_type_only_would_mix_messages() -> None:
    """The check above catches a memo keyed too coarsely: two messages of one type, the second
    would read the first's error message."""
    clock = FakeClock(50.0)
    router = _router(clock)
    router.plan(_msg(1), ConnectionError("first"))
    real = router._rung

    def coarse(attempt: int, error_type: str, error_message: str, marked: bool) -> object:
        return real(attempt, error_type, "first", marked)

    router._rung = coarse  # type: ignore[method-assign,assignment]
    got = router.plan(_msg(2), ConnectionError("second"))
    want = route(POLICY, LADDER, "orders", 1, ConnectionError("second"), clock.now(), no_jitter)
    assert got.decision != want  # the broken memo is caught by the comparison used above


def test_the_memo_is_bounded() -> None:
    """A handler that puts each record's own data in its message must not grow the memo."""
    clock = FakeClock(0.0)
    router = _router(clock)
    for i in range(3 * router_mod.PLAN_MEMO + 5):
        router.plan(_msg(i), ConnectionError(f"order {i} failed"))
        assert len(router._memo) <= router_mod.PLAN_MEMO


_names = st.sampled_from(["traceparent", "tenant", "kw-workflow-id", "kw-attempt",
                          "kw-redrive-of", "kw-schema-id", "kafka_dlt-original-topic", "é"])
_headers = st.lists(st.tuples(_names, st.binary(max_size=40)), max_size=5).map(tuple)


class _Keys:
    """Origins as a worker records them: a topic id when one is known."""

    def __init__(self, topic_id: str | None) -> None:
        self.topic_id = topic_id

    def recorded(self, msg: Message) -> Origin | None:
        o = origin_of(msg)
        return o._replace(topic_id=self.topic_id)


@settings(max_examples=60, deadline=None)
@given(headers=_headers, key=st.none() | st.binary(max_size=30),
       value=st.none() | st.binary(max_size=30), timestamp=st.none() | st.integers(0, 2**41),
       checkpoint=st.none() | st.binary(max_size=60),
       extra=st.lists(st.tuples(st.sampled_from(["kw-schema-id", "other"]),
                                st.binary(max_size=10)), max_size=2),
       topic_id=st.none() | st.just("AAAAAAAAAAAAAAAAAAAAAA"),
       error=st.text(max_size=30), hops=st.integers(1, 3), now=st.floats(1.0, 2e9))
def test_a_hand_offs_size_is_what_the_byte_bound_counts(
        headers: tuple[tuple[str, bytes], ...], key: bytes | None, value: bytes | None,
        timestamp: int | None, checkpoint: bytes | None, extra: list[tuple[str, bytes]],
        topic_id: str | None, error: str, hops: int, now: float) -> None:
    """A retry's headers are sized as they are built (a storm hands off every record; walking
    them again cost a tenth of a failed record's CPU): that size must be ``message_bytes`` of
    what is sent, for a source record and for each hop through the tiers to the DLQ, with user
    headers, a checkpoint, a failure's own headers, a topic id or none, a redrive link."""
    clock = FakeClock(now)
    router = FailureRouter(POLICY, LADDER, "g", no_jitter, clock, _Keys(topic_id))
    msg = Message("orders", 1, 7, key, value, headers, timestamp, 1)
    for _ in range(hops):
        exc = ConnectionError(error)
        if checkpoint is not None:
            keep_checkpoint(exc, checkpoint)
        exc.failure_headers = tuple(extra)  # type: ignore[attr-defined]
        plan = router.plan(msg, exc)
        assert plan.size == message_bytes(plan.key, plan.value, plan.headers)
        if not plan.destination.retried:
            break
        clock.advance(1.5)
        assert isinstance(plan.decision, RetryDecision)
        msg = Message(plan.topic, 0, 3, plan.key, plan.value, plan.headers, timestamp,
                      plan.decision.next_attempt)


def test_canary_a_size_that_forgets_the_checkpoint_is_caught() -> None:
    """The check above catches a size that leaves out a header it sends."""
    clock = FakeClock(1_000.0)
    router = _router(clock)
    exc = ConnectionError("down")
    keep_checkpoint(exc, b"resume-from-42")
    plan = router.plan(_msg(1), exc)
    forgot = plan.size - header_bytes(((CHECKPOINT, b"resume-from-42"),))
    assert plan.size == message_bytes(plan.key, plan.value, plan.headers)
    assert forgot != message_bytes(plan.key, plan.value, plan.headers)
