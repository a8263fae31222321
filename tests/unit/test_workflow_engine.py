"""The engine on a real store (SQLite; PostgreSQL when KWORKERS_PG_DSN is set) and an in-memory
broker (``Harness``): runs complete, crashes anywhere neither lose nor repeat a step, sagas
unwind, bad input is refused with its reason. Counts come from the append-only ledger the steps
write and from the run rows, read back from the store.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from kworkers.errors import ConfigError, DecodeError, NonRetryableError, RetryableError
from kworkers.idempotency import SqliteStore
from kworkers.idempotency.store import TransactionalStore
from kworkers.message import Headers, Message
from kworkers.retry_tiers import RetryPolicy
from kworkers.testing.ledger import Ledger
from kworkers.tracing import parse_traceparent
from kworkers.workflow import (
    Engine,
    ResultError,
    StepContext,
    UnknownRun,
    VersionMismatch,
    Workflow,
)
from kworkers.workflow.runner import ActivityRunner
from kworkers.workflow.state import ACTIVE, RunState
from tests.apps.workflow_checks import Crash, Harness, check, record_step

TOPIC = "wf.activities"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionalStore[Any]]:
    if request.param == "sqlite":
        s: Any = SqliteStore(str(tmp_path / "store.db"))
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
                     f"{name}_ledger_effects, {name}_ledger_deliveries", ())
    s.close()


def _prefix(store: Any) -> str:
    return getattr(store, "prefix", "kworkers_wf")


class Chaos:
    """Step behaviour a test turns on: crash mid-step, fail, or put the effect outside the
    checkpoint's transaction (the canary)."""

    def __init__(self, seed: int = 1, crash_mid_step: float = 0.0, fail: float = 0.0,
                 effect_in_txn: bool = True) -> None:
        import random

        self.rnd = random.Random(seed)
        self.crash_mid_step = crash_mid_step
        self.fail = fail
        self.effect_in_txn = effect_in_txn


def _pipeline(ledger: Ledger, chaos: Chaos, name: str = "pipeline",
              version: str | None = None) -> Workflow:
    wf = Workflow(name, version=version)

    def step(ctx: StepContext) -> dict[str, Any]:
        record_step(ledger, ctx, in_txn=chaos.effect_in_txn)
        if chaos.rnd.random() < chaos.fail:
            raise RetryableError("Flaky", "injected")
        if chaos.rnd.random() < chaos.crash_mid_step:
            raise Crash("killed mid-step, after its work")
        earlier = {k: ctx.results[k]["n"] for k in ctx.results}
        return {"n": len(earlier), "saw": earlier}

    for s in ("download", "embed", "index"):
        wf.add(step, name=s)
    return wf


def _engine(store: Any, *workflows: Workflow, **kw: Any) -> Engine:
    return Engine(store, list(workflows), topic=TOPIC, tables=_prefix(store), **kw)


def _ledger(store: Any) -> Ledger:
    return Ledger.on_store(store, table=_prefix(store) + "_ledger")


def _want_pipeline(ids: list[str]) -> tuple[dict[str, str], dict[str, int]]:
    return ({i: "completed" for i in ids},
            {f"{i}/{s}": 1 for i in ids for s in ("download", "embed", "index")})


def test_a_pipeline_runs_its_steps_in_order_and_each_reads_the_earlier_results(
        store: Any) -> None:
    ledger = _ledger(store)
    engine = _engine(store, _pipeline(ledger, Chaos()))
    h = Harness(engine)
    started = engine.start("pipeline", "doc-1", {"url": "file:///x"})
    assert started.created and started.status == "running"
    h.pump()
    run = engine.tables.run("doc-1")
    assert run is not None and run.status == "completed" and run.state.activity is None
    history = engine.tables.history("doc-1")
    assert [(s.activity_id, s.status, s.attempts) for s in history] == [
        ("download", "completed", 1), ("embed", "completed", 1), ("index", "completed", 1)]
    import json

    assert json.loads(history[2].result or "") == {"n": 2, "saw": {"download": 0, "embed": 1}}
    report = check(engine.tables, ledger, *_want_pipeline(["doc-1"]))
    assert report.ok, report.summary()
    assert h.delivered == 3
    m = engine.metrics
    assert m.workflow_runs.labels("pipeline", "completed")._value.get() == 1
    assert m.workflow_steps.labels("pipeline", "embed", "completed")._value.get() == 1


def test_the_records_carry_one_trace_from_step_to_step(store: Any) -> None:
    engine = _engine(store, _pipeline(_ledger(store), Chaos()))
    h = Harness(engine)
    sent: list[Headers] = []
    send = h.send

    def spy(topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        sent.append(headers)
        send(topic, key, value, headers)

    h.send = spy  # type: ignore[method-assign]
    tp = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    engine.start("pipeline", "doc-1", None, traceparent=tp)
    h.pump()
    parents = [parse_traceparent(dict(hs)["traceparent"]) for hs in sent]
    assert len(parents) == 3 and all(p is not None for p in parents)
    assert {p.trace_id for p in parents if p} == {"1" * 32}
    assert len({p.span_id for p in parents if p}) == 3  # each hop its own span


def test_starting_an_id_twice_is_one_run(store: Any) -> None:
    ledger = _ledger(store)
    other = Workflow("other").add(lambda c: 1, name="x")
    engine = _engine(store, _pipeline(ledger, Chaos()), other)
    h = Harness(engine)
    assert engine.start("pipeline", "doc-1", {"u": 1}).created
    again = engine.start("pipeline", "doc-1", {"u": 1})
    assert not again.created and again.status == "running"
    h.pump()
    assert engine.start("pipeline", "doc-1", {"u": 1}).status == "completed"
    assert len(engine.outbox.pending()) == 0
    assert check(engine.tables, ledger, *_want_pipeline(["doc-1"])).ok
    with pytest.raises(ConfigError, match="another input"):
        engine.start("pipeline", "doc-1", {"u": 2})
    with pytest.raises(ConfigError, match="already a run of 'pipeline'"):
        engine.start("other", "doc-1", {"u": 1})
    for bad in ("", "a/b", "x" * 201, "tab\there"):
        with pytest.raises(ConfigError, match="workflow id"):
            engine.start("pipeline", bad)
    with pytest.raises(ConfigError, match="unknown workflow 'nope'"):
        engine.start("nope", "doc-2")
    with pytest.raises(ConfigError, match="ResultTooLarge"):
        engine.start("pipeline", "doc-3", "x" * 300_000)


@pytest.mark.parametrize("seed", [1, 2])
def test_crashes_anywhere_neither_lose_nor_repeat_a_step(store: Any, seed: int) -> None:
    """Kills mid-step (after the step's work), after the checkpoint commits (before the
    offset), relays that die before marking rows sent, flaky steps: every run completes, every
    step's in-store effect is in the ledger once, and no step ran after it had completed."""
    ledger = _ledger(store)
    engine = _engine(store, _pipeline(ledger, Chaos(seed, crash_mid_step=0.3, fail=0.2)))
    h = Harness(engine, RetryPolicy(max_attempts=50), seed=seed, crash_after_commit=0.3,
                relay_loses_acks=0.3)
    ids = [f"doc-{i}" for i in range(20)]
    for i in ids:
        engine.start("pipeline", i, {"i": i})
    h.pump()
    report = check(engine.tables, ledger, *_want_pipeline(ids))
    assert report.ok, report.summary()
    assert h.crashes > 10 and h.delivered > 2 * 60  # the chaos happened
    assert engine.outbox.pending() == []


def test_canary_effects_outside_the_checkpoint_are_applied_twice(store: Any) -> None:
    ledger = _ledger(store)
    engine = _engine(store, _pipeline(ledger, Chaos(3, crash_mid_step=0.3, effect_in_txn=False)))
    h = Harness(engine, RetryPolicy(max_attempts=50), seed=3)
    ids = [f"doc-{i}" for i in range(10)]
    for i in ids:
        engine.start("pipeline", i)
    h.pump()
    report = check(engine.tables, ledger, *_want_pipeline(ids))
    assert not report.ok and report.wrong_count, report.summary()


class _CheckpointThenProduce(ActivityRunner):
    """Canary: the next activity is produced straight to Kafka after the checkpoint commits
    (no outbox row in its transaction); a crash between the two loses the hand-off."""

    harness: Harness
    crash: bool = True
    _later: tuple[bytes, bytes, Headers] | None = None

    def handoff(self, conn: Any, key: bytes, value: bytes, headers: Headers,
                not_before: float = 0.0) -> None:
        self._later = (key, value, headers)

    def __call__(self, msg: Message) -> None:
        self._later = None
        super().__call__(msg)
        later = cast("tuple[bytes, bytes, Headers] | None", self._later)  # handoff() set it?
        if later is not None:
            if self.crash:
                raise Crash("killed between the checkpoint and the produce")
            self.harness.send(self.topic, *later)


def test_canary_checkpoint_then_produce_loses_runs(store: Any) -> None:
    ledger = _ledger(store)
    engine = _engine(store, _pipeline(ledger, Chaos()))
    r = engine.runner
    variant = _CheckpointThenProduce(r.registry, r.store, r.tables, r.outbox, r.topic, r.clock,
                                     r.metrics, r.max_result_bytes, r.on_commit)
    engine.runner = variant
    h = Harness(engine, seed=4)
    variant.harness = h
    ids = [f"doc-{i}" for i in range(5)]
    for i in ids:
        engine.start("pipeline", i)
    h.pump()
    report = check(engine.tables, ledger, *_want_pipeline(ids))
    assert not report.ok and set(report.unfinished) == set(ids), report.summary()


def test_canary_without_the_pending_guard_steps_run_again(store: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RunState, "pending",
                        lambda self, activity_id: self.status in ACTIVE)
    ledger = _ledger(store)
    engine = _engine(store, _pipeline(ledger, Chaos()))
    h = Harness(engine, seed=5, relay_loses_acks=0.5)  # duplicates of every kind of record
    ids = [f"doc-{i}" for i in range(10)]
    for i in ids:
        engine.start("pipeline", i)
    h.pump()
    report = check(engine.tables, ledger, *_want_pipeline(ids))
    assert report.reruns, report.summary()


def _saga(ledger: Ledger, fail_refund: set[str] | None = None) -> Workflow:
    wf = Workflow("order")

    def effect(ctx: StepContext, what: str) -> None:
        key = f"{ctx.workflow_id}/{what}"
        ctx.apply_once(lambda conn: ledger.apply_in(conn, key))

    def refund_card(ctx: StepContext) -> None:
        if fail_refund is not None and ctx.workflow_id in fail_refund:
            raise NonRetryableError("RefundRejected", "the card issuer refused the refund")
        assert ctx.cause is not None and "ship" in ctx.cause
        assert ctx.result("charge_card") == {"charged": ctx.input["cents"]}
        effect(ctx, "refunded")

    def release_stock(ctx: StepContext) -> None:
        effect(ctx, "released")

    @wf.step(compensate=refund_card)
    def charge_card(ctx: StepContext) -> dict[str, int]:
        if ctx.input.get("declined"):
            raise NonRetryableError("CardDeclined", "insufficient funds")
        effect(ctx, "charged")
        return {"charged": ctx.input["cents"]}

    @wf.step(compensate=release_stock)
    def reserve_stock(ctx: StepContext) -> None:
        effect(ctx, "reserved")

    @wf.step
    def ship(ctx: StepContext) -> None:
        if ctx.input.get("undeliverable"):
            raise RetryableError("CarrierDown", "no carrier takes this address")
        effect(ctx, "shipped")

    return wf


def _orders() -> dict[str, dict[str, Any]]:
    orders: dict[str, dict[str, Any]] = {}
    for i in range(12):
        o: dict[str, Any] = {"cents": 100 + i}
        if i % 3 == 1:
            o["undeliverable"] = True
        if i % 4 == 3:
            o["declined"] = True
        orders[f"order-{i}"] = o
    return orders


def _want_saga(orders: dict[str, dict[str, Any]]) -> tuple[dict[str, str], dict[str, int]]:
    status, effects = {}, {}
    for oid, o in orders.items():
        charged = not o.get("declined")
        shipped = charged and not o.get("undeliverable")
        status[oid] = "completed" if shipped else "compensated"
        unwound = charged and not shipped
        for what, n in (("charged", charged), ("reserved", charged), ("shipped", shipped),
                        ("released", unwound), ("refunded", unwound)):
            effects[f"{oid}/{what}"] = int(n)
    return status, effects


def test_a_saga_unwinds_in_reverse_and_only_what_was_done(store: Any) -> None:
    ledger = _ledger(store)
    engine = _engine(store, _saga(ledger))
    h = Harness(engine, RetryPolicy(max_attempts=3), seed=6, crash_after_commit=0.3,
                relay_loses_acks=0.3)
    orders = _orders()
    for oid, o in orders.items():
        engine.start("order", oid, o)
    h.pump()
    report = check(engine.tables, ledger, *_want_saga(orders))
    assert report.ok, report.summary()
    assert h.dlq == []
    history = [s.activity_id for s in engine.tables.history("order-1")]
    assert history == ["charge_card", "reserve_stock", "ship", "compensate.reserve_stock",
                       "compensate.charge_card"]
    ship = engine.tables.history("order-1")[2]
    assert (ship.status, ship.attempts) == ("failed", 3)
    assert "CarrierDown" in (ship.error or "")
    run = engine.tables.run("order-1")
    assert run is not None and run.state.cause is not None and "CarrierDown" in run.state.cause


def test_a_compensation_that_keeps_failing_is_dead_lettered_then_redriven(store: Any) -> None:
    ledger = _ledger(store)
    fail = {"order-1"}
    engine = _engine(store, _saga(ledger, fail_refund=fail))
    h = Harness(engine, seed=7)
    engine.start("order", "order-1", {"cents": 5, "undeliverable": True})
    h.pump()
    run = engine.tables.run("order-1")
    assert run is not None and run.status == "failed"
    assert run.state.activity == "compensate.charge_card"
    assert "RefundRejected" in (run.state.error or "")
    [(msg, exc)] = h.dlq
    assert dict(msg.headers)["kw-workflow-id"] == b"order-1"
    assert "refused the refund" in str(exc)
    fail.clear()  # the operator fixed the cause, then redrives the dead letter
    h.dlq.clear()
    h.queue.append(msg._replace(attempt=1))
    h.pump()
    status, effects = _want_saga({"order-1": {"undeliverable": True}})
    assert check(engine.tables, ledger, status, effects).ok


def test_a_pipeline_step_failing_for_good_dead_letters_and_a_redrive_resumes(store: Any) -> None:
    ledger = _ledger(store)
    broken = {"on": True}
    wf = Workflow("pipeline")

    @wf.step
    def download(ctx: StepContext) -> str:
        record_step(ledger, ctx)
        return "text"

    @wf.step
    def embed(ctx: StepContext) -> None:
        if broken["on"]:
            raise RetryableError("ModelDown", "503")
        record_step(ledger, ctx)

    engine = _engine(store, wf)
    h = Harness(engine, RetryPolicy(max_attempts=2))
    engine.start("pipeline", "doc-1")
    h.pump()
    run = engine.tables.run("doc-1")
    assert run is not None and (run.status, run.state.activity) == ("failed", "embed")
    assert run.state.error == "step 'embed' failed: ModelDown: 503"
    [(msg, _exc)] = h.dlq
    broken["on"] = False
    h.queue.append(msg._replace(attempt=1))
    h.pump()
    want = {"doc-1/download": 1, "doc-1/embed": 1}
    assert check(engine.tables, ledger, {"doc-1": "completed"}, want).ok


@pytest.mark.parametrize(("ret", "error_type"), [
    ("x" * 2000, "ResultTooLarge"), ({"s": {1, 2}}, "ResultNotSerializable")])
def test_a_result_that_cannot_be_checkpointed_fails_the_step_with_the_reason(
        store: Any, ret: Any, error_type: str) -> None:
    ledger = _ledger(store)
    wf = Workflow("pipeline")

    @wf.step
    def big(ctx: StepContext) -> Any:
        record_step(ledger, ctx)
        return ret

    engine = _engine(store, wf, max_result_bytes=1024)
    h = Harness(engine)
    engine.start("pipeline", "doc-1")
    h.pump()
    [(_msg, exc)] = h.dlq
    assert isinstance(exc, ResultError) and exc.type == error_type
    [step] = engine.tables.history("doc-1")
    assert (step.status, step.attempts) == ("failed", 1)  # non-retryable: no second attempt
    assert error_type in (step.error or "")
    assert ledger.applications() == {}  # the effect rolled back with the checkpoint


def test_bad_records_are_refused_with_the_reason(store: Any) -> None:
    engine = _engine(store, _pipeline(_ledger(store), Chaos()))
    Harness(engine)
    from kworkers.workflow.codec import ActivityRecord

    def msg(rec: ActivityRecord) -> Message:
        key, value, headers = rec.encode(None)
        return Message(TOPIC, 0, 0, key, value, headers)

    with pytest.raises(UnknownRun, match="no workflow run 'ghost'"):
        engine.runner(msg(ActivityRecord("ghost", "download", "pipeline", "v")))
    with pytest.raises(DecodeError, match="NotAnActivity"):
        engine.runner(Message(TOPIC, 0, 0, b"k", b"v"))
    engine.start("pipeline", "doc-1")
    d = engine.registry.latest("pipeline")
    with pytest.raises(NonRetryableError, match="RunMismatch"):
        engine.runner(msg(ActivityRecord("doc-1", "download", "pipeline", "other")))
    with pytest.raises(VersionMismatch):
        with engine.store.atomic() as conn:
            conn.execute(engine.tables._sql("UPDATE {runs} SET version = 'gone'"), ())
        engine.runner(msg(ActivityRecord("doc-1", "download", "pipeline", d.version)))


def test_a_changed_step_list_refuses_old_runs_until_their_version_is_registered(
        store: Any) -> None:
    ledger = _ledger(store)
    old = _pipeline(ledger, Chaos(), version="1")
    engine = _engine(store, old)
    engine.start("pipeline", "doc-old")
    new = Workflow("pipeline", version="2").add(lambda ctx: record_step(ledger, ctx),
                                                 name="all_in_one")
    only_new = _engine(store, new)
    h = Harness(only_new)
    h.pump()
    [(msg, exc)] = h.dlq
    assert isinstance(exc, VersionMismatch) and "version '1'" in str(exc)
    both = _engine(store, _pipeline(ledger, Chaos(), version="1"), new)
    h2 = Harness(both)
    both.start("pipeline", "doc-new")  # new runs start on the last registered version
    h2.queue.append(msg._replace(attempt=1))  # the redrive
    h2.pump()
    want = {"doc-old/download": 1, "doc-old/embed": 1, "doc-old/index": 1,
            "doc-new/all_in_one": 1}
    assert check(both.tables, ledger, {"doc-old": "completed", "doc-new": "completed"}, want).ok


def test_async_steps_and_repeated_steps(store: Any) -> None:
    wf = Workflow("rep")

    async def fetch(ctx: StepContext) -> int:
        await asyncio.sleep(0)
        return 1

    def bump(ctx: StepContext) -> int:
        return int(max(ctx.results.values())) + 1

    wf.add(fetch).add(bump).add(bump).add(bump)
    engine = _engine(store, wf)
    h = Harness(engine)
    engine.start("rep", "r1")
    h.pump()
    history = engine.tables.history("r1")
    assert [(s.activity_id, s.result) for s in history] == [
        ("fetch", "1"), ("bump", "2"), ("bump.2", "3"), ("bump.3", "4")]


def test_a_retried_attempt_is_in_the_history(store: Any) -> None:
    calls = {"n": 0}
    wf = Workflow("flaky")

    @wf.step
    def once_flaky(ctx: StepContext) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RetryableError("Blip", "try again")
        return ctx.attempt

    engine = _engine(store, wf)
    h = Harness(engine)
    engine.start("flaky", "f1")
    h.pump()
    [step] = engine.tables.history("f1")
    assert (step.status, step.attempts, step.result) == ("completed", 2, "2")
    assert engine.metrics.workflow_steps.labels("flaky", "once_flaky", "retrying")._value.get() == 1


def test_an_engine_needs_a_sql_store_and_a_source_topic(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "s.db"))
    wf = Workflow("w").add(lambda ctx: None, name="x")
    with pytest.raises(ConfigError, match="SQL store"):
        Engine(object(), [wf], topic="t")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="source topic"):
        Engine(store, [wf], topic="t.dlq")
    with pytest.raises(ConfigError, match="at least one workflow"):
        Engine(store, [], topic="t")
    with pytest.raises(ConfigError, match="registered twice"):
        Engine(store, [wf, wf], topic="t")


def test_with_opentelemetry_one_trace_links_every_step_span(store: Any) -> None:
    """Each attempt's span (TracedInvoke, as ``Engine.worker`` sets up) is the parent of the
    next activity's record, so the spans of a run form one chain in one trace."""
    from kworkers.testing.otel import memory_tracing
    from kworkers.tracing import TracedInvoke, otel_span_starter

    provider, exporter = memory_tracing()
    invoke = TracedInvoke(otel_span_starter(provider))
    engine = _engine(store, _pipeline(_ledger(store), Chaos()))
    h = Harness(engine)
    tp = "00-" + "3" * 32 + "-" + "4" * 16 + "-01"
    engine.start("pipeline", "doc-1", None, traceparent=tp)
    h.pump(handler=lambda m: invoke(engine.runner, m))
    spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time)
    assert len(spans) == 3
    assert {format(s.context.trace_id, "032x") for s in spans} == {"3" * 32}
    parents = [format(s.parent.span_id, "016x") for s in spans]
    assert parents[0] == "4" * 16
    assert parents[1:] == [format(s.context.span_id, "016x") for s in spans[:2]]


def test_a_step_cut_off_by_a_crash_counts_as_an_attempt(store: Any) -> None:
    """The first attempt dies mid-step (it reports nothing), the redelivery completes it: the
    history shows 2 attempts, and ``running`` in between (it used to show 1)."""
    calls = {"n": 0}
    wf = Workflow("cut")
    seen: list[tuple[str, int]] = []

    @wf.step
    def slow(ctx: StepContext) -> int:
        calls["n"] += 1
        rows = engine.tables.history("c1")
        seen.append((rows[0].status, rows[0].attempts) if rows else ("no row", 0))
        if calls["n"] == 1:
            raise Crash("killed mid-step")
        return ctx.attempt

    engine = _engine(store, wf)
    h = Harness(engine)
    engine.start("cut", "c1")
    h.pump()
    assert h.crashes == 1
    [step] = engine.tables.history("c1")
    assert (step.status, step.attempts, step.result) == ("completed", 2, "1")
    assert seen == [("running", 1), ("running", 2)]  # each start counted before the step ran
