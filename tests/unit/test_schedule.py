"""Scheduled records, the pure parts: the ladder's choice, the rung record rules, the headers,
and the dedupe and cancel decisions over a real (SQLite) store, all on an injected clock."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import cast

import pytest

from kworkers.errors import ConfigError
from kworkers.idempotency.sqlite import SqliteStore
from kworkers.message import Message
from kworkers.retry_tiers.headers import DUE_AT, HeaderError
from kworkers.schedule import ScheduleLadder, ScheduleRules, ScheduleState, Verdict, due_time
from kworkers.schedule.headers import (
    DELIVERED_AT,
    SCHEDULED_DUE_AT,
    SCHEDULED_ID,
    delivered_headers,
    rung_headers,
    scheduled_of,
)

NOW = 1_800_000_000.0
L = ScheduleLadder((60.0, 3600.0, 86_400.0), horizon=86_400.0, max_ahead=30 * 86_400.0)


def test_topics_last_rung_first() -> None:
    assert L.topics("orders") == ("orders.scheduled.due", "orders.scheduled.1m",
                                  "orders.scheduled.1h", "orders.scheduled.24h")
    assert L.rung_of("orders.scheduled.1h", "orders") == 2
    assert L.rung_of("orders", "orders") is None


@pytest.mark.parametrize(("left", "rung", "release_left"), [
    (0.0, 0, 0.0), (-5.0, 0, -5.0), (30.0, 0, 30.0), (60.0, 0, 60.0),
    (61.0, 1, 1.0), (3600.0, 1, 3540.0), (7200.0, 2, 3600.0),
    (86_401.0, 3, 1.0), (10 * 86_400.0, 3, 86_400.0),  # the top rung: at most its horizon
])
def test_plan_picks_the_rung_of_the_time_left(left: float, rung: int,
                                               release_left: float) -> None:
    hop = L.plan(NOW + left, NOW)
    # the approx stands in for the float in the comparison
    assert (hop.rung, hop.release_at - NOW) == (rung, cast(float, pytest.approx(release_left)))
    assert hop.release_at <= NOW + left  # never released after its due time
    assert hop.release_at - NOW <= L.window(hop.rung) + 1e-9  # a heap slot for one window


def test_a_record_climbs_down_and_is_due_at_its_time() -> None:
    due, now, hops = NOW + 3 * 86_400.0 + 17, NOW, []
    while True:
        hop = L.plan(due, now)
        hops.append(hop.rung)
        if hop.final:
            assert hop.release_at == due
            break
        assert hop.release_at > now  # progress: never a loop in place
        now = hop.release_at
    assert hops == [3, 3, 3, 2, 1, 0]  # three day-long top-rung waits, then down the ladder


@pytest.mark.parametrize("bad", [(), (60.0, 60.0), (-1.0,), (0.0001,), ("x",)])
def test_bad_ladders_are_refused(bad: tuple[float, ...]) -> None:
    with pytest.raises(ConfigError):
        ScheduleLadder(bad)


def test_due_time() -> None:
    assert due_time(NOW, None, 5) == NOW + 5
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert due_time(NOW, at, None) == at.timestamp()
    for args in [(None, None), (at, 5.0), (dt.datetime(2030, 1, 1), None), (None, -1.0)]:
        with pytest.raises(ValueError):
            due_time(NOW, *args)


def _rung(topic: str, due: float, release: float, at: float = NOW, sid: str = "r-1") -> Message:
    return Message(topic, 0, 7, b"k", b"v", rung_headers((("a", b"1"),), sid, due, at, release))


RULES = ScheduleRules.of(L, ["orders"])


def test_rules_admit_a_good_record_for_its_rung_release() -> None:
    adm = RULES.check(_rung("orders.scheduled.1h", NOW + 7200, NOW + 3600), NOW)
    assert (adm.destination, adm.rung, adm.due_at, adm.info.id) == ("orders", 2, NOW + 3600,
                                                                    "r-1")


@pytest.mark.parametrize(("msg", "header"), [
    (_rung("orders.scheduled.due", NOW + 40 * 86_400, NOW), SCHEDULED_DUE_AT),  # too far
    (_rung("orders.scheduled.due", NOW + 10, NOW + 20), DUE_AT),  # released after due
    (_rung("orders.scheduled.1m", NOW + 86_400, NOW + 80_000), DUE_AT),  # beyond its window
    (_rung("orders.scheduled.due", NOW + 10, NOW + 10, at=NOW + 7200), "kw-scheduled-at"),
    (_rung("other.scheduled.due", NOW + 10, NOW + 10), "kw-original-topic"),  # no rung of ours
    (Message("orders.scheduled.due", 0, 1, None, b"v", ((SCHEDULED_ID, b"x"),)),
     SCHEDULED_DUE_AT),
    (Message("orders.scheduled.due", 0, 1, None, b"v", ()), SCHEDULED_ID),
])
def test_rules_refuse_forged_or_corrupt_records_naming_the_header(msg: Message,
                                                                  header: str) -> None:
    with pytest.raises(HeaderError) as e:
        RULES.check(msg, NOW)
    assert e.value.header == header


def test_headers_keep_the_records_own_and_replace_ours() -> None:
    hs = rung_headers((("a", b"1"), (DUE_AT, b"5"), (SCHEDULED_ID, b"forged")), "id-9",
                      NOW + 1.0001, NOW, NOW + 1)
    info = scheduled_of(hs)
    assert info.id == "id-9" and info.due_at >= NOW + 1.0001  # rounded up: never early
    out = dict(delivered_headers(hs, info, NOW + 2))
    assert out["a"] == b"1" and out[SCHEDULED_ID] == b"id-9" and DUE_AT not in out
    assert int(out[DELIVERED_AT]) == round((NOW + 2) * 1000)


def test_one_delivery_per_id_and_cancel_before_it(tmp_path: Path) -> None:
    st = ScheduleState(SqliteStore(tmp_path / "s.db"))
    assert st.claim_delivery("a", "orders.scheduled.due/0@5", NOW) is Verdict.DELIVER
    # the same record read again after a crash delivers again (its first try was aborted)
    assert st.claim_delivery("a", "orders.scheduled.due/0@5", NOW + 1) is Verdict.DELIVER
    assert st.claim_delivery("a", "orders.scheduled.due/1@9", NOW) is Verdict.DUPLICATE
    assert st.cancel("a", NOW) is False  # too late: delivered
    assert st.cancel("b", NOW) is True
    assert st.cancel("b", NOW + 1) is True  # idempotent
    assert st.claim_delivery("b", "orders.scheduled.due/0@6", NOW) is Verdict.CANCELLED


def test_cli_cancel_and_bad_input_in_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from kworkers.cli import run_cli

    store = f"sqlite:///{tmp_path / 'ids.db'}"
    ScheduleState(SqliteStore(tmp_path / "ids.db")).claim_delivery("late", "t/0@1", NOW)
    assert run_cli(["schedule", "cancel", "--store", store, "id-1"]) == 0
    assert run_cli(["schedule", "cancel", "--store", store, "id-1"]) == 0  # idempotent
    assert run_cli(["schedule", "cancel", "--store", store, "late"]) == 1  # being delivered
    for bad in (["--after", "5", "--at", "2030-01-01T00:00:00+00:00"],
                ["--at", "2030-01-01T00:00:00"], ["--after", "1", "-H", "kw-scheduled-id=x"]):
        capsys.readouterr()
        assert run_cli(["schedule", "add", "--store", store, "-t", "orders", *bad, "v"]) != 0
        err = capsys.readouterr().err.strip()
        assert err.startswith("kworkers: error:") and "\n" not in err, err


def test_a_scheduler_worker_reconfigured_as_kworkers_run_does_keeps_its_hold(
        tmp_path: Path) -> None:
    """``kworkers run`` runs ``worker.with_config(flags)``: a copy that lost the rung rules
    would run every rung record the moment it is read, i.e. deliver scheduled records early."""
    import dataclasses

    from kworkers.schedule import Scheduler

    s = Scheduler("127.0.0.1:1", SqliteStore(tmp_path / "s.db"), destinations=["orders"])
    w = s.worker("orders-scheduler")
    again = w.with_config(dataclasses.replace(w.config, concurrency=3))
    assert again is not w and again.config.concurrency == 3
    assert again._hold is not None and again._hold is w._hold
