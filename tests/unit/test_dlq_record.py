"""DeadLetter.from_message: a DLQ record read back into a typed value."""

from __future__ import annotations

import pytest

from kworkers.dlq import DeadLetter
from kworkers.message import Headers, Message
from kworkers.retry_tiers.headers import HeaderError, dead_letter_headers
from kworkers.retry_tiers.routing import DeadLetterDecision

USER: Headers = (("traceparent", b"00-aa-bb-01"),)


def dead_message(**over: object) -> Message:
    src = Message(
        topic="orders",
        partition=2,
        offset=40,
        key=b"k",
        value=b"v",
        headers=USER,
        timestamp_ms=5_000,
    )
    d = DeadLetterDecision(
        attempts=4, reason="exhausted", error_type="Timeout", error_message="upstream slow"
    )
    headers = dead_letter_headers(src, "billing", d, 1_000.25)
    fields: dict[str, object] = {
        "topic": "orders.dlq",
        "partition": 0,
        "offset": 17,
        "key": b"k",
        "value": b"v",
        "headers": headers,
    }
    fields.update(over)
    return Message(**fields)  # type: ignore[arg-type]


def test_from_message() -> None:
    msg = dead_message()
    dl = DeadLetter.from_message(msg)
    assert dl == DeadLetter(
        dlq_topic="orders.dlq",
        dlq_partition=0,
        dlq_offset=17,
        original_topic="orders",
        original_partition=2,
        original_offset=40,
        key=b"k",
        value=b"v",
        attempts=4,
        error_type="Timeout",
        error_message="upstream slow",
        first_failure_at=1000.25,
        last_failure_at=1000.25,
        dead_lettered_at=1000.25,
        reason="exhausted",
        group="billing",
        headers=msg.headers,
    )
    assert dl.age(1010.25) == 10.0
    assert dl.age(0.0) == 0.0  # clock skew never shows a negative age


def test_from_message_without_failure_headers() -> None:
    with pytest.raises(HeaderError, match="kw-original-topic"):
        DeadLetter.from_message(dead_message(headers=USER))


@pytest.mark.parametrize("name", ["kw-dead-lettered-at", "kw-dlq-reason"])
def test_from_message_missing_dlq_headers(name: str) -> None:
    headers = tuple((k, v) for k, v in dead_message().headers if k != name)
    with pytest.raises(HeaderError, match=name):
        DeadLetter.from_message(dead_message(headers=headers))


def test_from_message_garbage_dead_lettered_at() -> None:
    headers = tuple(
        (k, b"later" if k == "kw-dead-lettered-at" else v) for k, v in dead_message().headers
    )
    with pytest.raises(HeaderError, match="later"):
        DeadLetter.from_message(dead_message(headers=headers))


def test_the_redriven_mark_in_list_show_json_and_the_dry_run() -> None:
    """What `dlq list`, `dlq show` and a dry run print about redrives, from ledger markers."""
    from kworkers.dlq.format import as_json, list_table, redriven_text, replay_line, show_lines
    from kworkers.dlq.ledger import parse_marker
    from kworkers.dlq.redrive_plan import Replay

    dead = DeadLetter.from_message(dead_message())
    marker = parse_marker(Message("orders.dlq.redriven", 0, 3, b"orders.dlq/0/17",
                                  b'{"target": "orders", "partition": 2, "at_ms": 2000}'))
    assert redriven_text(None) == "no"
    assert redriven_text(marker) == "1970-01-01T00:00:02.000Z to orders/2"
    marks = {"orders.dlq/0/17": marker}
    assert (as_json(dead, 0)["redriven_at"], as_json(dead, 0)["redriven_to"]) == (None, None)
    assert (as_json(dead, 0, marker)["redriven_at"], as_json(dead, 0, marker)["redriven_to"]
            ) == ("1970-01-01T00:00:02.000Z", "orders/2")
    assert "  redriven: 1970-01-01T00:00:02.000Z to orders/2" in show_lines(
        dead_message(), dead, None, 0, None, marks)
    assert "  redriven: no" in show_lines(dead_message(), dead, None, 0, None, {})
    assert not any("redriven" in line for line in show_lines(dead_message(), dead, None, 0))
    assert [c.header for c in list_table([dead], 0, None, marks).columns][-1] == "redriven"
    assert replay_line(Replay(dead, "orders", 2), True) == (
        "would replay orders.dlq/0@17 key=k error=Timeout -> orders/2")
    assert replay_line(Replay(dead, "audit", None), False) == (
        "replayed orders.dlq/0@17 key=k error=Timeout -> audit")
