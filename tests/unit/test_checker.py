"""The fault checker itself must be able to say no."""

from __future__ import annotations

from pathlib import Path

from kworkers.testing.effects import Ledger, check


def _ledger(tmp_path: Path) -> Ledger:
    led = Ledger(tmp_path / "l.db")
    for off, value in enumerate(["a", "b", "c", "d"]):
        led.delivered(value, "t", 0, off, 1)
        led.apply_once(value, value)
    return led


def test_a_clean_run_is_ok(tmp_path: Path) -> None:
    report = check(_ledger(tmp_path), {"a", "b", "c", "d"}, "t", [{0: 2}, {0: 4}])
    assert report.ok, report.summary()


def test_lost_duplicate_skipped_and_non_monotonic_are_reported(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    led.delivered("b", "t", 0, 1, 1)  # a redelivery: allowed, counted
    led._conn().execute("INSERT INTO effects VALUES ('b2', 'b', 1, 0)")  # effect twice
    report = check(led, {"a", "b", "c", "d", "e"}, "t", [{0: 3}, {0: 2}, {0: 6}])
    assert report.lost == ["e"]
    assert report.duplicate_effects == 1
    assert report.redeliveries == 1
    assert report.non_monotonic == [(0, 3, 2)]
    assert report.skipped == [(0, 4), (0, 5)]  # committed to 6, offsets 4 and 5 never handled
    assert not report.ok
