"""Record headers are data from outside: they never choose where a record is written.

The router derives every destination from the topic a record was read from, through the
worker's ladder; a tier record's kw-* headers are checked (``check_tier_record``) against the
worker's configuration, each header corrupted in turn, each bound crossed.
"""

from __future__ import annotations

import pytest

from kworkers.clock import FakeClock
from kworkers.errors import ConfigError, NonRetryableError, failure_type
from kworkers.message import Headers, Message
from kworkers.retry_tiers.headers import (
    MAX_HEADER_VALUE,
    HeaderError,
    failure_of,
    last_value,
)
from kworkers.retry_tiers.policy import RetryPolicy, no_jitter
from kworkers.retry_tiers.router import FailureRouter, HandOff
from kworkers.retry_tiers.tier_record import (
    MAX_CLOCK_SKEW_S,
    CorruptTierRecord,
    TierRules,
    check_tier_record,
)
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.topic_names import dlq_source
from tests.tier_records import retry_record, retry_record_headers

NOW = 1_750_000_000.0
POLICY = RetryPolicy(initial=1.0, max_interval=10.0, max_attempts=4)
LADDER = TierLadder((1.0, 5.0))
RULES = TierRules.of(POLICY, LADDER, "billing")
TIER = "orders.retry.1s"


def _router() -> FailureRouter:
    return FailureRouter(POLICY, LADDER, "billing", no_jitter, FakeClock(NOW))


def _through_gate(msg: Message, exc: BaseException) -> HandOff:
    """A tier record's way to the router in a worker: read through the tier gate, which checks
    it once; a refused one goes on as the gate's verdict, an admitted one fails with ``exc``."""
    from kworkers.consumer.partition import PartitionState, Poisoned
    from kworkers.consumer.tier_gate import TierGate

    gate = TierGate(10, RULES, _Sink(), FakeClock(NOW))
    ps = PartitionState(msg.topic, msg.partition)
    ps.tracker.track(msg.offset)
    item = gate.admit(ps, msg, NOW)
    if isinstance(item, Poisoned):
        return _router().plan(item.msg, item.exc)
    assert item is not None, "the record waits in the heap"
    return _router().plan(item, exc)


def _forged(origin: bytes, group: bytes = b"billing") -> Headers:
    """A complete, well-formed set of kw-* headers naming ``origin``: what an attacker with
    write access to one topic would put on a record."""
    good = retry_record_headers("victim.retry.1s", group.decode(), NOW + 1, now=NOW)
    return tuple((k, origin if k == "kw-original-topic" else v) for k, v in good)


def _with(h: Headers, name: str, value: bytes | None) -> Headers:
    out = tuple((k, v) for k, v in h if k != name)
    return out if value is None else (*out, (name, value))


# --- destinations come from the consumed topic ----------------------------------------------


@pytest.mark.parametrize("origin", [b"victim", b"bad topic!", b"orders.retry.5s",
                                    b"victim.dlq", b"x" * 300, b"\xff"])
@pytest.mark.parametrize("exc", [RuntimeError("down"), NonRetryableError("Bad", "bad")])
def test_a_source_records_forged_headers_never_choose_its_destination(
        origin: bytes, exc: Exception) -> None:
    msg = Message("orders", 2, 40, b"k", b"v", (("u", b"1"), *_forged(origin)), 123)
    plan = _router().plan(msg, exc)
    assert plan.topic in ("orders.retry.1s", "orders.dlq")
    info = failure_of(plan.headers)
    assert info is not None
    # the origin written is the record itself, not what its headers claimed
    assert (info.original_topic, info.original_partition, info.original_offset) == (
        "orders", 2, 40)
    assert info.group == "billing" and info.first_failure_at == NOW
    assert plan.headers[0] == ("u", b"1")  # user headers kept, forged kw-* replaced
    assert [k for k, _ in plan.headers].count("kw-original-topic") == 1


def test_a_well_formed_tier_record_keeps_its_origin_and_goes_to_its_own_ladder() -> None:
    msg = retry_record(TIER, 0, 7, "billing", NOW - 1, now=NOW - 2)._replace(attempt=2)
    plan = _router().plan(msg, RuntimeError("again"))
    assert plan.topic == "orders.retry.1s"
    info = failure_of(plan.headers)
    assert info is not None and (info.original_topic, info.attempt) == ("orders", 3)
    assert info.first_failure_at == NOW - 2  # carried over from the first failure


@pytest.mark.parametrize("origin", [b"victim", b"bad topic!", b"orders.retry.1s", b""])
def test_a_tier_record_naming_another_origin_goes_to_its_own_dlq_with_the_reason(
        origin: bytes) -> None:
    msg = Message(TIER, 1, 9, b"k", b"v", _forged(origin), None, 2)
    plan = _through_gate(msg, RuntimeError("handler failed"))
    assert (plan.destination.label, plan.topic) == ("dlq", "orders.dlq")
    info = failure_of(plan.headers)
    assert info is not None
    assert info.error_type == "HeaderError" and "kw-original-topic" in info.error_message
    # the dead letter describes the record as read: a tier of this DLQ's own source
    assert (info.original_topic, info.original_partition, info.original_offset) == (TIER, 1, 9)


def test_a_topic_off_the_ladder_is_a_config_error_and_dead_letter_still_places_it() -> None:
    r = _router()
    stray = Message("orders.retry.2s", 0, 0, None, None, _forged(b"orders"), None, 2)
    with pytest.raises(ConfigError, match="ladder"):
        r.plan(stray, RuntimeError())
    assert r.dead_letter(stray, RuntimeError()).topic == "orders.dlq"


def test_ladder_source_of() -> None:
    assert LADDER.source_of("orders") == "orders"
    assert LADDER.source_of("orders.retry.5s") == "orders"
    for bad in ("orders.dlq", "orders.retry.2s", "orders.dlq.retry.1s", "a.retry.1s.retry.1s",
                "bad topic!", ""):
        with pytest.raises(ConfigError):
            LADDER.source_of(bad)


def test_dlq_source_is_strict() -> None:
    assert dlq_source("orders.dlq") == "orders"
    assert dlq_source("my.orders.v2.dlq") == "my.orders.v2"
    for name in ("orders", "orders.retry.5s.dlq", "orders.dlq.dlq", "bad topic!.dlq", ".dlq"):
        assert dlq_source(name) is None, name


# --- each kw-* header corrupted in turn -------------------------------------------------------


def _good() -> Message:
    return retry_record(TIER, 0, 3, "billing", NOW + 0.5, attempt=3, now=NOW - 5)


def test_a_good_tier_record_passes() -> None:
    info = check_tier_record(_good(), RULES, NOW)
    assert info is not None and info.attempt == 3 and info.due_at == NOW + 0.5


CORRUPT: list[tuple[str, bytes | None, str]] = [
    ("kw-attempt", b"abc", "decimal integer"),
    ("kw-attempt", b"0", ">= 1"),
    ("kw-attempt", b"1", "attempt 2 to 4"),
    ("kw-attempt", b"5", "attempt 2 to 4"),
    ("kw-attempt", b"9223372036854775807", "attempt 2 to 4"),
    ("kw-attempt", b"9223372036854775808", "64-bit"),
    ("kw-attempt", None, "missing"),
    ("kw-original-topic", None, "missing"),
    ("kw-original-topic", b"victim", "another topic"),
    ("kw-original-topic", b"\xff", "UTF-8"),
    ("kw-original-partition", b"-1", ">= 0"),
    ("kw-original-partition", None, "missing"),
    ("kw-original-offset", b"x", "decimal"),
    ("kw-original-offset", b"99999999999999999999", "decimal"),
    ("kw-original-timestamp", b"-5", ">= 0"),
    ("kw-original-timestamp", str(int((NOW + 2 * MAX_CLOCK_SKEW_S) * 1000)).encode(), "ahead"),
    ("kw-group", None, "missing"),
    ("kw-group", b"\xfe", "UTF-8"),
    ("kw-group", b"b" * (MAX_HEADER_VALUE + 1), "longer than"),
    ("kw-first-failure-at", b"-1", ">= 0"),
    ("kw-first-failure-at", b"0", "in the past"),
    ("kw-first-failure-at", str(int((NOW + 2 * MAX_CLOCK_SKEW_S) * 1000)).encode(), "ahead"),
    ("kw-first-failure-at", b"9223372036854775807", "<="),
    ("kw-last-failure-at", None, "missing"),
    ("kw-last-failure-at", b"253402300800000", "<="),
    ("kw-error-type", None, "missing"),
    ("kw-error-message", b"m" * (MAX_HEADER_VALUE + 1), "longer than"),
    ("kw-due-at", None, "missing"),
    ("kw-due-at", b"soon", "decimal"),
    ("kw-due-at", b"-1", ">= 0"),
    ("kw-due-at", str(int((NOW + RULES.max_ahead + 1) * 1000)).encode(), "allowed"),
    ("kw-due-at", b"1000", "in the past"),
]


@pytest.mark.parametrize(("name", "value", "why"), CORRUPT)
def test_each_corrupt_header_is_a_clear_reason_never_a_crash(name: str, value: bytes | None,
                                                               why: str) -> None:
    msg = _good()._replace(headers=_with(_good().headers, name, value))
    with pytest.raises(HeaderError) as err:
        check_tier_record(msg, RULES, NOW)
    assert name in str(err.value) and why in str(err.value), str(err.value)
    assert len(str(err.value)) < 400
    # the router places it in its own DLQ with that reason, whatever the handler said
    plan = _through_gate(msg, RuntimeError("handler"))
    assert plan.topic == "orders.dlq"
    info = failure_of(plan.headers)
    assert info is not None and name in info.error_message
    assert info.original_topic == TIER
    attempts = last_value(plan.headers, "kw-attempt")
    assert attempts is not None and 1 <= int(attempts) <= RULES.max_attempts


def test_another_groups_retry_is_not_ours_even_when_corrupt() -> None:
    theirs = retry_record(TIER, 0, 3, "shipping", NOW, now=NOW)
    assert check_tier_record(theirs, RULES, NOW) is None
    broken = theirs._replace(headers=_with(theirs.headers, "kw-attempt", b"zz"))
    assert check_tier_record(broken, RULES, NOW) is None  # that group judges it
    unnamed = theirs._replace(headers=_with(theirs.headers, "kw-group", None))
    with pytest.raises(HeaderError, match="kw-group"):
        check_tier_record(unnamed, RULES, NOW)


def test_a_source_topic_is_not_a_tier_record() -> None:
    with pytest.raises(HeaderError, match="not a retry tier"):
        check_tier_record(_good()._replace(topic="orders"), RULES, NOW)


def test_rules_follow_the_policy_and_the_ladder() -> None:
    assert RULES.max_attempts == 4
    assert RULES.max_ahead == 10.0 + 60.0  # max_interval beyond the largest tier, plus slack
    wide = TierRules.of(RetryPolicy(max_interval=1.0), TierLadder((30.0,)), "g")
    assert wide.max_ahead == 90.0


def test_repeated_headers_last_wins_for_checks_too() -> None:
    good = _good()
    doubled = good._replace(headers=(("kw-original-topic", b"victim"), *good.headers))
    assert check_tier_record(doubled, RULES, NOW) is not None
    assert last_value(doubled.headers, "kw-original-topic") == b"orders"
    reversed_ = good._replace(headers=(*good.headers, ("kw-original-topic", b"victim")))
    with pytest.raises(HeaderError):
        check_tier_record(reversed_, RULES, NOW)


# --- the tier gate: run, wait, dead-letter or skip ------------------------------------------


class _Sink:
    def observe(self, amount: float) -> None:
        pass


def test_the_gate_skips_another_groups_retry_and_poisons_a_forged_one() -> None:
    from kworkers.consumer.partition import PartitionState, Poisoned
    from kworkers.consumer.tier_gate import TierGate

    gate = TierGate(10, RULES, _Sink(), FakeClock(NOW))
    ps = PartitionState(TIER, 0)
    records = [
        retry_record(TIER, 0, 0, "billing", NOW + 0.5, now=NOW),  # ours, not yet due
        retry_record(TIER, 0, 1, "shipping", NOW - 1, now=NOW),  # theirs: skipped
        Message(TIER, 0, 2, b"k", b"v", _forged(b"victim"), None),  # forged origin
        retry_record(TIER, 0, 3, "billing", NOW - 1, now=NOW),  # ours, due
    ]
    ps.tracker.track_many([m.offset for m in records])
    out = [gate.admit(ps, m, NOW) for m in records]
    assert out[0] is None and len(gate) == 1
    assert out[1] is None  # completed, never run
    assert isinstance(out[2], Poisoned) and "kw-original-topic" in str(out[2].exc)
    assert isinstance(out[3], Message) and out[3].attempt == 2
    ps.tracker.complete_many([2, 3])
    assert ps.tracker.position is None  # offset 0 still waits in the heap
    ps.tracker.complete(0)
    assert ps.tracker.position == 4  # ...and the skipped offset 1 never held the commit


def test_the_gate_never_raises_out_of_admit() -> None:
    from kworkers.consumer.partition import PartitionState, Poisoned
    from kworkers.consumer.tier_gate import TierGate

    gate = TierGate(10, RULES, _Sink(), FakeClock(NOW))
    stray = Message("elsewhere.retry.7s", 0, 0, None, None, (), None)
    item = gate.admit(PartitionState(stray.topic, 0), stray, NOW)
    assert isinstance(item, Poisoned) and isinstance(item.exc, CorruptTierRecord)
    assert isinstance(item.exc.__cause__, ConfigError)
    assert failure_type(item.exc) == "ConfigError"  # the dead letter names what failed
