"""How the DLQ commands show records, and which dead letters a redrive would replay."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest

from kworkers.dlq import DeadLetter, RedriveFilter
from kworkers.dlq.format import age_text, as_json, bytes_text, header_text, iso, show_lines
from kworkers.dlq.redrive import RedriveSummary
from kworkers.dlq.redrive_plan import ledger_key, plan
from kworkers.envelope import ActivityTask, SingleObjectCodec
from kworkers.errors import ConfigError
from kworkers.message import Message
from kworkers.topic_names import ledger_topic

DEAD = DeadLetter(
    dlq_topic="orders.dlq", dlq_partition=1, dlq_offset=7, original_topic="orders",
    original_partition=2, original_offset=40, key=b"cust-1", value=b"{}", attempts=3,
    error_type="Timeout", error_message="slow", first_failure_at=1_700_000_000.0,
    last_failure_at=1_700_000_010.5, dead_lettered_at=1_700_000_011.0, reason="exhausted",
    group="billing", headers=(("kw-attempt", b"3"),),
)


def test_bytes_text() -> None:
    assert bytes_text(None) == "(null)"
    assert bytes_text(b"hello") == "hello"
    assert bytes_text(b"\x00\xff") == "0x00ff"
    assert bytes_text(b"\x1b[31m") == "0x1b5b33316d"  # control characters never reach a tty
    assert bytes_text(b"abcdefghij", 5) == "abcd…"


def test_spring_binary_headers_are_decoded() -> None:
    assert header_text("kafka_dlt-original-partition", struct.pack(">i", 5)) == (
        "5 (binary int32)")
    assert header_text("kafka_dlt-original-offset", struct.pack(">q", 2**40)) == (
        f"{2**40} (binary int64)")
    assert header_text("kafka_dlt-original-offset", b"12") == "12"  # not 8 bytes: as is
    assert header_text("kw-attempt", b"3") == "3"


def test_times() -> None:
    assert iso(0) == "1970-01-01T00:00:00.000Z"
    assert iso(None) == "-"
    assert [age_text(s) for s in (0, 59, 60, 192, 3600, 7500, 86400 * 3 + 3600 * 4)] == [
        "0s", "59s", "1m00s", "3m12s", "1h00m", "2h05m", "3d04h"]
    assert age_text(-5) == "0s"


def test_json_row() -> None:
    row = as_json(DEAD, now=1_700_000_071.0)
    assert row["key"] == "cust-1" and row["attempts"] == 3 and row["age_seconds"] == 60.0
    assert row["last_failure_at"] == "2023-11-14T22:13:30.500Z"
    # issue #46: a null key is JSON null, not the table's "(null)"; an empty one is ""
    nulls = json.loads(json.dumps(as_json(dataclasses.replace(DEAD, key=None), now=0)))
    assert nulls["key"] is None
    assert as_json(dataclasses.replace(DEAD, key=b""), now=0)["key"] == ""


def test_show_decodes_an_envelope_value() -> None:
    task = ActivityTask("wf-1", "act-2", "charge", b"\x01\x02", headers={"tenant": "t1"})
    msg = Message("orders.dlq", 1, 7, b"cust-1", SingleObjectCodec().encode(task),
                  DEAD.headers)
    lines = show_lines(msg, dataclasses.replace(DEAD, value=msg.value), None, 1_700_000_071.0)
    text = "\n".join(lines)
    assert "record orders.dlq/1@7" in text
    assert "original: orders/2@40" in text
    assert "error: Timeout: slow" in text
    assert "value: task envelope" in text
    assert "idempotency_key: wf-1/act-2" in text
    assert "payload: 0x0102" in text
    assert "header tenant: t1" in text


def test_show_text_hex_and_not_a_dead_letter() -> None:
    text = "\n".join(show_lines(Message("x.dlq", 0, 1, None, b"plain"), None, "no headers", 0))
    assert "not a kworkers dead letter: no headers" in text
    assert "key: (null)" in text and "value (text, 5 bytes): plain" in text
    assert "headers:\n  (none)" in text
    binary = "\n".join(show_lines(Message("x.dlq", 0, 1, b"k", b"\xc3\x01\x00"), None, "x", 0))
    assert "value (hex, 3 bytes): 0xc30100" in binary  # envelope magic, not an envelope


def _dead(offset: int, **kw: object) -> DeadLetter:
    return dataclasses.replace(DEAD, dlq_offset=offset, **kw)  # type: ignore[arg-type]


def test_redrive_plan_skips_the_ledger_and_keeps_the_original_partition() -> None:
    contents = [_dead(1), _dead(2, error_type="BadSpec"), _dead(3),
                _dead(4, original_partition=9)]
    done = {ledger_key(_dead(3))}
    p = plan("orders.dlq", contents, RedriveFilter(error_type="Timeout"), done, None,
             {"orders": 6, "orders.dlq": 6})
    assert [d.dlq_offset for d in p.selected] == [1, 3, 4]
    assert [(r.dead.dlq_offset, r.topic, r.partition) for r in p.todo] == [
        (1, "orders", 2),
        (4, "orders", None),  # the topic has fewer partitions now: by key instead
    ]
    assert p.skipped_already == 1 and p.refused == []
    to_other = plan("orders.dlq", contents, RedriveFilter(), set(), "audit", {"audit": 1})
    assert {(r.topic, r.partition) for r in to_other.todo} == {("audit", None)}


def test_redrive_plan_refuses_a_missing_target() -> None:
    with pytest.raises(ConfigError, match="target topic 'orders' does not exist"):
        plan("orders.dlq", [DEAD], RedriveFilter(), set(), None, {})


def test_names_and_summary_line() -> None:
    assert ledger_topic("orders.dlq") == "orders.dlq.redriven"
    assert ledger_key(DEAD) == "orders.dlq/1/7"
    s = RedriveSummary("orders.dlq", selected=5, redriven=3, skipped_already=2, pending=0,
                       dry_run=False)
    assert s.line() == "redriven=3 skipped_already=2 selected=5"
    dry = RedriveSummary("orders.dlq", 5, 0, 2, 3, True)
    assert dry.line().startswith("redriven=0 skipped_already=2 selected=5 would_redrive=3")
