"""A workflow that sleeps, waits for a signal and branches, under ``kworkers run`` (no
``engine.run``: the worker's run hook starts the relay), on the real broker, with every worker
SIGKILLed while the runs sleep and one SIGKILLed right after a signal was sent.

``examples.approval``: submit ─ sleep ─▶ review ─ wait for "decision" ─▶ decide ─▶ publish or
reject; a run whose decision never comes times out and is compensated (withdraw). Counts come
from the example's append-only log (no unique key: a step run twice shows twice), read back
from the store; times from the same log.

"Never early" has teeth only where a worker is alive while the runs sleep (a dead pool wakes
nothing early, whatever the timer says): one worker is SIGKILLed while the runs sleep, the other
lives through the sleep and is SIGKILLed only once a run was reviewed after its due time. The
canary (``tests/apps/early_timer.py``: a timer due after a tenth of the time asked) is judged the
same way and caught.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kworkers.testing import Broker
from kworkers.testing.processes import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.faults]

ROOT = str(Path(__file__).resolve().parents[2])
APP = "examples.approval.app"
COOL = 3.0


def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _kworkers(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "kworkers.cli", *args], cwd=ROOT, env=os.environ,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _store_url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    dsn = os.environ.get("KWORKERS_PG_DSN")
    if not dsn:
        pytest.skip("KWORKERS_PG_DSN is unset")
    return dsn


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("store", "per_ending"), [
    ("sqlite", 1), pytest.param("postgres", 10, marks=pytest.mark.full_only)])
def test_sleep_signal_branch_under_kworkers_run_with_kills(
        kafka_broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str,
        per_ending: int) -> None:
    name = f"ap_{uuid.uuid4().hex[:8]}"
    url = _store_url(store, tmp_path)
    monkeypatch.setenv("KWORKERS_STORE_URL", url)
    monkeypatch.setenv("APPROVAL_NAME", name)
    from examples.approval import app

    engine = app.engine()
    bs = kafka_broker.bootstrap_servers
    engine.create_topics(engine.worker(group_id=name, bootstrap_servers=bs), partitions=3)
    runs = {f"{kind}{i}": timeout for i in range(per_ending)  # run -> its signal timeout
            for kind, timeout in (("yes", 600.0), ("no", 600.0), ("late", 4.0))}
    yes = [r for r in runs if r.startswith("yes")]
    no = [r for r in runs if r.startswith("no")]
    late = [r for r in runs if r.startswith("late")]
    for run, timeout in runs.items():
        engine.start("approval", f"{name}-{run}", {"cooling_s": COOL, "timeout_s": timeout})
    workers = [WorkerProcess(["-m", "kworkers.cli", "run", f"{APP}:worker", "-b", bs],
                             tmp_path, f"w{i}", cwd=ROOT) for i in range(2)]

    def log() -> list[tuple[str, str, float]]:
        return app.log_of(engine.store, name)

    def steps(run: str) -> list[str]:
        return [s for w, s, _ in log() if w == f"{name}-{run}"]

    def state(run: str) -> tuple[str, str | None, str | None]:
        r = engine.tables.run(f"{name}-{run}")
        assert r is not None
        return r.status, r.state.activity, r.state.signal

    try:
        for w in workers:
            w.start()
        _until(lambda: all(steps(r) == ["submit"] for r in runs), 90, "every run submitted")
        workers[1].kill()  # killed while every run sleeps; workers[0] lives through the sleep
        assert all(state(r)[1] == "review" for r in runs)
        # a worker alive through the sleep, killed only after a run was reviewed (so after
        # the due time): an early timer would have woken its runs early here
        _until(lambda: any("review" in steps(r) for r in runs), 90 + COOL,
               "a run reviewed by the live worker")
        workers[0].kill()
        for w in workers:
            w.start()
        _until(lambda: all(state(r)[2] == "decision" for r in yes + no), 90,
               "the runs waiting for their decision")
        _kworkers("workflow", "signal", f"{APP}:engine", f"{name}-{yes[0]}", "decision",
                  "--payload", '{"approve": true}')
        workers[0].kill()  # killed while signalled
        for r in yes[1:]:
            engine.signal(f"{name}-{r}", "decision", {"approve": True})
        for r in no:
            engine.signal(f"{name}-{r}", "decision", {"approve": False})
        workers[0].start()
        want = {r: "compensated" if r in late else "completed" for r in runs}
        _until(lambda: {r: state(r)[0] for r in runs} == want, 180, "every run's ending")
        shown = _kworkers("workflow", "show", f"{name}-{late[0]}", "--store", url,
                          "--tables", f"{name}_wf")
        assert "SignalTimeout" in shown, shown
    finally:
        for w in workers:
            w.terminate(timeout=30)
        for w in workers:
            w.close()
    try:
        _check(runs, yes, no, steps, log, engine, name)
    finally:
        if store == "postgres":
            with engine.store.atomic() as conn:
                conn.execute(", ".join(f"{name}_wf_{t}" for t in (
                    "runs", "steps", "outbox", "signals")).join(
                    ("DROP TABLE IF EXISTS ", f", {name}_log")), ())


def woken_early(log: list[tuple[str, str, float]], runs: list[str]) -> list[str]:
    """Runs whose review ran before their submit's time plus ``COOL`` (the example's log:
    one row per step run, with the time it ran), or never ran: each run must have both."""
    at = {(w, s): t for w, s, t in log}
    out = []
    for wid in runs:
        if (wid, "submit") not in at or (wid, "review") not in at:
            out.append(f"{wid}: submit or review never ran")
        elif at[(wid, "review")] < at[(wid, "submit")] + COOL:
            out.append(f"{wid}: reviewed {at[(wid, 'review')] - at[(wid, 'submit')]:.2f}s "
                       f"after submit, the timer says {COOL}s")
    return out


@pytest.mark.timeout(300)
def test_canary_an_early_timer_is_caught_by_a_live_worker(
        kafka_broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run, one worker alive through the sleep, the timer broken (a tenth of the time):
    the same judge finds the run reviewed early."""
    name = f"ap_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("KWORKERS_STORE_URL", _store_url("sqlite", tmp_path))
    monkeypatch.setenv("APPROVAL_NAME", name)
    from examples.approval import app

    engine = app.engine()
    bs = kafka_broker.bootstrap_servers
    engine.create_topics(engine.worker(group_id=name, bootstrap_servers=bs), partitions=3)
    wid = f"{name}-early"
    engine.start("approval", wid, {"cooling_s": COOL, "timeout_s": 600.0})
    w = WorkerProcess(["-m", "tests.apps.early_timer", "run", f"{APP}:worker", "-b", bs],
                      tmp_path, "early", cwd=ROOT)
    try:
        w.start()
        _until(lambda: any(s == "review" for _, s, _ in app.log_of(engine.store, name)), 90,
               "the run reviewed")
    finally:
        w.terminate(timeout=30)
        w.close()
    early = woken_early(app.log_of(engine.store, name), [wid])
    print(f"canary: {early}")
    assert len(early) == 1 and "after submit, the timer says" in early[0], early


def _check(runs: dict[str, float], yes: list[str], no: list[str],
           steps: Callable[[str], list[str]], log: Callable[[], list[tuple[str, str, float]]],
           engine: Any, name: str) -> None:
    for r in runs:
        assert steps(r) == (["submit", "review", "decide", "publish"] if r in yes else
                            ["submit", "review", "decide", "reject"] if r in no else
                            ["submit", "review", "withdraw"]), log()
    early = woken_early(log(), [f"{name}-{r}" for r in runs])
    assert not early, early  # the timer never fired early (wall times from the log)
    for run in yes + no:  # one signal each, taken by the step that waited for it
        assert [(n, c) for n, _, c in engine.tables.signals(f"{name}-{run}")] == [
            ("decision", "decide")]
