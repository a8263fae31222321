"""An exactly-once handler producing to a topic that does not exist yet (issue #46, bug 2).

Before the fix the worker repeated "uncertain transaction did not commit" every ~11 s without
naming the topic, with /healthz and /readyz at 200. On the real broker (the session's, which
does not create topics on use): /readyz names the topic and the broker's reason while it is
missing, the gauge says it, nothing is committed (the group's offset read back), nothing is
visible in the topic; once an operator creates it, every output is there once
(read_committed) and the offsets are committed.
"""

from __future__ import annotations

import pytest

from kworkers import Message, Worker, activity
from kworkers.testing import Broker
from kworkers.testing.workload import committed_total, make_topic, produce, read_all, unique
from tests.integration.conftest import start, wait_for

pytestmark = pytest.mark.integration


def test_an_output_topic_that_does_not_exist_holds_the_records_and_names_it(
        kafka_broker: Broker) -> None:
    bs = kafka_broker.bootstrap_servers
    src, out, group = make_topic(bs, unique("eos-src"), 1), unique("invoices"), unique("g")
    w = Worker(topics=[src], group_id=group, bootstrap_servers=bs, guarantee="exactly_once")

    @w.handler
    def handle(msg: Message) -> None:
        activity.produce(out, msg.value, key=msg.key)

    values = [b"v%d" % i for i in range(3)]
    produce(bs, src, [(b"k%d" % i, v) for i, v in enumerate(values)])
    thread, errors = start(w)
    try:
        wait_for(lambda: out in (w.unready_reason or "") or errors, 60, "the topic named")
        reason = w.unready_reason
        gauge = w.metrics.registry.get_sample_value("kworkers_output_topic_missing",
                                                    {"group": group, "topic": out})
        committed_before = committed_total(bs, group, src, 1)
        healthy = w.fault is None
        make_topic(bs, out, 1)
        wait_for(lambda: committed_total(bs, group, src, 1) == 3 or errors, 60, "the commit")
    finally:
        w.stop()
        thread.join(60)
    assert not errors and not thread.is_alive()
    assert reason is not None and "Unknown topic or partition" in reason, reason
    assert gauge == 1 and healthy
    assert committed_before == 0  # nothing committed past the waiting records
    assert sorted(v or b"" for _k, v, _h in read_all(bs, out)) == values  # each once, after
    assert w.metrics.registry.get_sample_value("kworkers_output_topic_missing",
                                               {"group": group, "topic": out}) == 0
