"""Share mode's pure rules: deadlines under the lock, the last delivery, chunking, settings."""

from __future__ import annotations

import dataclasses

import pytest

from kworkers import ConfigError, Message, WorkerConfig, is_non_retryable
from kworkers.clock import FakeClock
from kworkers.kafka.settings import ClientSettings, share_consumer_settings
from kworkers.kafka.share_consumer import offset_reset_of
from kworkers.settings import from_env
from kworkers.share.backlog import BacklogReporter, estimate
from kworkers.share.gate import LockGate
from kworkers.share.ports import GroupSettings
from kworkers.share.rules import CHUNK_S, MAX_CHUNK, DeliveryLimitReached, ShareRules

GROUP = GroupSettings(lock_s=30.0, delivery_limit=5, offset_reset="latest", renew_enabled=True)


def test_without_a_deadline_share_mode_uses_half_the_lock() -> None:
    r = ShareRules.of(GROUP, None)
    assert (r.lock_s, r.deadline_s, r.margin_s, r.delivery_limit) == (30.0, 15.0, 3.0, 5)
    assert r.latest_start(100.0) == 100.0 + 30 - 15 - 3
    assert r.latest_finish(100.0) == 100.0 + 30 - 3


@pytest.mark.parametrize("timeout", [26.8, 27.0, 40.0])
def test_a_deadline_that_overruns_the_lock_is_refused(timeout: float) -> None:
    with pytest.raises(ConfigError, match=r"message_timeout: .* acquisition lock \(30s"):
        ShareRules.of(GROUP, timeout)


def test_a_deadline_just_under_the_lock_is_taken() -> None:
    assert ShareRules.of(GROUP, 26.7).deadline_s == 26.7


def test_a_delivery_limit_below_two_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"share\.delivery\.count\.limit"):
        ShareRules.of(GroupSettings(30.0, 1, "latest", False), None)


@pytest.mark.parametrize(("limit", "first_dlq"), [(2, 2), (3, 2), (5, 4), (10, 9)])
def test_the_last_two_deliveries_are_kept_for_the_dead_letter(limit: int, first_dlq: int) -> None:
    r = ShareRules.of(dataclasses.replace(GROUP, delivery_limit=limit), None)
    assert r.dead_letter_from == first_dlq
    assert [n for n in range(1, limit + 2) if r.is_last_delivery(n)] == list(
        range(first_dlq, limit + 2))


def test_a_dead_letter_at_the_limit_is_non_retryable_and_says_why() -> None:
    err = ShareRules.of(GROUP, None).last_delivery(4)
    assert isinstance(err, DeliveryLimitReached) and is_non_retryable(err)
    assert err.type == "DeliveryLimitReached" and "4 of the share group's limit 5" in str(err)


@pytest.mark.parametrize(("mean", "backlog", "idle", "want"), [
    (None, 100, 4, 1),           # unknown handler time: one record at a time
    (0.1, 100, 4, 2),            # 0.2 s of work per chunk
    (0.0001, 100, 4, 25),        # fast handlers: an even share of the backlog
    (0.0, 10_000, 1, MAX_CHUNK),
    (5.0, 100, 4, 1),
    (0.1, 100, 0, 0),
    (0.1, 0, 4, 0),
])
def test_chunks_hold_about_chunk_s_of_work_and_share_the_backlog(
        mean: float | None, backlog: int, idle: int, want: int) -> None:
    assert ShareRules.chunk(mean, backlog, idle) == want
    if want and mean:
        assert want == 1 or want * mean <= CHUNK_S + 1e-9


def test_the_gate_runs_records_in_time_and_marks_late_ones() -> None:
    clock = FakeClock(1000.0)
    held = {("t", 0, 1): 1000.0, ("t", 0, 2): 1000.0}
    calls: list[int] = []
    gate = LockGate(lambda h, m: h(m), ShareRules.of(GROUP, None), clock, held, False)
    gate(lambda m: calls.append(m.offset), Message("t", 0, 1, None, b""))
    clock.advance(12.0 + 0.001)  # past 30 - 15 - 3
    gate(lambda m: calls.append(m.offset), Message("t", 0, 2, None, b""))
    assert calls == [1] and gate.late == {("t", 0, 2)}


def test_backlog_is_the_log_end_past_what_this_worker_acquired() -> None:
    positions = {("t", 0): 10, ("t", 1): 7}
    assert estimate(positions, {("t", 0): 25, ("t", 1): 7, ("t", 2): 99}) == {
        ("t", 0): 15, ("t", 1): 0}
    assert estimate({("t", 0): 30}, {("t", 0): 25}) == {("t", 0): 0}


def test_the_reporter_sets_one_gauge_per_partition() -> None:
    from kworkers.metrics import Metrics

    m = Metrics()

    class Ends:
        def high_watermarks(self, tps: object) -> dict[tuple[str, int], int]:
            return {("t", 0): 50, ("t", 1): 9}

    r = BacklogReporter(Ends(), {("t", 0): 20, ("t", 1): 9}, m.share_backlog, "g")
    assert r.report_once() == {("t", 0): 30, ("t", 1): 0}
    assert m.share_backlog.labels("g", "t", "0")._value.get() == 30


def test_where_a_share_group_starts_follows_auto_offset_reset() -> None:
    assert offset_reset_of({}) == "earliest"
    assert offset_reset_of({"auto.offset.reset": "latest"}) == "latest"
    with pytest.raises(ConfigError, match=r"auto\.offset\.reset must be earliest or latest"):
        offset_reset_of({"auto.offset.reset": "none"})


def test_share_consumer_settings_own_the_acknowledgement_mode() -> None:
    client = ClientSettings.of("b:9092", {"sasl.username": "u", "sasl.password": "p"})
    conf = share_consumer_settings(client, "g", {"auto.offset.reset": "latest",
                                                 "fetch.max.bytes": 1000})
    assert conf["share.acknowledgement.mode"] == "explicit" and conf["group.id"] == "g"
    assert "auto.offset.reset" not in conf and conf["fetch.max.bytes"] == 1000
    assert conf["security.protocol"] == "SASL_PLAINTEXT"  # the shared security travels too
    with pytest.raises(ConfigError, match=r"share\.acknowledgement\.mode"):
        share_consumer_settings(client, "g", {"share.acknowledgement.mode": "implicit"})


def test_mode_is_a_setting_and_share_mode_keeps_no_order() -> None:
    assert WorkerConfig(topics=("t",), group_id="g", mode="share").mode == "share"
    with pytest.raises(ConfigError, match="mode: 'partition' or 'share'"):
        WorkerConfig(topics=("t",), group_id="g", mode="queue")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="share mode has no order"):
        WorkerConfig(topics=("t",), group_id="g", mode="share", ordering="key")
    with pytest.raises(ConfigError, match="'inline' is not supported"):
        WorkerConfig(topics=("t",), group_id="g", mode="share", execution="inline")
    assert from_env({"KWORKERS_MODE": "share"}) == {"mode": "share"}
