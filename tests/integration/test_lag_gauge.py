"""``kworkers_consumer_lag`` after a restart on a caught-up group (issue #46, bug 3).

Worker A handles every record and commits (read back from the broker); worker B starts in the
same group with nothing new to read. Every value B's gauge shows, sampled from its start, must
be 0 (before the fix it showed each partition's log end, the whole log as lag, until a new
record came), every partition must be shown, and once B leaves its series are gone. The
canary is B with the rule before the fix (``test_lag_view.OldRule``), caught showing lag.
"""

from __future__ import annotations

import time

import pytest

from kworkers import Message, Worker
from kworkers.consumer import processor
from kworkers.testing import Broker
from kworkers.testing.workload import committed_total, make_topic, produce, unique
from tests.integration.conftest import running, wait_for
from tests.unit.test_lag_view import OldRule

pytestmark = pytest.mark.integration


def _lag(w: Worker) -> dict[int, float]:
    return {int(s.labels["partition"]): s.value for m in w.metrics.registry.collect()
            for s in m.samples if s.name == "kworkers_consumer_lag"
            and s.labels["group"] == w.config.group_id}


def _every_shown_value_is_0(bs: str, topic: str, group: str) -> list[dict[int, float]]:
    b = Worker(topics=[topic], group_id=group, bootstrap_servers=bs)
    b.handler(lambda msg: None)
    seen: list[dict[int, float]] = []
    with running(b):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # a sync point: until every partition is shown
            seen.append(_lag(b))
            if len(seen[-1]) == 3:
                break
            time.sleep(0.02)
        seen.append(_lag(b))
    assert _lag(b) == {}, "a partition's series stayed after the worker left"
    assert seen[-1].keys() == {0, 1, 2}, seen[-1]
    assert all(v == 0 for s in seen for v in s.values()), \
        f"a caught-up group showed lag: {[s for s in seen if any(s.values())][:1]}"
    return seen


@pytest.mark.parametrize("canary", [False, True], ids=["worker", "canary"])
def test_a_restart_on_a_caught_up_group_shows_lag_0_from_the_first_scrape(
        kafka_broker: Broker, canary: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("lag"), 3), unique("g")
    produce(bs, topic, [(b"k%d" % i, b"v") for i in range(30)])
    a = Worker(topics=[topic], group_id=group, bootstrap_servers=bs)
    seen: list[Message] = []
    a.handler(seen.append)
    with running(a):
        wait_for(lambda: committed_total(bs, group, topic, 3) == 30, 60, "A's commits")
    assert len(seen) == 30
    if not canary:
        _every_shown_value_is_0(bs, topic, group)
        return
    monkeypatch.setattr(processor, "LagView", OldRule)
    with pytest.raises(AssertionError, match="showed lag"):
        _every_shown_value_is_0(bs, topic, group)
