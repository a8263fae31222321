"""Failure headers: round trips, two tier hops, Spring aliases, garbage and truncation."""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kworkers.errors import DecodeError, failure_type, is_non_retryable
from kworkers.message import Headers, Message
from kworkers.retry_tiers.headers import (
    MAX_HEADER_VALUE,
    FailureInfo,
    HeaderError,
    attempt_of,
    check_due,
    dead_letter_headers,
    due_at_of,
    failure_of,
    redrive_headers,
    retry_headers,
)
from kworkers.retry_tiers.policy import RetryPolicy, no_jitter
from kworkers.retry_tiers.routing import DeadLetterDecision, RetryDecision, route
from kworkers.retry_tiers.tiers import Tier, TierLadder

POLICY = RetryPolicy(initial=1.0, backoff=2.0, max_interval=10.0, max_attempts=3)
LADDER = TierLadder()
TRACE = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
USER: Headers = (("traceparent", TRACE), ("tenant", b"acme"), ("tenant", b"acme-2"))


def _names(h: Headers) -> list[str]:
    return [k for k, _ in h]


def _one(h: Headers, name: str) -> bytes:
    values = [v for k, v in h if k == name]
    assert len(values) == 1, (name, values)
    return values[0]


def source() -> Message:
    return Message(
        topic="orders",
        partition=3,
        offset=42,
        key=b"k1",
        value=b"v1",
        headers=USER,
        timestamp_ms=1_700_000_000_123,
    )


def _retry(msg: Message, now: float) -> tuple[RetryDecision, Headers]:
    d = route(POLICY, LADDER, "orders", msg.attempt, RuntimeError("db down"), now, no_jitter)
    assert isinstance(d, RetryDecision)
    return d, retry_headers(msg, "billing", d, now)


def test_retry_headers_round_trip() -> None:
    decision, h = _retry(source(), 1000.0)
    assert h[: len(USER)] == USER  # user headers first, in order, untouched
    assert _one(h, "kw-attempt") == b"2"
    assert _one(h, "kw-due-at") == b"1001000"
    assert _one(h, "kw-original-topic") == b"orders"
    assert _one(h, "kw-original-partition") == b"3"
    assert _one(h, "kw-original-offset") == b"42"
    assert _one(h, "kw-original-timestamp") == b"1700000000123"
    assert _one(h, "kw-group") == b"billing"
    assert _one(h, "kw-first-failure-at") == b"1000000"
    assert _one(h, "kw-error-type") == b"RuntimeError"
    assert attempt_of(h) == 2
    assert due_at_of(h) == 1001.0 == decision.due_at
    assert failure_of(h) == FailureInfo(
        original_topic="orders",
        original_partition=3,
        original_offset=42,
        original_timestamp_ms=1_700_000_000_123,
        group="billing",
        attempt=2,
        first_failure_at=1000.0,
        last_failure_at=1000.0,
        error_type="RuntimeError",
        error_message="db down",
        due_at=1001.0,
    )


def test_originals_survive_two_tier_hops_and_the_dlq() -> None:
    _, h1 = _retry(source(), 1000.0)
    hop1 = Message(
        topic="orders.retry.1s",
        partition=0,
        offset=7,
        key=b"k1",
        value=b"v1",
        headers=h1,
        timestamp_ms=1_700_000_001_000,
        attempt=attempt_of(h1),
    )
    _, h2 = _retry(hop1, 1001.5)
    hop2 = Message(
        topic="orders.retry.1s",
        partition=1,
        offset=9,
        key=b"k1",
        value=b"v1",
        headers=h2,
        timestamp_ms=1_700_000_002_000,
        attempt=attempt_of(h2),
    )
    info = failure_of(h2)
    assert info is not None
    assert (info.original_topic, info.original_partition, info.original_offset) == ("orders", 3, 42)
    assert info.original_timestamp_ms == 1_700_000_000_123
    assert (info.attempt, info.first_failure_at, info.last_failure_at) == (3, 1000.0, 1001.5)
    assert info.due_at == 1003.5

    dead = route(POLICY, LADDER, "orders", hop2.attempt, RuntimeError("still"), 1004.0, no_jitter)
    assert isinstance(dead, DeadLetterDecision)
    h3 = dead_letter_headers(hop2, "billing", dead, 1004.0)
    final = failure_of(h3)
    assert final is not None
    assert (final.original_topic, final.original_partition, final.original_offset) == (
        "orders",
        3,
        42,
    )
    assert (final.attempt, final.first_failure_at, final.last_failure_at) == (3, 1000.0, 1004.0)
    assert final.due_at is None
    assert final.error_message == "still"
    # Each of our headers once; user headers once each and first.
    assert h3[: len(USER)] == USER
    kw = [n for n in _names(h3) if n.startswith(("kw-", "kafka_dlt-"))]
    assert len(kw) == len(set(kw))
    assert _one(h3, "kw-dlq-reason") == b"exhausted"
    assert _one(h3, "kw-dead-lettered-at") == b"1004000"


def test_spring_aliases_decode_like_spring() -> None:
    d = DeadLetterDecision(
        attempts=1, reason="non_retryable", error_type="BadSpec", error_message="no field 'x'"
    )
    h = dead_letter_headers(source(), "billing", d, 50.0)
    assert _one(h, "kafka_dlt-original-topic").decode() == "orders"
    assert struct.unpack(">i", _one(h, "kafka_dlt-original-partition")) == (3,)
    assert struct.unpack(">q", _one(h, "kafka_dlt-original-offset")) == (42,)
    assert struct.unpack(">q", _one(h, "kafka_dlt-original-timestamp")) == (1_700_000_000_123,)
    assert _one(h, "kafka_dlt-original-consumer-group") == b"billing"
    assert _one(h, "kafka_dlt-exception-fqcn") == b"BadSpec"
    assert _one(h, "kafka_dlt-exception-message") == b"no field 'x'"
    assert _one(h, "kw-dlq-reason") == b"non_retryable"
    assert _one(h, "kw-attempt") == b"1"


def test_spring_timestamp_without_a_timestamp_is_minus_one() -> None:
    msg = Message(topic="t", partition=2**31 - 1, offset=2**62, key=None, value=None)
    d = DeadLetterDecision(attempts=1, reason="exhausted", error_type="E", error_message="")
    h = dead_letter_headers(msg, "g", d, 1.0)
    assert struct.unpack(">q", _one(h, "kafka_dlt-original-timestamp")) == (-1,)
    assert struct.unpack(">i", _one(h, "kafka_dlt-original-partition")) == (2**31 - 1,)
    assert struct.unpack(">q", _one(h, "kafka_dlt-original-offset")) == (2**62,)
    assert "kw-original-timestamp" not in _names(h)
    info = failure_of(h)
    assert info is not None and info.original_timestamp_ms is None


def test_stale_foreign_failure_headers_are_replaced_not_duplicated() -> None:
    stale: Headers = (
        ("kafka_dlt-original-topic", b"elsewhere"),
        ("kw-error-type", b"Old"),
        ("x", b"1"),
    )
    msg = Message(topic="orders", partition=0, offset=1, key=None, value=None, headers=stale)
    d = DeadLetterDecision(attempts=1, reason="exhausted", error_type="New", error_message="m")
    h = dead_letter_headers(msg, "g", d, 1.0)
    assert h[0] == ("x", b"1")
    assert _one(h, "kafka_dlt-original-topic") == b"orders"
    assert _one(h, "kw-error-type") == b"New"


def test_garbage_failure_headers_do_not_block_the_dlq() -> None:
    # A record whose kw headers are garbage is dead-lettered (HeaderError is non-retryable);
    # building its DLQ headers must not fail again, or the partition would be stuck.
    bad: Headers = (("kw-original-topic", b"orders"), ("kw-original-partition", b"zz"))
    msg = Message(topic="orders.retry.5s", partition=4, offset=8, key=None, value=None, headers=bad)
    d = DeadLetterDecision(
        attempts=1, reason="non_retryable", error_type="HeaderError", error_message="bad"
    )
    info = failure_of(dead_letter_headers(msg, "g", d, 2.0))
    assert info is not None
    assert (info.original_topic, info.original_partition, info.original_offset) == (
        "orders.retry.5s",
        4,
        8,
    )


@pytest.mark.parametrize("raw", [b"abc", b"-1", b"", b"\xff", b"0", b"1.5", b" 2", b"+2", b"1_0"])
def test_garbage_attempt_is_a_clear_header_error(raw: bytes) -> None:
    with pytest.raises(HeaderError) as info:
        attempt_of((("kw-attempt", raw),))
    text = str(info.value)
    assert "kw-attempt" in text
    assert repr(raw.decode("utf-8", "strict") if raw != b"\xff" else raw) in text
    assert isinstance(info.value, DecodeError)
    assert is_non_retryable(info.value)
    assert failure_type(info.value) == "HeaderError"


def test_header_error_truncates_the_value_it_shows() -> None:
    with pytest.raises(HeaderError) as info:
        attempt_of((("kw-attempt", b"z" * 10_000),))
    assert "z" * 64 in str(info.value)
    assert "z" * 65 not in str(info.value)
    assert len(str(info.value)) < 300


def test_attempt_absent_is_one_and_last_header_wins() -> None:
    assert attempt_of(()) == 1
    assert attempt_of((("other", b"9"),)) == 1
    assert attempt_of((("kw-attempt", b"2"), ("kw-attempt", b"3"))) == 3


def test_due_at_parsing() -> None:
    assert due_at_of(()) is None
    assert due_at_of((("kw-due-at", b"1500"),)) == 1.5
    for bad in (b"soon", b"", b"1e3", b"\xfe", b"-2000", b"253402300800000",
                b"9223372036854775808"):
        with pytest.raises(HeaderError, match="kw-due-at"):
            due_at_of((("kw-due-at", bad),))


def test_due_at_is_written_rounded_up_never_early() -> None:
    d = RetryDecision(
        next_attempt=2,
        delay=0.0004,
        due_at=10.0004,
        tier=Tier("1s", 1.0, "t.retry.1s"),
        error_type="E",
        error_message="",
    )
    h = retry_headers(Message(topic="t", partition=0, offset=0, key=None, value=None), "g", d, 10.0)
    due = due_at_of(h)
    assert due is not None and due >= 10.0004 and due == 10.001
    # ... but float noise does not push an exact millisecond up by one.
    d2 = RetryDecision(
        next_attempt=2, delay=0.3, due_at=0.1 * 3, tier=d.tier, error_type="E", error_message=""
    )
    h2 = retry_headers(Message(topic="t", partition=0, offset=0, key=None, value=None), "g", d2, 0)
    assert due_at_of(h2) == 0.3


def test_check_due() -> None:
    assert check_due(50.0, 100.0, 3600.0) == 50.0  # past: due now
    assert check_due(3700.0, 100.0, 3600.0) == 3700.0  # exactly at the limit
    with pytest.raises(HeaderError, match="kw-due-at"):
        check_due(100.0 + 3600.0 + 0.001, 100.0, 3600.0)
    with pytest.raises(HeaderError, match="kw-due-at"):
        check_due(1e12, 100.0, 86_400.0)


def test_failure_of_absent_and_garbage() -> None:
    assert failure_of(USER) is None
    _, good = _retry(source(), 1.0)
    for name, bad in [
        ("kw-original-partition", b"x"),
        ("kw-original-offset", b"-3"),
        ("kw-first-failure-at", b"yesterday"),
        ("kw-original-timestamp", b"t"),
        ("kw-attempt", b"0"),
        ("kw-error-type", b"\xff\xfe"),
    ]:
        broken = tuple((k, bad if k == name else v) for k, v in good)
        with pytest.raises(HeaderError, match=name):
            failure_of(broken)
    for name in (
        "kw-original-partition",
        "kw-original-offset",
        "kw-group",
        "kw-error-type",
        "kw-first-failure-at",
        "kw-last-failure-at",
    ):
        missing = tuple((k, v) for k, v in good if k != name)
        with pytest.raises(HeaderError, match=name):
            failure_of(missing)


def test_huge_values_are_truncated_to_valid_utf8() -> None:
    d = RetryDecision(
        next_attempt=2,
        delay=1.0,
        due_at=2.0,
        tier=Tier("1s", 1.0, "t.retry.1s"),
        error_type="E" * 9000,
        error_message="é" * 9000,
    )
    h = retry_headers(source(), "g" * 9000, d, 1.0)
    for name in ("kw-error-type", "kw-error-message", "kw-group"):
        v = _one(h, name)
        assert 0 < len(v) <= MAX_HEADER_VALUE == 4096
        v.decode("utf-8")  # never cut inside a character
    dl = DeadLetterDecision(
        attempts=1, reason="exhausted", error_type="T", error_message="€" * 5000
    )
    h2 = dead_letter_headers(source(), "g", dl, 1.0)
    for name in ("kw-error-message", "kafka_dlt-exception-message"):
        assert len(_one(h2, name)) <= MAX_HEADER_VALUE
        _one(h2, name).decode("utf-8")


def test_redrive_headers_restart_at_attempt_one() -> None:
    dl = DeadLetterDecision(attempts=3, reason="exhausted", error_type="E", error_message="m")
    dead = Message(
        topic="orders.dlq",
        partition=1,
        offset=99,
        key=b"k1",
        value=b"v1",
        headers=dead_letter_headers(source(), "billing", dl, 9.0),
    )
    h = redrive_headers(dead)
    assert h == (*USER, ("kw-attempt", b"1"), ("kw-redrive-of", b"orders.dlq/1/99"))
    assert attempt_of(h) == 1
    assert failure_of(h) is None
    assert _one(h, "traceparent") == TRACE


def test_redrive_of_a_redriven_record_names_only_the_latest_dead_letter() -> None:
    first = Message(
        topic="o.dlq",
        partition=0,
        offset=1,
        key=None,
        value=None,
        headers=(("kw-redrive-of", b"o.dlq/0/0"), ("a", b"b")),
    )
    assert redrive_headers(first) == (
        ("a", b"b"),
        ("kw-attempt", b"1"),
        ("kw-redrive-of", b"o.dlq/0/1"),
    )


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.binary(max_size=22),
    st.integers(min_value=-(2**64), max_value=2**64).map(lambda n: b"%d" % n),
    st.sampled_from([b"999999999999999999", b"1000000000000000000", b"9223372036854775807",
                     b"9223372036854775808", b"-9223372036854775808", b"0" * 19, b"0" * 20,
                     "٣".encode(), b"\xb2", b"00012"]),
))
def test_an_integer_header_parses_exactly_as_the_strict_rule_says(raw: bytes) -> None:
    """The fast path (ASCII digits, at most 18 of them) and the strict one must agree: a
    decimal integer of at most 19 digits with an optional minus, in the int64 range, at least
    the minimum; everything else is a HeaderError naming the header."""
    strict = re.fullmatch(rb"-?[0-9]{1,19}", raw) is not None
    n = int(raw) if strict else None
    in_range = n is not None and -(2**63) <= n <= 2**63 - 1
    try:
        got = attempt_of((("kw-attempt", raw),))
    except HeaderError as exc:
        assert "kw-attempt" in str(exc)
        assert not (in_range and n is not None and n >= 1)
    else:
        assert in_range and got == n and got >= 1
    try:
        due = due_at_of((("kw-due-at", raw),))
    except HeaderError as exc:
        assert "kw-due-at" in str(exc)
        assert not (in_range and n is not None and 0 <= n <= 253_402_300_799_999)
    else:
        assert in_range and n is not None and due == n / 1000
