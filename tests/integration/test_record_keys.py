"""Records without ids, on a real broker: the README's worker, and one key per record through
the tiers, the DLQ and a redrive (``kworkers.record_key``).

Everything is counted from what is read back: the effects and deliveries tables the handler
appends to, the broker's delivery reports (where each record landed), the DLQ's end offsets,
the group's commits, the topic id as the admin API reports it.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicCollection
from confluent_kafka.admin import AdminClient

from kworkers import Message, NonRetryableError, RetryPolicy, TierLadder, Worker, activity
from kworkers.idempotency.sqlite import SqliteStore
from kworkers.testing import Broker
from kworkers.testing.ledger import Ledger
from kworkers.testing.workload import (
    committed_total,
    end_offsets_total,
    make_topic,
    read_all,
    unique,
)
from tests.integration.conftest import running, wait_for
from tests.integration.test_cli_support import cli

pytestmark = pytest.mark.integration


def _topic_id(bs: str, topic: str) -> str:
    """The topic's id as Kafka's own tools print it (URL-safe base64; librdkafka's text uses
    the standard alphabet)."""
    admin = AdminClient({"bootstrap.servers": bs})
    text = str(admin.describe_topics(TopicCollection([topic]))[topic].result(10).topic_id)
    return text.rstrip("=").replace("+", "-").replace("/", "_")


def _dead_letters(bs: str, dlq: str, partitions: int) -> int:
    """The DLQ's end offsets; 0 while the worker's new DLQ has no leader yet."""
    from confluent_kafka import KafkaException

    try:
        return end_offsets_total(bs, dlq, partitions)
    except KafkaException:
        return 0


def _produce_plain(bs: str, topic: str, values: list[bytes],
                   headers: list[tuple[str, str | bytes | None]] | None = None
                   ) -> dict[bytes, str]:
    """A plain confluent-kafka producer, as a new user writes one: value -> where it landed
    (``topic/partition/offset``, from the broker's delivery reports)."""
    landed: dict[bytes, str] = {}

    def report(err: object, m: object) -> None:
        assert err is None, err
        landed[m.value()] = f"{m.partition()}/{m.offset()}"  # type: ignore[attr-defined]

    p = Producer({"bootstrap.servers": bs})
    for v in values:
        p.produce(topic, value=v, headers=headers, on_delivery=report)
    assert p.flush(30) == 0
    assert len(landed) == len(values)
    return landed


def test_the_readme_worker_handles_plain_records_once_each(kafka_broker: Broker,
                                                           tmp_path: Path) -> None:
    """The README's worker, as written there (its handler asks for the idempotency key), fed
    30 JSON records by a plain producer with no headers: each handled once, under a key
    of its own, none dead-lettered. Before record keys, all 30 went to the DLQ as
    MissingActivityIds."""
    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("orders"), 3)
    ledger = Ledger(tmp_path / "ledger.db")

    worker = Worker(topics=[topic], group_id=unique("order-workers"), bootstrap_servers=bs,
                    retry=RetryPolicy(initial=1.0, backoff=2.0, max_interval=60.0,
                                      max_attempts=5))

    @worker.handler
    def handle(msg: Message) -> None:
        key = activity.idempotency_key()
        ledger.delivered(key, msg)
        ledger.apply(key, msg)

    values = [json.dumps({"order": i, "amount": 10 + i}).encode() for i in range(30)]
    landed = _produce_plain(bs, topic, values)
    with running(worker):
        wait_for(lambda: ledger.counts()[1] >= 30 or
                 _dead_letters(bs, f"{topic}.dlq", 3) > 0, 60, "30 effects")
        wait_for(lambda: committed_total(bs, worker.config.group_id, topic, 3) == 30, 30,
                 "the commits")
    tid = _topic_id(bs, topic)
    assert end_offsets_total(bs, f"{topic}.dlq", 3) == 0  # nothing dead-lettered
    assert ledger.applications() == {f"{topic}@{tid}/{where}": 1 for where in landed.values()}
    assert len({d.key for d in ledger.deliveries()}) == 30 == ledger.counts()[0]


def test_one_key_per_record_through_the_tiers_the_dlq_and_a_redrive(kafka_broker: Broker,
                                                                    tmp_path: Path) -> None:
    """Plain records on a worker with an idempotency store (effects in its transaction):

    - ``retry-*`` fail once, run again from the tier: both attempts see one key;
    - ``dead-*`` fail for good before their effect, are redriven, then succeed: the replay has
      the key the first attempt had;
    - ``done-*`` apply their effect, then fail for good (an error after the commit): the
      redrive's replay has their key, which is done, so it is absorbed: one effect;
    - ``forged`` is a source record whose ``kw-original-*`` headers name ``done-0``'s place:
      it gets a key of its own and its effect happens.
    """
    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("keys"), 2)
    store = SqliteStore(tmp_path / "store.db")
    ledger = Ledger.on_store(store)
    group = unique("g")
    worker = Worker(topics=[topic], group_id=group, bootstrap_servers=bs,
                    idempotency=store, retry=RetryPolicy(initial=0.2, max_attempts=3),
                    tiers=TierLadder((0.25,)))
    failed_once: set[bytes] = set()
    seen: dict[bytes, list[str]] = defaultdict(list)  # the test's own record, per value

    @worker.handler
    def handle(msg: Message) -> None:
        key = activity.idempotency_key()
        value = msg.value or b""
        seen[value].append(key)
        ledger.delivered(key, msg)
        if value.startswith(b"retry") and value not in failed_once:
            failed_once.add(value)
            raise RuntimeError("a transient failure")
        if value.startswith(b"dead") and msg.header("kw-redrive-of") is None:
            raise NonRetryableError("Rejected", "until it is redriven")
        store.apply_once(key, lambda conn: ledger.apply_in(conn, key, msg))
        if value.startswith(b"done") and msg.header("kw-redrive-of") is None:
            raise NonRetryableError("AfterCommit", "failed after its effect committed")

    names = [b"retry-0", b"retry-1", b"dead-0", b"dead-1", b"done-0", b"done-1", b"plain-0"]
    landed = _produce_plain(bs, topic, names)
    done0 = landed[b"done-0"].split("/")
    forged_at = _produce_plain(bs, topic, [b"forged"], headers=[
        ("kw-original-topic", topic.encode()), ("kw-original-partition", done0[0].encode()),
        ("kw-original-offset", done0[1].encode()), ("kw-attempt", b"2")])
    landed.update(forged_at)
    tid = _topic_id(bs, topic)
    key_of = {v: f"{topic}@{tid}/{where}" for v, where in landed.items()}
    dlq = f"{topic}.dlq"
    with running(worker):
        wait_for(lambda: _dead_letters(bs, dlq, 2) >= 4, 60, "4 dead letters")
        wait_for(lambda: len(ledger.applications()) >= 6, 60, "the first effects")
        redrive = cli("dlq", "redrive", "-b", bs, "--dlq", dlq)
        assert redrive.returncode == 0, redrive.stderr
        assert redrive.stdout.strip().endswith("redriven=4 skipped_already=0 selected=4")
        replays = [(v, h) for _k, v, h in read_all(bs, topic, 5) if "kw-redrive-of" in h]
        assert sorted(v or b"" for v, _h in replays) == [b"dead-0", b"dead-1", b"done-0",
                                                         b"done-1"]
        wait_for(lambda: len(ledger.applications()) >= 8, 60, "the redriven effects")
        # the two done-* replays are absorbed by the store: the worker moves past them
        time.sleep(1.0)  # time for a (wrong) second effect to show; never a pass criterion

    assert {v: set(ks) for v, ks in seen.items()} == {v: {key_of[v]} for v in landed}
    calls = Counter({v: len(ks) for v, ks in seen.items()})
    assert calls[b"retry-0"] == calls[b"retry-1"] == 2  # the source, then the tier
    assert calls[b"dead-0"] == calls[b"dead-1"] == 2  # the source, then the replay
    assert calls[b"done-0"] == calls[b"done-1"] == 1  # the replay was absorbed: key done
    assert len(ledger.deliveries()) == sum(calls.values())
    assert ledger.applications() == {key_of[v]: 1 for v in landed}
    assert key_of[b"forged"] != key_of[b"done-0"]


def test_a_topic_created_again_gives_its_records_new_keys(kafka_broker: Broker) -> None:
    """Delete a topic and create it again: its offsets start at 0 again, and only the topic
    id tells its records from the old ones (whose keys a store may hold as done)."""
    from kworkers.kafka.admin import TopicSpec, admin_client, create_topics
    from kworkers.kafka.settings import ClientSettings
    from kworkers.record_key import RecordKeys

    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("again"), 1)
    keys = RecordKeys.for_cluster(ClientSettings(bs))
    old = Message(topic, 0, 0, None, b"old", (), 1_000)
    before = keys.key(old)
    assert before == f"{topic}@{_topic_id(bs, topic)}/0/0"

    admin = admin_client(bs)
    admin.delete_topics([topic])[topic].result(30)

    def created() -> bool:
        try:
            return create_topics(admin, [TopicSpec(topic, 1)]) == [topic]
        except Exception:  # still being deleted
            return False

    wait_for(created, 60, "the topic created again")
    new = Message(topic, 0, 0, None, b"new", (), 2_000)
    after = keys.key(new)
    assert after == f"{topic}@{_topic_id(bs, topic)}/0/0" and after != before


def test_kworkers_produce_writes_plain_records_or_records_with_ids(kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("try"), 1)
    plain = cli("produce", "-b", bs, "-t", topic, "a", "b", "-H", "source=cli")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == [f"{topic}/0@0", f"{topic}/0@1", "produced=2"]
    ids = cli("produce", "-b", bs, "-t", topic, "--workflow-id", "order-{n}", "--activity-id",
              "charge", "c", "d")
    assert ids.returncode == 0, ids.stderr
    assert ids.stdout.splitlines()[-1] == "produced=2"
    got = [(v, h) for _k, v, h in read_all(bs, topic, 5)]
    assert got == [
        (b"a", {"source": b"cli"}), (b"b", {"source": b"cli"}),
        (b"c", {"kw-workflow-id": b"order-0", "kw-activity-id": b"charge"}),
        (b"d", {"kw-workflow-id": b"order-1", "kw-activity-id": b"charge"})]
