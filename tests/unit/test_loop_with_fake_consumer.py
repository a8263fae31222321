"""The poll loop against a scripted consumer: exact commit sequences, fencing, no re-runs.

A fake consumer here is not a mocked broker: these are unit tests of the loop's own logic
(the same scenarios run against the real broker in tests/integration and tests/faults). The
worker is built through its front door, ``Worker(consumer=..., sender=...)``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import pytest

from kworkers import ConfigError, Worker
from kworkers.consumer.commit import CommitPolicy
from kworkers.consumer.committer import Committer
from kworkers.consumer.ports import Delivered
from kworkers.consumer.processor import Processor
from kworkers.message import Headers, Message
from kworkers.metrics import Metrics

TP = tuple[str, int]


class Retryable(Exception):
    pass


class Permanent(Exception):
    pass


class Rebalancing(Exception):
    pass


class ScriptedConsumer:
    def __init__(self, records: list[Message],
                 commit_script: Sequence[type[Exception] | None],
                 group: str = "g"):
        self.group = group
        self.records = list(records)
        self.commit_script = list(commit_script)
        self.commits: list[tuple[dict[TP, int], str]] = []
        self.results: list[tuple[dict[TP, int], BaseException | None]] = []
        self.paused: set[TP] = set()
        self.on_assign: Callable[[list[TP]], None] | None = None
        self.on_revoke: Callable[[list[TP]], None] | None = None
        self.closed = False
        self.lock = threading.Lock()
        #: subscribe waits for it, so a test can set seams on the processor before any record
        self.go = threading.Event()

    def subscribe(self, topics: Iterable[str], on_assign: Callable[[list[TP]], None],
                  on_revoke: Callable[[list[TP]], None],
                  on_lost: Callable[[list[TP]], None]) -> None:
        self.go.wait(30)
        self.on_assign, self.on_revoke = on_assign, on_revoke
        on_assign(sorted({(m.topic, m.partition) for m in self.records}))

    def poll_batch(self, n: int, timeout: float) -> list[Message]:
        with self.lock:
            out = [m for m in self.records[:n] if (m.topic, m.partition) not in self.paused]
            self.records = [m for m in self.records if m not in out]
        if not out:
            time.sleep(min(timeout, 0.01))
        return out

    def commit_async(self, positions: dict[TP, int]) -> None:
        """A commit sent; its scripted outcome is reported with the next results."""
        step = self.commit_script.pop(0) if self.commit_script else None
        self.commits.append((dict(positions), "ok" if step is None else step.__name__))
        self.results.append((dict(positions), None if step is None else step("injected")))

    def commit_results(self) -> list[tuple[dict[TP, int], BaseException | None]]:
        out, self.results = self.results, []
        return out

    def group_metadata(self) -> object:
        return ("group-metadata", self.group)

    def coordinator_contact(self) -> float | None:
        return None

    def session_timeout(self) -> float | None:
        return None

    def pause(self, tps: list[TP]) -> None:
        self.paused |= set(tps)

    def resume(self, tps: list[TP]) -> None:
        self.paused -= set(tps)

    def watermarks(self, tp: TP, timeout: float) -> tuple[int, int]:
        raise LookupError("nothing cached")

    def caught_up(self, tp: TP) -> bool:
        return False  # unsure: backpressure pauses, never holds

    def position(self, tps: list[TP]) -> dict[TP, int | None]:
        return dict.fromkeys(tps)

    def close(self) -> None:
        self.closed = True

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, Retryable)

    def is_rebalancing(self, exc: BaseException) -> bool:
        return isinstance(exc, Rebalancing)


class RecordingSender:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None]] = []

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers, done: Delivered) -> None:
        self.sent.append((topic, value))
        f: Future[None] = Future()
        f.add_done_callback(lambda x: done(x.exception()))
        f.set_result(None)


def _msgs(n: int, partition: int = 0) -> list[Message]:
    return [Message("t", partition, o, b"k", str(o).encode()) for o in range(n)]


def _idle(group: str) -> ScriptedConsumer:
    c = ScriptedConsumer([], [], group)
    c.go.set()
    return c


class _Harness:
    """A worker on a scripted main consumer (the retry group gets an empty one)."""

    def __init__(self, consumer: ScriptedConsumer, handler: Callable[[Message], None],
                 **cfg: Any) -> None:
        self.consumer = consumer
        self.worker = Worker(
            topics=["t"], group_id="g", concurrency=2,
            consumer=lambda group: consumer if group == "g" else _idle(group),
            **{"sender": RecordingSender(), **cfg})
        self.worker.handler(handler)
        self.sleeps: list[float] = []
        self.thread = threading.Thread(target=self.worker.run, args=(False,), daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.worker.loops and time.monotonic() < deadline:
            time.sleep(0.001)
        loop = self.worker.loops[0]
        assert isinstance(loop, Processor) and isinstance(loop.committer, Committer)
        loop.committer.waits = self.sleeps  # waits in loop time, not sleeps
        self.consumer.go.set()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def _loop(consumer: ScriptedConsumer, handler: Callable[[Message], None],
          **cfg: Any) -> tuple[_Harness, list[float], Metrics]:
    h = _Harness(consumer, handler, **cfg)
    return h, h.sleeps, h.worker.metrics


def _run_until(h: _Harness, cond: Callable[[], bool]) -> None:
    h.start()
    deadline = time.monotonic() + 30
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    h.stop()


def _counting() -> tuple[Counter[int], Callable[[Message], None]]:
    calls: Counter[int] = Counter()

    def handle(msg: Message) -> None:
        calls[msg.offset] += 1

    return calls, handle


@pytest.mark.parametrize(
    ("script", "expected", "uncertain", "failures"),
    [
        ([Retryable] * 4, ["Retryable"] * 4 + ["ok"], 0, 0),  # success on the 5th attempt
        ([Retryable] * 5, ["Retryable"] * 5, 0, 1),  # five retryable: give up
        ([Permanent], ["Permanent"], 0, 1),  # permanent on the first attempt
        ([Retryable, Permanent], ["Retryable", "Permanent"], 1, 0),  # uncertain
    ],
)
def test_commit_failures_are_retried_in_place_without_rerunning_handlers(
    script: list[type[Exception]], expected: list[str], uncertain: int, failures: int
) -> None:
    consumer = ScriptedConsumer(_msgs(10), script)
    calls, handle = _counting()
    loop, sleeps, metrics = _loop(consumer, handle,
                                  commit=CommitPolicy(interval_s=3600, max_completions=10))
    _run_until(loop, lambda: len(consumer.commits) >= len(expected))
    first = [outcome for _pos, outcome in consumer.commits[: len(expected)]]
    assert first == expected
    # every attempt of the sequence carried the same offsets
    assert {tuple(p.items()) for p, _ in consumer.commits[: len(expected)]} == {(( ("t", 0), 10),)}
    waits = [0.1, 0.2, 0.4, 0.8][: max(0, len([e for e in expected if e == "Retryable"]))]
    if "Permanent" in expected and "Retryable" not in expected:
        waits = []
    assert sleeps[: len(waits)] == waits
    assert max(calls.values()) == 1 and len(calls) == 10  # no handler ran again
    assert metrics.commit_uncertain.labels("g")._value.get() == uncertain
    assert metrics.commit_failures.labels("g")._value.get() >= failures


def test_revoke_commits_what_completed_and_fences_late_results() -> None:
    consumer = ScriptedConsumer(_msgs(3), [])
    release = threading.Event()
    started = threading.Event()
    calls: Counter[int] = Counter()

    def handle(msg: Message) -> None:
        calls[msg.offset] += 1
        if msg.offset == 1:
            started.set()
            release.wait(10)

    loop, _sleeps, metrics = _loop(consumer, handle, revoke_timeout=0.3)
    loop.start()
    assert started.wait(10)
    # revoke while offset 1 is still running: only offset 0 may be committed
    assert consumer.on_revoke is not None
    consumer.on_revoke([("t", 0)])
    assert consumer.commits[-1] == ({("t", 0): 1}, "ok")
    release.set()
    time.sleep(0.3)
    loop.stop()
    assert calls[2] == 0  # queued behind the revoke: never dispatched
    assert all(p != {("t", 0): 2} for p, _ in consumer.commits)  # the late result was fenced
    assert metrics.fenced.labels("g")._value.get() >= 1


def test_backpressure_pauses_and_resumes_a_partition() -> None:
    consumer = ScriptedConsumer(_msgs(40), [])
    gate = threading.Event()
    paused_seen: list[bool] = []

    def handle(msg: Message) -> None:
        if msg.offset == 0:
            gate.wait(10)

    loop, _sleeps, _metrics = _loop(consumer, handle, max_in_flight_per_partition=10,
                                    consume_batch=10)
    loop.start()
    deadline = time.monotonic() + 10
    while ("t", 0) not in consumer.paused and time.monotonic() < deadline:
        time.sleep(0.01)
    paused_seen.append(("t", 0) in consumer.paused)
    gate.set()
    deadline = time.monotonic() + 10
    while (consumer.records or ("t", 0) in consumer.paused) and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.stop()
    assert paused_seen == [True]
    assert not consumer.records  # resumed and drained


def test_a_graceful_stop_finishes_started_work_only_and_commits_past_it() -> None:
    consumer = ScriptedConsumer(_msgs(200), [])
    started, release = threading.Event(), threading.Event()
    calls: Counter[int] = Counter()

    def handle(msg: Message) -> None:
        calls[msg.offset] += 1
        if msg.offset == 3:
            started.set()
            release.wait(10)

    h, _sleeps, _metrics = _loop(consumer, handle, consume_batch=200)
    h.start()
    assert started.wait(10)  # offsets 4..199 are fetched and queued behind offset 3
    stopper = threading.Thread(target=h.stop)
    stopper.start()
    time.sleep(0.2)  # the stop is under way while offset 3 still runs
    release.set()
    stopper.join(30)
    assert sorted(calls) == [0, 1, 2, 3] and max(calls.values()) == 1  # no queued record ran
    assert consumer.commits[-1] == ({("t", 0): 4}, "ok")  # the started record is committed
    assert consumer.closed


def test_a_graceful_stop_does_not_wait_past_the_message_deadline() -> None:
    consumer = ScriptedConsumer(_msgs(5), [])
    started, release = threading.Event(), threading.Event()

    def handle(msg: Message) -> None:
        if msg.offset == 1:
            started.set()
            release.wait(30)  # far slower than its deadline

    h, _sleeps, _metrics = _loop(consumer, handle, message_timeout=0.3, drain_timeout=30)
    h.start()
    assert started.wait(10)
    h.stop()  # returns although offset 1 is still running: the deadline bounds the wait
    release.set()
    assert consumer.commits[-1][0] == {("t", 0): 1}  # offset 1 is left to the next owner


def test_inline_execution_runs_handlers_on_the_poll_thread_and_keeps_the_deadline() -> None:
    consumer = ScriptedConsumer(_msgs(5), [])
    threads: set[str] = set()
    sender = RecordingSender()
    idle = _idle("g.retry")
    consumer.go.set()
    w = Worker(topics=["t"], group_id="g", sender=sender, execution="inline",
               message_timeout=0.2, consumer=lambda g: consumer if g == "g" else idle)

    @w.handler
    def handle(msg: Message) -> None:
        threads.add(threading.current_thread().name)
        if msg.offset == 2:
            time.sleep(0.4)  # past its deadline: a TimeoutError attempt when it returns

    t = threading.Thread(target=w.run, args=(False,), name="poll", daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not any(p == {("t", 0): 5} for p, _ in consumer.commits) and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    t.join(30)
    assert threads == {"poll"}
    assert sender.sent == [("t.retry.1s", b"2")]


def test_inline_execution_refuses_an_async_handler() -> None:
    consumer = ScriptedConsumer([], [])
    w = Worker(topics=["t"], group_id="g", execution="inline", sender=RecordingSender(),
               consumer=lambda g: consumer)

    @w.handler
    async def handle(msg: Message) -> None:
        pass

    with pytest.raises(ConfigError, match="inline"):
        w.run(install_signals=False)


def test_an_open_breaker_holds_records_and_they_all_run_once_it_closes() -> None:
    from kworkers import BreakerPolicy

    consumer = ScriptedConsumer(_msgs(300), [])
    down = threading.Event()
    down.set()
    ok: Counter[int] = Counter()

    def handle(msg: Message) -> None:
        if down.is_set():
            raise ConnectionError("down")
        ok[msg.offset] += 1

    h, _sleeps, metrics = _loop(consumer, handle, consume_batch=50, breaker=BreakerPolicy(
        min_attempts=5, window_s=5, cooldown_s=0.2, max_cooldown_s=0.4))
    h.start()
    deadline = time.monotonic() + 10
    while metrics.breaker_state.labels("g")._value.get() != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metrics.breaker_state.labels("g")._value.get() == 2  # open
    time.sleep(0.5)
    down.clear()
    deadline = time.monotonic() + 20
    while not any(p == {("t", 0): 300} for p, _ in consumer.commits) and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    h.stop()
    failed = len(h.worker._sender.sent)  # type: ignore[union-attr]
    assert failed < 300 // 10  # held, not flooded into the tiers
    assert len(ok) + failed == 300 and max(ok.values()) == 1


def test_a_commit_refused_by_a_rebalance_spends_no_waits_on_the_poll_thread() -> None:
    consumer = ScriptedConsumer(_msgs(10), [Rebalancing])
    _calls, handle = _counting()
    h, sleeps, metrics = _loop(consumer, handle,
                               commit=CommitPolicy(interval_s=3600, max_completions=10))
    _run_until(h, lambda: len(consumer.commits) >= 1)
    assert consumer.commits[0] == ({("t", 0): 10}, "Rebalancing")
    assert sleeps == []  # deferred at once: no 100/200/400 ms on the poll thread
    assert metrics.commit_deferred.labels("g")._value.get() == 1
    assert consumer.commits[-1] == ({("t", 0): 10}, "ok")  # a later commit carried it


def test_a_deferred_commit_is_tried_again_when_nothing_completes_any_more() -> None:
    """The end of a backlog: every record done, the last periodic commit refused by a
    rebalance. The next interval must try again although no record completes after it (the
    demo once waited 240 s for such a commit)."""
    consumer = ScriptedConsumer(_msgs(10), [Rebalancing])
    _calls, handle = _counting()
    h, _sleeps, _metrics = _loop(consumer, handle, commit=CommitPolicy(interval_s=0.05))
    h.start()
    deadline = time.monotonic() + 30  # bounds a hang only
    while ({("t", 0): 10}, "ok") not in consumer.commits and time.monotonic() < deadline:
        time.sleep(0.01)
    while_running = list(consumer.commits)  # before stop(): its drain would commit anyway
    h.stop()
    assert while_running[0][1] == "Rebalancing"
    assert ({("t", 0): 10}, "ok") in while_running


class _SharedHolder:
    """Canary: the activity context in one place shared by every task (not a context
    variable), as a runtime that set it outside the record's own task would have it."""

    def __init__(self) -> None:
        self.value: object = None

    def set(self, value: object) -> None:
        self.value = value

    def get(self, default: object = None) -> object:
        return self.value


@pytest.mark.parametrize("shared", [False, True], ids=["context", "canary-shared"])
def test_async_handlers_interleaved_across_lanes_each_see_their_own_record(
        shared: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The activity context of an async handler is set when its coroutine is made and read
    after it awaited, while other lanes' handlers ran: each must still see its own record."""
    import asyncio

    from kworkers import activity

    if shared:
        monkeypatch.setattr(activity, "_current", _SharedHolder())
    records = [Message("t", p, o, b"k", b"v", activity.id_headers(f"wf-{p}-{o}", "a"))
               for o in range(20) for p in range(4)]
    consumer = ScriptedConsumer(records, [])
    seen: list[tuple[str, str]] = []
    failed: list[BaseException] = []

    async def handle(msg: Message) -> None:
        for _ in range(3):
            await asyncio.sleep(0)  # let the other lanes' handlers run meanwhile
        try:
            seen.append((f"wf-{msg.partition}-{msg.offset}/a", activity.idempotency_key()))
        except BaseException as exc:  # the canary may find no context at all
            failed.append(exc)
            raise

    h = _Harness(consumer, handle)  # type: ignore[arg-type]
    _run_until(h, lambda: len(seen) + len(failed) >= len(records))
    wrong = [(want, got) for want, got in seen if want != got]
    if shared:
        assert wrong or failed, "the canary's shared context went unnoticed"
        return
    assert not failed and len(seen) == len(records), (failed, len(seen))
    assert not wrong, wrong[:5]


def test_an_async_deadline_runs_the_call_in_its_lanes_task_and_still_fires() -> None:
    """A ``message_timeout`` bounds an async call in the lane's own task (the runtime's one
    deadline sweep), not in a task made per call as ``asyncio.wait_for`` makes on Python 3.11:
    a task, its context and a future per record in flight cost 40 % of the rate at 5,000 in
    flight (issue #50). The record past its deadline is still a ``TimeoutError`` attempt,
    handed off."""
    import asyncio

    consumer = ScriptedConsumer(_msgs(10), [])
    drivers: list[str] = []

    async def handle(msg: Message) -> None:
        task = asyncio.current_task()
        assert task is not None
        drivers.append(task.get_coro().__qualname__)  # type: ignore[union-attr]
        if msg.offset == 3:
            await asyncio.sleep(30)  # past its deadline

    sender = RecordingSender()
    h = _Harness(consumer, handle, message_timeout=0.2, sender=sender)  # type: ignore[arg-type]
    _run_until(h, lambda: len(drivers) >= 10 and bool(sender.sent)
               and any(p.get(("t", 0)) == 10 for p, _ in consumer.commits))
    assert len(drivers) == 10, drivers
    assert {d.rsplit(".", 1)[-1] for d in drivers} == {"_drive"}, drivers
    assert [v for _t, v in sender.sent] == [b"3"], sender.sent  # only the late one, handed off


@pytest.mark.parametrize("where", ["loop", "thread"])
def test_a_heartbeat_extends_an_async_calls_deadline(where: str) -> None:
    """``activity.record_heartbeat`` extends the message deadline (README, docs/CONFIG.md): an
    async call that heartbeats runs past ``message_timeout`` as a sync one does, whether the
    heartbeat comes from the handler's coroutine or from a thread it awaits
    (``asyncio.to_thread``); the one that stops heartbeating is still cut off."""
    import asyncio

    from kworkers import activity

    consumer = ScriptedConsumer(_msgs(3), [])
    finished: list[int] = []

    async def handle(msg: Message) -> None:
        beats = 10 if msg.offset == 1 else 0  # offset 1: 1 s of work, beating every 0.1 s
        for _ in range(beats):
            await asyncio.sleep(0.1)
            if where == "loop":
                activity.record_heartbeat(b"ckpt")
            else:
                await asyncio.to_thread(activity.record_heartbeat, b"ckpt")
        if msg.offset == 2:
            await asyncio.sleep(30)  # no heartbeat: past its deadline
        finished.append(msg.offset)

    sender = RecordingSender()
    h = _Harness(consumer, handle, message_timeout=0.4, sender=sender)  # type: ignore[arg-type]
    _run_until(h, lambda: bool(sender.sent)
               and any(p.get(("t", 0)) == 3 for p, _ in consumer.commits))
    assert finished == [0, 1], (finished, sender.sent)
    assert [v for _t, v in sender.sent] == [b"2"], sender.sent


class _FailureSender(RecordingSender):
    """Records each hand-off's error type and message too."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[tuple[bytes | None, str, str]] = []

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers, done: Delivered) -> None:
        from kworkers.retry_tiers.headers import ERROR_MESSAGE, ERROR_TYPE

        got = dict(headers)
        self.errors.append((value, got[ERROR_TYPE].decode(), got[ERROR_MESSAGE].decode()))
        super().send(topic, key, value, headers, done)


def test_an_async_deadline_swallowed_or_not_leaves_the_next_calls_deadline_whole() -> None:
    """The deadline sweep's edges, one lane in order: a handler that swallows the cancel and
    returns succeeds; one that swallows it and raises fails with its own error; a handler's
    own ``TimeoutError`` is its own, not a deadline; and the lane's next call past its
    deadline is still cut off (a cancel left counted on the task would never fire again)."""
    import asyncio

    consumer = ScriptedConsumer(_msgs(4), [])
    finished: list[int] = []

    async def handle(msg: Message) -> None:
        if msg.offset in (0, 1):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                if msg.offset == 1:
                    raise ValueError("raised after the cancel") from None
        elif msg.offset == 2:
            raise TimeoutError("the handler's own timeout")
        else:
            await asyncio.sleep(30)
        finished.append(msg.offset)

    sender = _FailureSender()
    h = _Harness(consumer, handle, message_timeout=0.2, sender=sender)  # type: ignore[arg-type]
    _run_until(h, lambda: len(sender.errors) >= 3
               and any(p.get(("t", 0)) == 4 for p, _ in consumer.commits))
    assert finished == [0], (finished, sender.errors)
    assert sender.errors == [
        (b"1", "ValueError", "raised after the cancel"),
        (b"2", "TimeoutError", "the handler's own timeout"),
        (b"3", "TimeoutError", "handler exceeded its 0.2s deadline")], sender.errors
