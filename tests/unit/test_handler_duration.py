"""The handler-duration histogram counts handler calls, failed ones too (#28 item 8): before, it
counted reported batches of successes (3 observations after 60 calls) and no failure at all."""

from __future__ import annotations

import threading
from typing import cast

from kworkers import Worker
from kworkers.consumer.ports import ConsumerPort
from kworkers.message import Message
from tests.unit.test_liveness import StickyConsumer, _records, _wait
from tests.unit.test_loop_with_fake_consumer import RecordingSender, _idle


def _count(w: Worker, group: str) -> float:
    for metric in w.metrics.registry.collect():
        if metric.name == "kworkers_handler_duration_seconds":
            for s in metric.samples:
                if s.name.endswith("_count") and s.labels.get("group") == group:
                    return s.value
    return 0.0


def test_every_call_is_observed_once_failures_included() -> None:
    consumer = StickyConsumer(_records(2, 30))

    def handle(msg: Message) -> None:
        if msg.offset % 6 == 0:
            raise ValueError("fails")  # handed to the retry tier: still a call

    w = Worker(topics=["t"], group_id="g", sender=RecordingSender(),
               consumer=lambda g: cast(ConsumerPort, consumer) if g == "g" else _idle(g))
    w.handler(handle)
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    try:
        _wait(lambda: consumer.commits.get(("t", 0)) == 30 and
              consumer.commits.get(("t", 1)) == 30, "both partitions committed")
        _wait(lambda: _count(w, "g") == 60, "60 calls observed")
    finally:
        w.stop()
        t.join(30)
    assert _count(w, "g") == 60
