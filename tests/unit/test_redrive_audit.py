"""The redrive audit's entries and how the history reads them back (kworkers.dlq.audit); the
broker test is tests/faults/test_security.py::test_every_redrive_is_audited_..."""

from __future__ import annotations

import pytest

from kworkers.console.dlq_filter import ConsoleFilter
from kworkers.dlq.audit import Actor, describe_filter, end_entry, runs, start_entry
from kworkers.dlq.redrive_plan import RedriveFilter
from kworkers.errors import ConfigError
from kworkers.topic_names import audit_topic, check_dlq

ALICE = Actor("alice", "console")


def test_a_run_is_its_start_and_its_end_newest_first() -> None:
    entries = [
        start_entry("r1", ALICE, "orders.dlq", "key=k1", None, 100.0),
        end_entry("r1", ALICE, 101.5, "redriven=1 skipped_already=0 selected=1"),
        start_entry("r2", Actor("bob@host", "cli"), "orders.dlq", "every dead letter",
                    "orders", 200.0),  # killed: no end
        (b"junk", b"not json"), (None, b'{"schema": "other"}'),
    ]
    got = runs(entries)
    assert [r.run for r in got] == ["r2", "r1"]
    r2, r1 = got
    assert (r1.who, r1.via, r1.started, r1.ended, r1.selection) == (
        "alice", "console", 100.0, 101.5, "key=k1")
    assert r1.outcome == "redriven=1 skipped_already=0 selected=1"
    assert r2.ended is None and r2.outcome.startswith("did not finish")
    assert r2.target == "orders"
    failed = runs([end_entry("r3", ALICE, 5.0, None, "fenced by another redrive")])
    assert failed[0].outcome == "fenced by another redrive" and failed[0].started is None


def test_keys_are_unique_per_run_and_phase() -> None:
    k1, _ = start_entry("r1", ALICE, "d.dlq", "x", None, 1.0)
    k2, _ = end_entry("r1", ALICE, 2.0, "ok")
    assert (k1, k2) == (b"r1/start", b"r1/end")  # compaction keeps both


def test_selections_are_described_in_words() -> None:
    assert describe_filter(RedriveFilter()) == "every dead letter"
    assert describe_filter(RedriveFilter(error_type="Poison", key=b"k7"), "orders") == (
        "error_type=Poison, key=k7, to orders")
    console = ConsoleFilter(records=frozenset({(0, 1), (0, 2)}), upto=((0, 3),))
    assert describe_filter(console) == "2 selected records"


def test_an_actor_needs_a_name_and_the_process_has_one() -> None:
    with pytest.raises(ConfigError):
        Actor(" ", "cli")
    me = Actor.of_process("cli")
    assert "@" in me.who and me.via == "cli"


def test_the_audit_topic_is_not_a_dlq() -> None:
    assert audit_topic("orders.dlq") == "orders.dlq.audit"
    with pytest.raises(ConfigError) as e:
        check_dlq("orders.dlq.audit")
    assert "is a redrive audit, not a DLQ; its DLQ is 'orders.dlq'" in str(e.value)
