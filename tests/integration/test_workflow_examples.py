"""The workflow examples end to end on the real broker, and bad input reaching the DLQ with its
reason. What is checked is read back: the store's tables, and the DLQ through a fresh consumer.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kworkers.dlq.reader import read_dlq
from kworkers.dlq.record import DeadLetter
from kworkers.idempotency import SqliteStore
from kworkers.message import Headers
from kworkers.testing import Broker
from kworkers.testing.workload import produce, unique
from kworkers.workflow.cli import workflow_cli
from kworkers.workflow.codec import ActivityRecord
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration


def read_dead_letters(bootstrap: str, dlq: str) -> list[DeadLetter]:
    contents = read_dlq(bootstrap, dlq)
    assert contents.unreadable == []
    return contents.dead_letters


def test_pipeline_example_indexes_every_document_once(kafka_broker: Broker,
                                                      tmp_path: Path) -> None:
    from examples.pipeline.__main__ import cli
    from examples.pipeline.app import DATA_DIR, search

    name = unique("pipe").replace("-", "_")
    store_url = f"sqlite:///{tmp_path}/pipeline.db"
    r = CliRunner().invoke(cli, ["demo", "--bootstrap", kafka_broker.bootstrap_servers,
                                 "--store", store_url, "--tables", name, "--topic", name,
                                 "--index", f"{name}_index", "--group", name])
    assert r.exit_code == 0, r.output + repr(r.exception)
    docs = sorted(p.name for p in DATA_DIR.glob("*.txt"))
    assert r.output.count(": completed") == len(docs)
    store = SqliteStore(str(tmp_path / "pipeline.db"))
    with store.atomic() as conn:
        rows = conn.execute(f"SELECT doc, COUNT(*) FROM {name}_index GROUP BY doc").fetchall()
    assert dict(rows) == {d: 1 for d in docs}
    assert search(store, "refund the card, release the stock", index=f"{name}_index")[0][0] == \
        "saga.txt"
    assert search(store, "consumer group partitions offsets", index=f"{name}_index")[0][0] == \
        "kafka.txt"


def test_order_saga_example_unwinds_what_it_did(kafka_broker: Broker, tmp_path: Path) -> None:
    from examples.order_saga.__main__ import cli
    from examples.order_saga.app import _shops

    bs = kafka_broker.bootstrap_servers
    name = unique("saga").replace("-", "_")
    r = CliRunner().invoke(cli, ["demo", "--bootstrap", bs, "--store",
                                 f"sqlite:///{tmp_path}/orders.db", "--tables", name, "--shop",
                                 name, "--topic", name, "--group", name])
    assert r.exit_code == 0, r.output + repr(r.exception)
    shop = _shops[name]
    pay = {o: shop.payments_of(f"{name}-{o}") for o in
           ("ships", "declined", "unshippable", "unrefundable")}
    assert pay == {"ships": [("charge", 1299)], "declined": [],
                   "unshippable": [("charge", 1299), ("refund", -1299)],
                   "unrefundable": [("charge", 1299)]}
    assert shop.stock("book") == (9, 1)  # one shipped; both unshippable orders released theirs
    wait_for(lambda: len(read_dead_letters(bs, f"{name}.dlq")) == 1, 60, "the dead letter")
    [dead] = read_dead_letters(bs, f"{name}.dlq")
    assert dead.error_type == "RefundRejected"
    assert dict(dead.headers)["kw-workflow-id"] == f"{name}-unrefundable".encode()
    assert dict(dead.headers)["kw-activity-id"] == b"compensate.charge_card"


def test_bad_records_reach_the_dlq_with_their_reason(kafka_broker: Broker,
                                                    tmp_path: Path) -> None:
    from examples.pipeline.app import make_engine

    bs = kafka_broker.bootstrap_servers
    name = unique("bad").replace("-", "_")
    store: Any = SqliteStore(str(tmp_path / "store.db"))
    engine = make_engine(store, topic=name, tables=name, index=f"{name}_index",
                         relay_idle_s=0.1)
    worker = engine.worker(name, bs, consumer_config={"session.timeout.ms": 6000})
    engine.create_topics(worker, partitions=1)

    def record(rec: ActivityRecord) -> tuple[bytes, bytes, Headers]:
        return rec.encode(None)

    ghost = record(ActivityRecord("ghost", "download", "pipeline", "v"))
    d = engine.registry.latest("pipeline")
    engine.start("pipeline", "nodoc", {"doc": "../../etc/passwd"})
    bad: list[tuple[bytes | None, bytes | None, Headers]] = [
        (b"k", b"no headers", ()),
        (b"wf/download", b"{not json", ghost[2]),
        ghost,
        record(ActivityRecord("nodoc", "download", "pipeline", "other-version")),
    ]
    for key, value, headers in bad:
        produce(bs, name, [(key, value)], headers=list(headers))
    t = threading.Thread(target=engine.run, args=(worker,),
                                       kwargs={"install_signals": False}, daemon=True)
    t.start()
    try:
        wait_for(lambda: len(read_dead_letters(bs, f"{name}.dlq")) >= 5, 90, "five dead letters")
    finally:
        worker.stop()
        t.join(60)
    dead = read_dead_letters(bs, f"{name}.dlq")
    reasons = sorted((x.error_type, x.reason) for x in dead)
    assert reasons == sorted([
        ("NotAnActivity", "non_retryable"), ("DecodeError", "non_retryable"),
        ("UnknownWorkflow", "non_retryable"), ("RunMismatch", "non_retryable"),
        ("NoSuchDocument", "non_retryable")])
    by_type = {x.error_type: x for x in dead}
    assert "no workflow run 'ghost'" in by_type["UnknownWorkflow"].error_message
    assert "not JSON" in by_type["DecodeError"].error_message
    assert dict(by_type["NoSuchDocument"].headers)["kw-workflow-id"] == b"nodoc"
    run = engine.tables.run("nodoc")
    assert run is not None and run.status == "failed"
    assert run.state.error is not None and "NoSuchDocument" in run.state.error
    args = ["show", "nodoc", "--json", "--store", f"sqlite:///{tmp_path}/store.db",
            "--tables", name]
    shown = json.loads(CliRunner().invoke(workflow_cli, args).output)
    assert shown["history"][0]["status"] == "failed" and d.version == shown["version"]
