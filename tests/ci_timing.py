"""Where CI's time goes: a table per suite at the end of every run, and the order of files.

CI prints the slowest tests (``--durations``); what it did not show is the time of each suite
(``tests/unit``, ``tests/integration``, ``tests/faults``) and what the brokers cost (each
``fault_broker`` test starts its own). This plugin adds both, works alone or under
pytest-xdist (the workers attach their figures to the reports they send; the controller adds
them up), and writes every test's figures as JSON when ``KWORKERS_TIMING_JSON`` names a file.

Under xdist, files run heaviest first (``tests/ci_order.txt``, regenerated from such a JSON by
``python -m tests.ci_timing order FILE.json``): a long fault test started last would run
alone on one core while the other idles. Files keep their own order inside; files not in the
list run first (a new file's cost is unknown, and unknown early is cheaper than unknown last).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kworkers.testing import broker as broker_module

ORDER_FILE = Path(__file__).with_name("ci_order.txt")
KEY = "kw_timing"


def suite_of(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


# --- in every process that runs tests: what the brokers cost ---------------------------------

_lock = threading.Lock()
_broker_s: dict[str, float] = defaultdict(float)
_broker_n: dict[str, int] = defaultdict(int)
_current = [""]


def _timed(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        try:
            return fn(self, *args, **kwargs)
        finally:
            with _lock:
                _broker_s[_current[0]] += time.monotonic() - began
                _broker_n[_current[0]] += 1
    wrapper.__name__ = getattr(fn, "__name__", kind)
    wrapper.kw_timed = True  # type: ignore[attr-defined]
    return wrapper


def _wrap_brokers() -> None:
    for cls in (broker_module.ContainerBroker, broker_module.ProcessBroker):
        for name in ("start", "restart"):
            fn = getattr(cls, name)
            if not getattr(fn, "kw_timed", False):
                setattr(cls, name, _timed(name, fn))


# --- the figures of one test, as the controller receives them ---------------------------------

@dataclass
class TestFigures:
    nodeid: str
    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0
    broker_s: float = 0.0
    broker_starts: int = 0
    outcome: str = "passed"
    start: float = 0.0
    stop: float = 0.0

    @property
    def total(self) -> float:
        return self.setup + self.call + self.teardown


@dataclass
class SuiteFigures:
    tests: int = 0
    summed: float = 0.0
    setup: float = 0.0
    broker_s: float = 0.0
    broker_starts: int = 0
    start: float = float("inf")
    stop: float = 0.0
    failed: int = 0

    def add(self, t: TestFigures) -> None:
        self.tests += 1
        self.summed += t.total
        self.setup += t.setup
        self.broker_s += t.broker_s
        self.broker_starts += t.broker_starts
        self.start = min(self.start, t.start)
        self.stop = max(self.stop, t.stop)
        self.failed += t.outcome == "failed"


@dataclass
class Collector:
    tests: dict[str, TestFigures] = field(default_factory=dict)
    began: float = field(default_factory=time.time)
    cpu0: tuple[int, int] = (0, 0)

    def take(self, report: pytest.TestReport) -> None:
        t = self.tests.setdefault(report.nodeid, TestFigures(report.nodeid))
        setattr(t, report.when, getattr(t, report.when) + report.duration)
        start = getattr(report, "start", None) or time.time() - report.duration
        stop = getattr(report, "stop", None) or time.time()
        t.start = start if t.start == 0.0 else min(t.start, start)
        t.stop = max(t.stop, stop)
        if report.failed:
            t.outcome = "failed"
        elif report.skipped and t.outcome != "failed":
            t.outcome = "skipped"
        for key, value in report.user_properties:
            if key == KEY and isinstance(value, dict):
                t.broker_s += float(value["broker_s"])
                t.broker_starts += int(value["broker_starts"])

    def suites(self) -> dict[str, SuiteFigures]:
        out: dict[str, SuiteFigures] = defaultdict(SuiteFigures)
        for t in self.tests.values():
            out[suite_of(t.nodeid)].add(t)
        return dict(sorted(out.items()))


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores, from /proc/stat; (0, 0) where there is none."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0, 0
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


_collector = Collector()


def pytest_configure(config: pytest.Config) -> None:
    _wrap_brokers()
    _collector.began = time.time()
    _collector.cpu0 = cpu_ticks()


def _under_xdist(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) or hasattr(config, "workerinput")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _under_xdist(config) or not ORDER_FILE.exists():
        return
    ranked = [line.strip() for line in ORDER_FILE.read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    rank = {name: i for i, name in enumerate(ranked)}
    # unknown files first (rank -1), then heaviest first; sorted() is stable inside a file
    items.sort(key=lambda item: rank.get(file_of(item.nodeid), -1))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[0] = item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[
        None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "teardown":
        with _lock:
            seconds = _broker_s.pop(item.nodeid, 0.0)
            starts = _broker_n.pop(item.nodeid, 0)
        # the session broker's start falls in the first test that asked for it
        report.user_properties.append(
            (KEY, {"broker_s": round(seconds, 3), "broker_starts": starts}))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _collector.take(report)


def _fmt(seconds: float) -> str:
    return f"{seconds:7.1f}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _collector.tests:
        return
    wall = time.time() - _collector.began
    busy0, total0 = _collector.cpu0
    busy1, total1 = cpu_ticks()
    ncpu = os.cpu_count() or 1
    cores = (busy1 - busy0) / (total1 - total0) * ncpu if total1 > total0 else 0.0
    tr = terminalreporter
    tr.section("where the time went (tests/ci_timing.py)")
    tr.write_line(f"{'suite':<20} {'tests':>6} {'wall s':>7} {'summed':>7} {'set-up':>7} "
                  f"{'brokers':>8} {'broker s':>8} {'failed':>6}")
    for name, s in _collector.suites().items():
        span = s.stop - s.start if s.stop > s.start else 0.0
        tr.write_line(f"{name:<20} {s.tests:>6} {_fmt(span)} {_fmt(s.summed)} {_fmt(s.setup)} "
                      f"{s.broker_starts:>8} {_fmt(s.broker_s):>8} {s.failed:>6}")
    summed = sum(t.total for t in _collector.tests.values())
    tr.write_line(f"pytest wall {wall:.1f} s, test time summed {summed:.1f} s "
                  f"({summed / wall if wall else 0:.2f} tests at a time), "
                  f"{cores:.2f} of {ncpu} cores busy on average (whole machine, /proc/stat); "
                  "a suite's wall is its first start to its last end, which overlap under -n")
    target = os.environ.get("KWORKERS_TIMING_JSON")
    if target:
        Path(target).write_text(json.dumps(
            {"wall_s": wall, "cores_busy": cores,
             "tests": [vars(t) | {"total": t.total}
                       for t in sorted(_collector.tests.values(), key=lambda t: -t.total)]},
            indent=1))
        tr.write_line(f"per-test figures: {target}")


def write_order(source: Path, target: Path = ORDER_FILE) -> int:
    """Files by their summed time, heaviest first, from a KWORKERS_TIMING_JSON file."""
    per_file: dict[str, float] = defaultdict(float)
    for t in json.loads(source.read_text())["tests"]:
        per_file[file_of(t["nodeid"])] += float(t["total"])
    ranked = sorted(per_file.items(), key=lambda kv: -kv[1])
    target.write_text("# heaviest first; regenerate: python -m tests.ci_timing order FILE.json\n"
                      + "".join(f"{name}\n" for name, _ in ranked))
    return len(ranked)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "order":
        print("usage: python -m tests.ci_timing order TIMING.json", file=sys.stderr)
        return 2
    print(f"{write_order(Path(argv[1]))} files ranked in {ORDER_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
