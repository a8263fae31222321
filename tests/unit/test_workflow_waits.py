"""Workflows that wait (durable timers) and branch, on a real store (SQLite; PostgreSQL when
KWORKERS_PG_DSN is set), an in-memory broker (``Harness``) and an injected clock.

Times come back from the append-only ledger: each step appends its effect, stamped with the
(fake) clock at which it ran, in its checkpoint's transaction; the checks read them back.
Canaries: a relay that fires timers early with the runner's guard off is caught by the same
check; a branch decided outside the checkpoint (re-decided on a replay) is caught by the
one-branch check.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kworkers.clock import FakeClock
from kworkers.idempotency import SqliteStore
from kworkers.idempotency.outbox import Outbox
from kworkers.idempotency.store import TransactionalStore
from kworkers.retry_tiers import RetryPolicy
from kworkers.testing.ledger import Ledger
from kworkers.workflow import Engine, StepContext, Workflow
from kworkers.workflow.state import RunState, on_failure, on_success
from tests.apps.workflow_checks import Harness

TOPIC = "wf.activities"
T0 = 1_800_000_000.0
NAP = 60.0


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionalStore[Any]]:
    if request.param == "sqlite":
        s: Any = SqliteStore(str(tmp_path / "store.db"))
        s.prefix = "kworkers_wf"
        yield s
        s.close()
        return
    dsn = os.environ.get("KWORKERS_PG_DSN")
    if not dsn:
        pytest.skip("KWORKERS_PG_DSN is unset")
    from kworkers.idempotency.postgres import PostgresStore

    name = f"kwt_{uuid.uuid4().hex[:10]}"
    s = PostgresStore(dsn, table=name)
    s.prefix = name
    yield s
    with s.atomic() as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}, {name}_runs, {name}_steps, {name}_outbox, "
                     f"{name}_ledger_effects, {name}_ledger_deliveries, "
                     f"{name}_ledger_rebalances", ())
    s.close()


def _ledger(store: Any) -> Ledger:
    return Ledger.on_store(store, table=store.prefix + "_ledger")


def _engine(store: Any, clock: FakeClock, *workflows: Workflow) -> Engine:
    return Engine(store, list(workflows), topic=TOPIC, tables=store.prefix, clock=clock)


def _effect(ledger: Ledger, ctx: StepContext, clock: FakeClock) -> None:
    """The step's effect in its checkpoint, stamped with the time the step ran."""
    at = clock.now()
    ctx.apply_once(lambda conn: ledger.apply_in(conn, ctx.idempotency_key, at=at))


def _napper(ledger: Ledger, clock: FakeClock) -> Workflow:
    wf = Workflow("napper")

    @wf.step
    def before(ctx: StepContext) -> dict[str, float]:
        _effect(ledger, ctx, clock)
        ctx.sleep(NAP)
        return {"slept_at": clock.now()}

    @wf.step
    def after(ctx: StepContext) -> None:
        _effect(ledger, ctx, clock)

    return wf


def _early(ledger: Ledger) -> list[str]:
    """Runs whose ``after`` ran before ``before`` + NAP (read back from the ledger)."""
    at = {e.key: e.at for e in ledger.effects()}
    return sorted(k.split("/")[0] for k in at if k.endswith("/after")
                  and at[k] < at[k.replace("/after", "/before")] + NAP)


def test_a_sleep_holds_the_next_step_until_it_is_due_never_early(store: Any) -> None:
    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock, _napper(ledger, clock))
    h = Harness(engine)
    engine.start("napper", "r-1")
    h.pump()
    run = engine.tables.run("r-1")
    assert run is not None and run.status == "running" and run.state.activity == "after"
    assert run.state.wake_at == T0 + NAP
    assert ledger.applications() == {"r-1/before": 1}
    clock.advance(NAP - 0.001)
    h.pump()
    assert ledger.applications() == {"r-1/before": 1}, "the timer fired early"
    clock.advance(0.001)
    h.pump()
    assert ledger.applications() == {"r-1/before": 1, "r-1/after": 1}
    assert engine.tables.run("r-1").status == "completed"  # type: ignore[union-attr]
    assert _early(ledger) == []


def test_a_crash_during_the_wait_changes_nothing(store: Any, tmp_path: Path) -> None:
    """The wait is a row in the store: a new process (a new engine, no memory of the first)
    wakes the run on time; a checkpoint crash (redelivery) neither repeats nor loses a step."""
    clock = FakeClock(T0)
    ledger = _ledger(store)
    first = _engine(store, clock, _napper(ledger, clock))
    h = Harness(first, seed=3, crash_after_commit=0.5, relay_loses_acks=0.5)
    for i in range(10):
        first.start("napper", f"r-{i}")
    h.pump()
    del first, h  # "SIGKILL": nothing of it survives but the store
    clock.advance(NAP / 2)
    second = _engine(store, clock, _napper(ledger, clock))
    h2 = Harness(second, seed=4, crash_after_commit=0.5)
    h2.pump()
    assert all(k.endswith("/before") for k in ledger.applications())
    clock.advance(NAP / 2)
    h2.pump()
    apps = ledger.applications()
    assert apps == {f"r-{i}/{s}": 1 for i in range(10) for s in ("before", "after")}
    assert _early(ledger) == []
    assert {r.status for r in second.tables.list_runs()} == {"completed"}


class _EarlyOutbox(Outbox):
    """A relay whose clock runs 2 naps ahead: it sends timers early (as would a claim without
    the due-time predicate)."""

    def claim(self, limit: int = 100) -> Any:
        real = self.clock
        self.clock = FakeClock(real.now() + 2 * NAP)
        try:
            return super().claim(limit)
        finally:
            self.clock = real


def _early_relay(engine: Engine) -> None:
    box = _EarlyOutbox(engine.store, table=engine.outbox.table, clock=engine.clock)
    engine.outbox = engine.runner.outbox = box


def test_a_relay_firing_early_is_absorbed_by_the_runners_guard(store: Any) -> None:
    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock, _napper(ledger, clock))
    _early_relay(engine)
    h = Harness(engine)
    engine.start("napper", "r-1")
    for _ in range(6):  # "before", then "after" sent early again and again: put back each time
        h.relay()
        engine.runner(h.queue.popleft())
        assert not h.queue
    assert ledger.applications() == {"r-1/before": 1}
    assert engine.metrics.workflow_steps.labels("napper", "after", "early")._value.get() >= 1
    clock.advance(NAP)
    h.pump()  # the put-back copy, due now, runs
    assert ledger.applications() == {"r-1/before": 1, "r-1/after": 1}
    assert _early(ledger) == []


def test_canary_an_early_timer_without_the_guard_is_caught(store: Any,
                                                           monkeypatch: Any) -> None:
    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock, _napper(ledger, clock))
    _early_relay(engine)
    monkeypatch.setattr(engine.runner, "_wait_state", lambda row, sig: "run")  # the guard off
    h = Harness(engine)
    engine.start("napper", "r-1")
    h.pump()
    assert _early(ledger) == ["r-1"], "the early-timer check cannot fail"


def test_outbox_rows_due_later_wait_and_hold_back_their_key(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    s = SqliteStore(str(tmp_path / "o.db"))
    box = Outbox(s, clock=clock)
    with s.atomic() as conn:
        box.enqueue(conn, "t", b"k", b"1", not_before=T0 + 10)
        box.enqueue(conn, "t", b"k", b"2")
        box.enqueue(conn, "t", b"other", b"3")
    assert [r.value for r in box.claim()] == [b"3"]
    clock.advance(10)
    assert [r.value for r in box.claim()] == [b"1", b"2"]
    s.close()


def test_sleep_arguments_are_checked() -> None:
    from kworkers.workflow.context import Results

    ctx = StepContext(workflow_id="w", workflow="x", activity_id="a", kind="step", attempt=1,
                      input=None, results=Results({}, "w"), cause=None, traceparent=None,
                      now=lambda: T0)
    for bad in (-1, float("nan"), float("inf"), "5"):
        with pytest.raises(ValueError, match="sleep takes"):
            ctx.sleep(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        ctx.sleep_until(datetime(2030, 1, 1))
    ctx.sleep_until(datetime.fromtimestamp(T0 + 5, tz=UTC))
    assert ctx.wake_at == T0 + 5
    ctx.sleep_until(T0 - 100)  # past: due at once, never before "now"
    assert ctx.wake_at == T0
    ctx.sleep(2.5)
    assert ctx.wake_at == T0 + 2.5


# -- branches ----------------------------------------------------------------------------------


def _router(ledger: Ledger, clock: FakeClock, decide: Any) -> Workflow:
    """check → (approve → ship → done) or (reject → done): ``decide(ctx)`` picks."""
    wf = Workflow("router")

    @wf.step
    def check(ctx: StepContext) -> dict[str, str]:
        _effect(ledger, ctx, clock)
        choice = decide(ctx)
        ctx.goto(choice)
        return {"chose": choice}

    @wf.step
    def approve(ctx: StepContext) -> None:
        _effect(ledger, ctx, clock)
        ctx.goto("done")

    @wf.step
    def reject(ctx: StepContext) -> None:
        _effect(ledger, ctx, clock)

    @wf.step
    def done(ctx: StepContext) -> None:
        _effect(ledger, ctx, clock)

    return wf


def _branches(ledger: Ledger) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for key in ledger.applications():
        wid, step = key.split("/")
        if step in ("approve", "reject"):
            out.setdefault(wid, set()).add(step)
    return out


def test_a_branch_is_checkpointed_so_replays_take_the_same_path(store: Any) -> None:
    """``check`` decides at random on every call (a non-deterministic choice); with crashes
    after its checkpoint, its record is redelivered, but the choice committed with its result:
    each run takes one branch, each step's effect once, the steps jumped over never run."""
    import random

    rnd = random.Random(7)
    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock,
                     _router(ledger, clock, lambda ctx: rnd.choice(["approve", "reject"])))
    h = Harness(engine, RetryPolicy(max_attempts=20), seed=5, crash_after_commit=0.5,
                relay_loses_acks=0.3)
    ids = [f"o-{i}" for i in range(16)]
    for i in ids:
        engine.start("router", i)
    h.pump()
    assert h.crashes > 3
    apps = ledger.applications()
    assert set(apps.values()) == {1}, apps
    branches = _branches(ledger)
    assert all(len(b) == 1 for b in branches.values()) and len(branches) == len(ids)
    for i in ids:
        run = engine.tables.run(i)
        assert run is not None and run.status == "completed"
        chose = engine.tables.history(i)[0].result
        assert chose is not None and next(iter(branches[i])) in chose
        assert apps[f"{i}/done"] == 1


def test_canary_a_choice_made_outside_the_checkpoint_takes_both_branches(store: Any) -> None:
    """The broken variant: no ``goto``; each branch step re-decides (reads a flag that changes
    between deliveries) and skips itself when not chosen. A replay of the decision then takes
    the other path: the one-branch check catches it."""
    flips = iter([True, False] * 100)
    clock = FakeClock(T0)
    ledger = _ledger(store)
    wf = Workflow("router")

    @wf.step
    def check(ctx: StepContext) -> None:
        _effect(ledger, ctx, clock)

    @wf.step
    def approve(ctx: StepContext) -> None:
        if next(flips):
            _effect(ledger, ctx, clock)

    @wf.step
    def reject(ctx: StepContext) -> None:
        if not next(flips):  # "rejected" is read again, after the world changed
            _effect(ledger, ctx, clock)

    engine = _engine(store, clock, wf)
    h = Harness(engine)
    engine.start("router", "o-1")
    h.pump()
    assert _branches(ledger)["o-1"] == {"approve", "reject"}, "the one-branch check cannot fail"


def test_bad_branches_fail_the_step_for_good_with_the_reason(store: Any) -> None:
    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock, _router(ledger, clock, lambda ctx: ctx.input))
    h = Harness(engine)
    engine.start("router", "o-back", "check")
    engine.start("router", "o-none", "nowhere")
    h.pump()
    assert [str(e) for _m, e in h.dlq] and len(h.dlq) == 2
    for wid, why in (("o-back", "BackwardBranch"), ("o-none", "UnknownBranch")):
        run = engine.tables.run(wid)
        assert run is not None and run.status == "failed" and why in (run.state.error or "")
    assert "o-back/approve" not in ledger.applications()


def test_a_branch_not_taken_is_not_compensated() -> None:
    """Pure: a saga a → goto c (b jumped over) → c fails for good: only a is undone."""
    wf = Workflow("s")
    for name in ("a", "b", "c"):
        wf.add(lambda ctx: None, name=name, compensate=lambda ctx: None)
    d = wf.freeze()
    t = on_success(d, RunState("running", "a", "step", 0), goto="c", done={"a"})
    assert t.dispatch == "c"
    t = on_failure(d, t.state, "E: x", done={"a"})
    assert t.dispatch == "compensate.a"
    assert on_failure(d, RunState("running", "c", "step", 2), "E: x",
                      done={"a", "b"}).dispatch == "compensate.b"
    t = on_success(d, RunState("running", "b", "step", 1), goto="")
    assert t.state.status == "completed" and t.dispatch is None
    t = on_success(d, RunState("running", "a", "step", 0), wake_at=T0)
    assert t.state.wake_at == T0 and t.dispatch == "b"
    assert on_failure(d, t.state, "E: x", done={"a"}).state.wake_at is None


# -- signals -----------------------------------------------------------------------------------


def _approval(ledger: Ledger, clock: FakeClock, timeout: float = 600.0) -> Workflow:
    """submit (undo: withdraw) → wait for "approved" → record the payload."""
    wf = Workflow("approval")

    def withdraw(ctx: StepContext) -> None:
        _effect(ledger, ctx, clock)

    @wf.step(compensate=withdraw)
    def submit(ctx: StepContext) -> None:
        _effect(ledger, ctx, clock)
        ctx.wait_for_signal("approved", timeout=timeout)

    @wf.step
    def approved(ctx: StepContext) -> dict[str, Any]:
        _effect(ledger, ctx, clock)
        return {"by": ctx.signal["by"]}

    return wf


def _result(engine: Engine, wid: str, step: str) -> Any:
    import json

    got = {h.activity_id: h.result for h in engine.tables.history(wid)}
    return json.loads(got[step] or "null")


def test_a_step_waits_for_its_signal_and_reads_the_payload(store: Any) -> None:
    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock, _approval(ledger, clock))
    h = Harness(engine)
    engine.start("approval", "a-1")
    h.pump()
    run = engine.tables.run("a-1")
    assert run is not None and run.state.signal == "approved" and run.state.wake_at == T0 + 600
    assert ledger.applications() == {"a-1/submit": 1}
    clock.advance(10)
    assert engine.signal("a-1", "approved", {"by": "ann"}) is True
    h.pump()
    assert ledger.applications() == {"a-1/submit": 1, "a-1/approved": 1}
    assert _result(engine, "a-1", "approved") == {"by": "ann"}
    assert engine.tables.signals("a-1") == [("approved", T0 + 10, "approved")]
    assert engine.tables.run("a-1").status == "completed"  # type: ignore[union-attr]
    clock.advance(1000)  # the deadline's record comes and is skipped
    h.pump()
    assert ledger.applications() == {"a-1/submit": 1, "a-1/approved": 1}


def test_a_signal_sent_before_the_wait_is_kept(store: Any) -> None:
    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock, _approval(ledger, clock))
    h = Harness(engine)
    engine.start("approval", "a-1")
    assert engine.signal("a-1", "approved", {"by": "bob"}) is False  # nobody waits yet
    h.pump()  # no clock advance: the kept signal wakes the step at once
    assert ledger.applications() == {"a-1/submit": 1, "a-1/approved": 1}
    assert _result(engine, "a-1", "approved") == {"by": "bob"}


def test_canary_a_signal_dropped_before_the_wait_is_caught(store: Any,
                                                          monkeypatch: Any) -> None:
    """The broken variant keeps a signal only when a step already waits for it."""
    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock, _approval(ledger, clock))
    h = Harness(engine, RetryPolicy(max_attempts=1))
    keep = engine.tables.add_signal

    def only_if_waiting(conn: Any, wid: str, name: str, payload: Any, now: float) -> None:
        row = engine.tables.lock_run(conn, wid, lock=False)
        if row is not None and row.state.signal == name:
            keep(conn, wid, name, payload, now)

    monkeypatch.setattr(engine.tables, "add_signal", only_if_waiting)
    engine.start("approval", "a-1")
    engine.signal("a-1", "approved", {"by": "bob"})
    h.pump()
    clock.advance(600)
    h.pump()
    assert "a-1/approved" not in ledger.applications(), "the kept-signal check cannot fail"
    assert engine.tables.run("a-1").status == "compensated"  # type: ignore[union-attr]


def test_a_wait_that_times_out_fails_its_step_and_compensates(store: Any) -> None:
    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock, _approval(ledger, clock, timeout=60))
    h = Harness(engine, RetryPolicy(max_attempts=2))
    engine.start("approval", "a-1")
    h.pump()
    clock.advance(59.999)
    h.pump()
    assert engine.tables.run("a-1").status == "running"  # type: ignore[union-attr]
    clock.advance(0.001)
    h.pump()
    run = engine.tables.run("a-1")
    assert run is not None and run.status == "compensated"
    assert "SignalTimeout" in (run.state.cause or "")
    assert ledger.applications() == {"a-1/submit": 1, "a-1/compensate.submit": 1}
    steps = {s.activity_id: s for s in engine.tables.history("a-1")}
    assert steps["approved"].status == "failed" and steps["approved"].attempts == 2
    with pytest.raises(Exception, match="compensated: nothing would read"):
        engine.signal("a-1", "approved")


def test_signals_and_kills_during_the_wait_each_step_once(store: Any) -> None:
    """Crashes after checkpoints, relays that lose acks, a whole new process during the wait,
    signals to half the runs before the wait and to the other half during it."""
    clock = FakeClock(T0)
    ledger = _ledger(store)
    first = _engine(store, clock, _approval(ledger, clock))
    h = Harness(first, RetryPolicy(max_attempts=20), seed=11, crash_after_commit=0.4,
                relay_loses_acks=0.4)
    ids = [f"a-{i}" for i in range(12)]
    for i in ids:
        first.start("approval", i)
    for i in ids[:6]:
        first.signal(i, "approved", {"by": i})
    h.pump()
    second = _engine(store, clock, _approval(ledger, clock))  # the first one "killed"
    h2 = Harness(second, RetryPolicy(max_attempts=20), seed=12, crash_after_commit=0.4)
    for i in ids[6:]:
        assert second.signal(i, "approved", {"by": i}) is True
    h2.pump()
    assert ledger.applications() == {f"{i}/{s}": 1 for i in ids for s in ("submit", "approved")}
    for i in ids:
        assert _result(second, i, "approved") == {"by": i}
    assert {r.status for r in second.tables.list_runs()} == {"completed"}


def test_bad_signals_are_refused_with_the_reason(store: Any) -> None:
    from kworkers.errors import ConfigError

    clock = FakeClock(T0)
    ledger = _ledger(store)
    engine = _engine(store, clock, _approval(ledger, clock))
    engine.start("approval", "a-1")
    with pytest.raises(ConfigError, match="no workflow run 'nope'"):
        engine.signal("nope", "approved")
    with pytest.raises(ConfigError, match="signal name"):
        engine.signal("a-1", "not a name")
    with pytest.raises(ConfigError, match=r"ResultNotSerializable|JSON"):
        engine.signal("a-1", "approved", {1, 2})
    assert engine.tables.signals("a-1") == []


# -- the engine runs with the worker: kworkers run, effective settings, deadlines ---------------


def test_a_step_past_message_timeout_is_a_failed_attempt_the_engine_records(
        store: Any) -> None:
    import time as _time

    clock = FakeClock(T0)
    ledger = _ledger(store)
    wf = Workflow("slow")

    @wf.step
    def crawl(ctx: StepContext) -> None:
        _effect(ledger, ctx, clock)
        _time.sleep(0.02)

    engine = _engine(store, clock, wf)
    h = Harness(engine, RetryPolicy(max_attempts=3))
    engine.runner.deadline = 0.001
    engine.start("slow", "s-1")
    h.pump()
    run = engine.tables.run("s-1")
    assert run is not None and run.status == "failed" and "StepOverran" in (run.state.error or "")
    (step,) = engine.tables.history("s-1")
    assert (step.status, step.attempts) == ("failed", 3)
    assert ledger.applications() == {}, "an overrun step must not checkpoint"
    assert [type(e).__name__ for _m, e in h.dlq] == ["StepOverran"]


def _scripted_worker(engine: Engine) -> Any:
    from kworkers import Worker
    from tests.unit.test_loop_with_fake_consumer import ScriptedConsumer

    idle = ScriptedConsumer([], [], "g.retry")
    main = ScriptedConsumer([], [])
    for c in (idle, main):
        c.go.set()
    w = Worker(topics=[TOPIC], group_id="g", bootstrap_servers="127.0.0.1:1",
               consumer=lambda g: main if g == "g" else idle, retry=RetryPolicy(max_attempts=3))
    return engine.bind(w), main


def _serves(engine: Engine, worker: Any, consumer: Any) -> bool:
    """Runs ``worker`` until its loop subscribed (the hooks are entered before): True when
    this engine's relay ran beside it, and stopped with it."""
    import threading
    import time as _time

    t = threading.Thread(target=worker.run, args=(False,), daemon=True)
    t.start()
    deadline = _time.monotonic() + 30
    while consumer.on_assign is None and _time.monotonic() < deadline:
        _time.sleep(0.01)
    assert consumer.on_assign is not None, "the worker never started"
    served = engine._relay is not None
    worker.stop()
    t.join(30)
    assert not t.is_alive()
    return served and engine._relay is None  # and stopped with it


def test_a_bound_worker_reconfigured_as_kworkers_run_does_runs_the_relay_with_its_settings(
        tmp_path: Path) -> None:
    """``kworkers run`` runs ``worker.with_config(flags)``: the run hook goes with it, the
    relay runs beside its loops, and the engine's verdicts use *its* policy and deadline."""
    import dataclasses

    store: Any = SqliteStore(str(tmp_path / "s.db"))
    store.prefix = "kworkers_wf"
    engine = _engine(store, FakeClock(T0), _napper(_ledger(store), FakeClock(T0)))
    w, consumer = _scripted_worker(engine)
    flags = dataclasses.replace(w.config, retry=RetryPolicy(max_attempts=7),
                                message_timeout=12.5)
    w2 = w.with_config(flags)
    assert _serves(engine, w2, consumer)
    assert engine.runner.policy == RetryPolicy(max_attempts=7)
    assert engine.runner.deadline == 12.5


def test_canary_a_copy_without_the_run_hook_runs_no_relay(tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    import dataclasses

    from kworkers import Worker

    store: Any = SqliteStore(str(tmp_path / "s.db"))
    store.prefix = "kworkers_wf"
    engine = _engine(store, FakeClock(T0), _napper(_ledger(store), FakeClock(T0)))
    w, consumer = _scripted_worker(engine)
    keep = Worker.with_config

    def forgetful(self: Worker, config: Any) -> Worker:
        new = keep(self, config)
        new._run_hooks = []
        return new

    monkeypatch.setattr(Worker, "with_config", forgetful)
    w2 = w.with_config(dataclasses.replace(w.config, retry=RetryPolicy(max_attempts=7)))
    assert not _serves(engine, w2, consumer), "the relay check cannot fail"
    assert engine.runner.policy == RetryPolicy(max_attempts=3)  # the stale policy it would use
