"""`kworkers dlq list|show|redrive` on dead letters a real Worker wrote, on a real broker.

The redrive claims under test: a filter selects exactly its subset; a second run replays
nothing; a crash in the middle of a transaction followed by a rerun leaves exactly one replay
of each dead letter, as seen by read_committed readers and by a Worker.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from kworkers import Message, TierLadder, Worker
from kworkers.dlq.reader import read_dlq
from kworkers.dlq.redrive import CRASH_EXIT_CODE
from kworkers.kafka.admin import admin_client, existing_topics
from kworkers.testing import Broker
from kworkers.testing.workload import make_topic, read_all, unique
from kworkers.topic_names import ledger_topic
from tests.integration.conftest import running, wait_for
from tests.integration.test_cli_support import DeadLetters, cli, make_dead_letters, one_error_line

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dead(kafka_broker: Broker) -> Iterator[DeadLetters]:
    """4 dead letters (records 0, 6: Malformed; 3, 9: Expired; 3 is a task envelope), shared
    by the read-only tests."""
    yield make_dead_letters(kafka_broker.bootstrap_servers)


def _replays(bs: str, topic: str) -> Counter[str]:
    """kw-redrive-of of every replay a read_committed reader sees on ``topic``."""
    return Counter(h["kw-redrive-of"].decode() for _k, _v, h in read_all(bs, topic, 5)
                   if "kw-redrive-of" in h)


def _summary(stdout: str) -> dict[str, int]:
    last = stdout.strip().splitlines()[-1]
    return {k: int(v) for k, v in (f.split("=") for f in last.split()[:3])}


def test_list_table_and_json(kafka_broker: Broker, dead: DeadLetters) -> None:
    bs = kafka_broker.bootstrap_servers
    p = cli("dlq", "list", "-b", bs, "--dlq", dead.dlq)
    assert p.returncode == 0, p.stderr
    assert "4 dead letters" in p.stdout
    for col in ("original topic/partition@offset", "key", "attempts", "error type",
                "last failure", "age"):
        assert col in p.stdout
    for i in dead.poison:
        assert f"k{i}" in p.stdout
    assert p.stdout.count("Malformed") == 2 and p.stdout.count("Expired") == 2

    j = cli("dlq", "list", "-b", bs, "--dlq", dead.dlq, "--json")
    assert j.returncode == 0, j.stderr
    rows = [json.loads(line) for line in j.stdout.splitlines()]
    assert sorted(r["key"] for r in rows) == sorted(f"k{i}" for i in dead.poison)
    assert {r["original_topic"] for r in rows} == {dead.topic}
    assert {r["attempts"] for r in rows} == {1}
    assert {r["reason"] for r in rows} == {"non_retryable"}
    assert all(r["error_type"] == dead.poison[int(r["key"][1:])] for r in rows)
    # the library call the CLI stands on
    assert len(read_dlq(bs, dead.dlq).dead_letters) == 4


def test_show_one_record_in_full(kafka_broker: Broker, dead: DeadLetters) -> None:
    bs = kafka_broker.bootstrap_servers
    rows = [json.loads(line) for line in cli("dlq", "list", "-b", bs, "--dlq", dead.dlq,
                                              "--json").stdout.splitlines()]
    by_key = {r["key"]: r for r in rows}
    env = by_key[f"k{dead.envelope}"]
    p = cli("dlq", "show", "-b", bs, "--dlq", dead.dlq, "--partition",
            str(env["dlq_partition"]), "--offset", str(env["dlq_offset"]))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"original: {dead.topic}/{env['original_partition']}@{env['original_offset']}" in out
    assert "error: Expired: record 3 cannot be handled" in out
    assert "kw-error-type: Expired" in out
    assert f"kafka_dlt-original-offset: {env['original_offset']} (binary int64)" in out
    assert "key: k3" in out
    assert "value: task envelope" in out and "idempotency_key: wf-3/act-3" in out
    assert "payload: amount=3" in out

    plain = by_key["k0"]
    p = cli("dlq", "show", "-b", bs, "--dlq", dead.dlq, "-p", str(plain["dlq_partition"]),
            "-o", str(plain["dlq_offset"]))
    assert p.returncode == 0, p.stderr
    assert "value (text, 2 bytes): v0" in p.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["dlq", "list", "--dlq", "no-such.dlq"], "topic 'no-such.dlq' does not exist"),
    (["dlq", "show", "--dlq", "no-such.dlq", "-p", "0", "-o", "0"], "does not exist"),
    (["dlq", "redrive", "--dlq", "no-such.dlq"], "DLQ topic 'no-such.dlq' does not exist"),
])
def test_unknown_dlq(kafka_broker: Broker, args: list[str], needle: str) -> None:
    p = cli(*args, "-b", kafka_broker.bootstrap_servers)
    assert p.returncode == 2
    assert needle in one_error_line(p)


def test_what_is_not_a_dlq_is_refused(kafka_broker: Broker, dead: DeadLetters) -> None:
    """A retry tier, a source topic and a ledger are not DLQs: `dlq list` and `dlq redrive`
    (dry run or not) exit 2 with one line naming the DLQ to use, and no topic appears (a
    redrive of a tier used to exit 0 and leave `<tier>.redriven` behind)."""
    bs = kafka_broker.bootstrap_servers
    tier = f"{dead.topic}.retry.250ms"
    before = existing_topics(admin_client(bs))
    assert {tier, dead.topic, dead.dlq} <= set(before)
    cases = [
        (["dlq", "redrive", "--dlq", tier], f"'{tier}' is a retry tier of '{dead.topic}', "
                                            f"not a DLQ; its DLQ is '{dead.dlq}'"),
        (["dlq", "redrive", "--dlq", tier, "--dry-run"], "is a retry tier"),
        (["dlq", "redrive", "--dlq", dead.topic, "--dry-run"],
         f"'{dead.topic}' is not a DLQ (a DLQ is named <source>.dlq); the DLQ of "
         f"'{dead.topic}' is '{dead.dlq}'"),
        (["dlq", "redrive", "--dlq", dead.topic], "is not a DLQ"),
        (["dlq", "list", "--dlq", dead.topic], "is not a DLQ"),
        (["dlq", "list", "--dlq", tier, "--json"], "is a retry tier"),
        (["dlq", "redrive", "--dlq", ledger_topic(dead.dlq)], "is a redrive ledger, not a DLQ"),
    ]
    for args, needle in cases:
        p = cli(*args, "-b", bs)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert needle in one_error_line(p), args
        assert p.stdout == "", args
    assert existing_topics(admin_client(bs)) == before  # no ledger, nothing created


def test_show_bad_coordinates(kafka_broker: Broker, dead: DeadLetters) -> None:
    bs = kafka_broker.bootstrap_servers
    p = cli("dlq", "show", "-b", bs, "--dlq", dead.dlq, "-p", "0", "-o", "999")
    assert p.returncode == 2
    assert f"no record at {dead.dlq}/0@999" in one_error_line(p)
    p = cli("dlq", "show", "-b", bs, "--dlq", dead.dlq, "-p", "7", "-o", "0")
    assert p.returncode == 2
    assert "has partitions 0..2, not 7" in one_error_line(p)
    p = cli("dlq", "redrive", "-b", bs, "--dlq", dead.dlq, "--to", "no-such-target")
    assert p.returncode == 2
    assert "target topic 'no-such-target' does not exist" in one_error_line(p)


def _here(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``kworkers ARGS`` in this process (for checks of output only: a subprocess costs two
    seconds); its stdout, asserting exit status 0."""
    from kworkers.cli import run_cli

    capsys.readouterr()
    code = run_cli(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_redrive_filtered_subset_then_the_rest_each_once(kafka_broker: Broker,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    bs = kafka_broker.bootstrap_servers
    d = make_dead_letters(bs)
    dry = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq, "--error-type", "Malformed",
              "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would_redrive=2" in dry.stdout
    # the dry run lists each replay: the dead letter, its key and error, where it goes
    rows = {(x.key or b"").decode(): {"dlq_partition": x.dlq_partition,
                                      "dlq_offset": x.dlq_offset,
                                      "original_partition": x.original_partition}
            for x in read_dlq(bs, d.dlq).dead_letters}
    # the dry run's lines here, the JSON rows of ``dlq list`` below
    listed: list[Any] = [
        line for line in dry.stdout.splitlines() if line.startswith("would replay ")
        and " key=" in line]
    assert sorted(listed) == sorted(
        f"would replay {d.dlq}/{rows[k]['dlq_partition']}@{rows[k]['dlq_offset']} key={k} "
        f"error=Malformed -> {d.topic}/{rows[k]['original_partition']}" for k in ("k0", "k6"))
    assert _summary(dry.stdout) == {"redriven": 0, "skipped_already": 0, "selected": 2}
    assert ledger_topic(d.dlq) not in existing_topics(admin_client(bs))  # changed nothing
    assert _replays(bs, d.topic) == Counter()

    first = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq, "--error-type", "Malformed")
    assert first.returncode == 0, first.stderr
    assert _summary(first.stdout) == {"redriven": 2, "skipped_already": 0, "selected": 2}
    replays = read_all(bs, d.topic, 5)
    mine = [(k, v, h) for k, v, h in replays if "kw-redrive-of" in h]
    assert sorted(k or b"" for k, _v, _h in mine) == [b"k0", b"k6"]  # the original keys
    assert sorted(v or b"" for _k, v, _h in mine) == [b"v0", b"v6"]  # and values
    for _k, _v, h in mine:
        assert h["kw-attempt"] == b"1"  # a fresh retry budget
        assert h["kw-redrive-of"].decode().startswith(f"{d.dlq}/")
        assert "kw-error-type" not in h and "kafka_dlt-original-topic" not in h

    again = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq, "--error-type", "Malformed")
    assert _summary(again.stdout) == {"redriven": 0, "skipped_already": 2, "selected": 2}

    # list and show say which were redriven, and where to; --pending, filters and --limit
    listed = [json.loads(line) for line in _here(capsys, "dlq", "list", "-b", bs, "--dlq",
                                                 d.dlq, "--json").splitlines()]
    assert {r["key"]: r["redriven_to"] for r in listed} == {
        "k0": f"{d.topic}/{rows['k0']['original_partition']}",
        "k6": f"{d.topic}/{rows['k6']['original_partition']}", "k3": None, "k9": None}
    assert all(r["redriven_at"] for r in listed if r["key"] in ("k0", "k6"))
    some = _here(capsys, "dlq", "list", "-b", bs, "--dlq", d.dlq, "--pending", "--limit", "1")
    assert "2 dead letters match (of 4), 0 redriven; 1 shown (--limit 1)" in some
    assert ("k3" in some) != ("k9" in some) and "k0" not in some and "k6" not in some
    assert any("redriven" in line and "error type" in line for line in some.splitlines())
    k0 = rows["k0"]
    shown = _here(capsys, "dlq", "show", "-b", bs, "--dlq", d.dlq, "-p",
                  str(k0["dlq_partition"]), "-o", str(k0["dlq_offset"]))
    assert f" to {d.topic}/{k0['original_partition']}" in next(
        line for line in shown.splitlines() if line.startswith("  redriven: "))

    rest = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq, "--rate", "50/s")
    assert rest.returncode == 0, rest.stderr
    assert _summary(rest.stdout) == {"redriven": 2, "skipped_already": 2, "selected": 4}
    counts = _replays(bs, d.topic)
    assert len(counts) == 4 and set(counts.values()) == {1}


def test_redrive_to_another_topic_by_key(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    d = make_dead_letters(bs)
    audit = make_topic(bs, unique("audit"), 1)
    p = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq, "--to", audit, "--key", "k9")
    assert p.returncode == 0, p.stderr
    assert _summary(p.stdout) == {"redriven": 1, "skipped_already": 0, "selected": 1}
    assert f"replayed 1 to {audit}" in p.stdout
    got = read_all(bs, audit, 5)
    assert [(k, v) for k, v, _h in got] == [(b"k9", b"v9")]


def test_redrive_crash_mid_transaction_then_rerun_is_exactly_once(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    d = make_dead_letters(bs, n=20, error_type=lambda i: "Boom" if i % 2 == 0 else None)
    assert len(d.poison) == 10
    # batches of 3: the first commits, the crash comes 2 replays into the second batch,
    # after they were flushed to the log inside the open transaction
    crashed = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq, "--batch-size", "3",
                  "--crash-after", "5")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    # the first batch is committed; the second is still an open transaction: invisible
    assert sorted(_replays(bs, d.topic).values()) == [1, 1, 1]

    rerun = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq, "--batch-size", "3")
    assert rerun.returncode == 0, rerun.stderr
    assert _summary(rerun.stdout) == {"redriven": 7, "skipped_already": 3, "selected": 10}
    counts = _replays(bs, d.topic)
    assert len(counts) == 10 and set(counts.values()) == {1}

    # the env variable form, on a DLQ whose redrive is complete: nothing left to crash on
    done = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq,
               env={"KWORKERS_REDRIVE_CRASH_AFTER": "1"})
    assert done.returncode == 0, done.stderr
    assert _summary(done.stdout) == {"redriven": 0, "skipped_already": 10, "selected": 10}

    # and a Worker (read_committed, as every kworkers worker) handles each replay once
    handled: Counter[str] = Counter()
    lock = threading.Lock()
    w = Worker(topics=[d.topic], group_id=unique("after"), bootstrap_servers=bs,
               tiers=TierLadder((0.25,)))

    @w.handler
    def handle(msg: Message) -> None:
        of = msg.header_str("kw-redrive-of")
        if of is not None:
            with lock:
                handled[of] += 1

    with running(w):
        wait_for(lambda: len(handled) >= 10, 60, "10 replays handled")
    assert len(handled) == 10 and set(handled.values()) == {1}


def test_redrive_crash_via_env(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    d = make_dead_letters(bs, n=8, error_type=lambda i: "Boom" if i < 4 else None)
    crashed = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq,
                  env={"KWORKERS_REDRIVE_CRASH_AFTER": "2"})
    assert crashed.returncode == CRASH_EXIT_CODE
    rerun = cli("dlq", "redrive", "-b", bs, "--dlq", d.dlq)
    assert _summary(rerun.stdout) == {"redriven": 4, "skipped_already": 0, "selected": 4}
    counts = _replays(bs, d.topic)
    assert len(counts) == 4 and set(counts.values()) == {1}
