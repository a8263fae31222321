"""The exactly-once loop against a scripted consumer and a transaction double.

The double keeps an append-only log of what each transaction held and how it ended; every
check reads that log (what a read_committed reader would see: committed transactions only),
never the worker's counters. The broker-level proof is tests/faults/test_exactly_once.py.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from kworkers import ConfigError, Worker, WorkerFailed, activity
from kworkers.consumer import outputs as outputs_module
from kworkers.consumer.commit import CommitPolicy
from kworkers.consumer.outputs import Entry, Output, OutputBuffer, Sink, of_batch
from kworkers.consumer.ports import SendErrorKind
from kworkers.errors import TransactionAborted, TransactionFailed
from kworkers.message import Headers, Message
from tests.unit.test_loop_with_fake_consumer import RecordingSender, ScriptedConsumer, _idle

TP = tuple[str, int]


class Refused(Exception):
    """A produce the broker refuses for good (too large, not authorised)."""


@dataclass
class Txn:
    outputs: list[tuple[str, bytes | None, bytes | None, Headers]] = field(default_factory=list)
    positions: dict[TP, int] = field(default_factory=dict)
    metadata: object = None
    ended: str = "open"  # committed | aborted | failed


class FakeTransactions:
    """``TransactionPort`` double. ``script`` says how each commit ends: ``None`` commits,
    ``"abort"`` raises TransactionAborted, ``"lost"`` / ``"landed"`` raise TransactionFailed
    after not committing / committing (the uncertain outcome ``committed`` then tells).
    Produces to a topic in ``refuse`` are refused for good."""

    def __init__(self, script: list[str | None] | None = None,
                 refuse: frozenset[str] = frozenset()) -> None:
        self.script = list(script or [])
        self.refuse = refuse
        self.log: list[Txn] = []
        self.committed_offsets: dict[TP, int] = {}
        self.renewed = 0
        self.lock = threading.Lock()
        #: topics that do not exist (``missing``), and every topic asked for
        self.absent: set[str] = set()
        self.asked: list[str] = []

    def init(self, timeout: float) -> None:
        pass

    def begin(self) -> None:
        with self.lock:
            self.log.append(Txn())

    def produce(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers,
                on_error: Callable[[BaseException], None]) -> None:
        if topic in self.refuse:
            on_error(Refused(f"{topic} refuses it"))
            return
        self.log[-1].outputs.append((topic, key, value, headers))

    def send_offsets(self, positions: dict[TP, int], group_metadata: object,
                     timeout: float) -> None:
        self.log[-1].positions = dict(positions)
        self.log[-1].metadata = group_metadata

    def _land(self) -> None:
        txn = self.log[-1]
        txn.ended = "committed"
        self.committed_offsets.update(txn.positions)

    def commit(self, timeout: float) -> None:
        step = self.script.pop(0) if self.script else None
        if step is None:
            self._land()
        elif step == "abort":
            raise TransactionAborted("injected abort")
        elif step == "landed":
            self._land()
            raise TransactionFailed("injected: the commit's answer was lost")
        elif step == "stale":  # the group moved on: abortable
            raise TransactionAborted("injected: ILLEGAL_GENERATION", fenced=True)
        elif step == "producer-fenced":
            self.log[-1].ended = "failed"
            raise TransactionFailed("injected: PRODUCER_FENCED", fenced=True)
        else:
            self.log[-1].ended = "failed"
            raise TransactionFailed("injected: the producer failed mid-commit")

    def abort(self, timeout: float) -> None:
        self.log[-1].ended = "aborted"

    def renew(self, timeout: float) -> None:
        self.renewed += 1

    def committed(self, group: str, tps: list[TP], timeout: float) -> dict[TP, int | None]:
        return {tp: self.committed_offsets.get(tp) for tp in tps}

    def classify(self, exc: BaseException) -> SendErrorKind:
        return "permanent" if isinstance(exc, Refused) else "transient"

    def missing(self, topics: list[str], timeout: float) -> dict[str, str]:
        with self.lock:
            self.asked.extend(topics)
            return {t: "Broker: Unknown topic or partition" for t in topics if t in self.absent}

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ what a reader sees

    def visible(self) -> list[tuple[str, bytes | None, bytes | None, Headers]]:
        return [o for t in self.log if t.ended == "committed" for o in t.outputs]

    def beyond_position(self) -> list[str]:
        """Committed outputs of records at or past the position their transaction committed:
        a crash right after it would run those records again and duplicate them."""
        bad = []
        for t in self.log:
            if t.ended != "committed":
                continue
            for topic, _k, value, hs in t.outputs:
                src = dict(hs).get("src")
                if src is None:
                    continue
                part, off = (int(x) for x in src.decode().split("@"))
                pos = t.positions.get(("t", part))
                if pos is None or off >= pos:
                    bad.append(f"{topic}:{value!r} (record {part}@{off}, position {pos})")
        return bad


def _msgs(n: int, partitions: int = 1) -> list[Message]:
    return [Message("t", p, o, f"k{o}".encode(), f"{p}@{o}".encode())
            for o in range(n) for p in range(partitions)]


def _one_output(msg: Message) -> None:
    activity.produce("out", msg.value, key=msg.key,
                     headers={"src": f"{msg.partition}@{msg.offset}"})


def _run(records: list[Message], handler: Callable[..., Any], txns: FakeTransactions,
         done: Callable[[FakeTransactions], bool], **cfg: Any) -> Worker:
    return _run_worker(records, handler, lambda: done(txns), guarantee="exactly_once",
                       transactions=lambda group: txns if group == "g" else FakeTransactions(),
                       **cfg)


def _run_worker(records: list[Message], handler: Callable[..., Any],
                done: Callable[[], bool], consumer: ScriptedConsumer | None = None,
                batch: int | None = None, box: list[Worker] | None = None,
                **kw: Any) -> Worker:
    """A worker on a scripted consumer until ``done()`` (at most 30 s), then stopped;
    ``box`` gets the worker before it runs (for a ``done`` that reads it)."""
    consumer = consumer or ScriptedConsumer(records, [])
    scripted = consumer
    worker = Worker(topics=["t"], group_id="g", concurrency=4,
                    consumer=lambda group: scripted if group == "g" else _idle(group), **kw)
    if box is not None:
        box.append(worker)
    if batch is None:
        worker.handler(handler)
    else:
        worker.batch_handler(max_size=batch)(handler)

    def run() -> None:
        with contextlib.suppress(WorkerFailed):  # a test that wants it reads worker.fault
            worker.run(False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    consumer.go.set()
    deadline = time.monotonic() + 30
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()
    return worker


def _settled(n: int, partitions: int = 1) -> Callable[[FakeTransactions], bool]:
    def check(txns: FakeTransactions) -> bool:
        with txns.lock:
            return all(txns.committed_offsets.get(("t", p)) == n for p in range(partitions))
    return check


def _values(txns: FakeTransactions, topic: str = "out") -> Counter[bytes | None]:
    return Counter(v for t, _k, v, _h in txns.visible() if t == topic)


def test_each_record_has_exactly_one_committed_output_and_its_offset_with_it() -> None:
    txns = FakeTransactions()
    _run(_msgs(40, 2), _one_output, txns, _settled(40, 2))
    seen = _values(txns)
    assert seen == Counter(m.value for m in _msgs(40, 2))  # each input once, nothing else
    assert not txns.beyond_position()
    assert txns.committed_offsets == {("t", 0): 40, ("t", 1): 40}
    assert all(t.metadata is not None for t in txns.log)  # the group's, for the fence


def _slow_two(txns: FakeTransactions, **cfg: object) -> None:
    """Offsets 1 and 5 are slow; the others finish first. 1 is let go once they did, so the
    position jumps to 5 while the outputs of 6..9 are held; 5 once that committed."""
    first, second = threading.Event(), threading.Event()
    finished: list[int] = []

    def handler(msg: Message) -> None:
        if msg.offset in (1, 5):
            (first if msg.offset == 1 else second).wait(10)
        _one_output(msg)
        finished.append(msg.offset)

    def done(t: FakeTransactions) -> bool:
        if not first.is_set() and len(finished) == 8:
            time.sleep(0.5)  # their outputs reach the buffer
            first.set()
        if first.is_set() and not second.is_set():
            with t.lock:
                if t.committed_offsets.get(("t", 0)) == 5:
                    second.set()
        return _settled(10)(t)

    _run(_msgs(10), handler, txns, done, commit=CommitPolicy(interval_s=0.01), ordering="key",
         **cfg)
    assert any(t.positions == {("t", 0): 5} for t in txns.log), "position 5 never committed"


def test_a_record_finished_ahead_of_a_slow_one_waits_for_it() -> None:
    """No committed transaction may carry the outputs of 6..9 before its position passes
    them (a crash right after it would run them again: duplicates)."""
    txns = FakeTransactions()
    _slow_two(txns)
    assert not txns.beyond_position()
    assert _values(txns) == Counter(m.value for m in _msgs(10))


def test_canary_a_buffer_that_ignores_the_position_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same run with a buffer that hands over every entry it holds: caught."""
    original = OutputBuffer.take

    def take_all(self: OutputBuffer, part: object, below: int) -> list[Entry]:
        return original(self, part, 1 << 62)

    monkeypatch.setattr(OutputBuffer, "take", take_all)
    txns = FakeTransactions()
    _slow_two(txns)
    assert txns.beyond_position(), "the canary was not caught: the check cannot fail"


def test_an_aborted_transaction_is_sent_again_without_rerunning_its_records() -> None:
    calls: Counter[int] = Counter()

    def handler(msg: Message) -> None:
        calls[msg.offset] += 1
        _one_output(msg)

    txns = FakeTransactions(script=["abort", "abort"])
    _run(_msgs(12), handler, txns, _settled(12))
    assert [t.ended for t in txns.log][:2] == ["aborted", "aborted"]
    assert _values(txns) == Counter(m.value for m in _msgs(12))
    assert set(calls.values()) == {1} and len(calls) == 12
    assert not txns.beyond_position()


@pytest.mark.parametrize("outcome", ["lost", "landed"])
def test_an_uncertain_commit_is_decided_by_the_committed_offsets(outcome: str) -> None:
    txns = FakeTransactions(script=[outcome])
    _run(_msgs(8), _one_output, txns, _settled(8))
    assert txns.renewed >= 1  # a new producer under the same id ended it first
    assert _values(txns) == Counter(m.value for m in _msgs(8))  # once: not lost, not doubled
    assert not txns.beyond_position()


def test_an_output_refused_for_good_dead_letters_its_record_in_the_next_transaction() -> None:
    def handler(msg: Message) -> None:
        activity.produce("forbidden" if msg.offset == 3 else "out", msg.value,
                         headers={"src": f"{msg.partition}@{msg.offset}"})

    txns = FakeTransactions(refuse=frozenset({"forbidden"}))
    _run(_msgs(6), handler, txns, _settled(6))
    assert _values(txns) == Counter(m.value for m in _msgs(6) if m.offset != 3)
    dead = [(t, v) for t, _k, v, _h in txns.visible() if t.endswith("dlq")]
    assert dead == [("t.dlq", b"0@3")], txns.visible()
    assert not _values(txns, "forbidden")


class Boom(Exception):
    pass


def _fails_at_2(msg: Message) -> None:
    _one_output(msg)
    if msg.offset == 2:
        raise Boom("fails after producing")


def test_a_failed_attempt_sends_nothing_and_its_retry_goes_with_the_offset() -> None:
    handler = _fails_at_2
    txns = FakeTransactions()
    _run(_msgs(5), handler, txns, _settled(5))
    assert _values(txns) == Counter(m.value for m in _msgs(5) if m.offset != 2)
    tiers = [(t, v) for t, _k, v, _h in txns.visible() if t != "out"]
    assert len(tiers) == 1 and tiers[0][1] == b"0@2", tiers  # the tier record, in a txn


# ---------------------------------------------------------------------- outputs, pure


def _m(offset: int) -> Message:
    return Message("t", 0, offset, None, b"")


def test_batch_outputs_belong_to_their_record_or_ride_with_the_last_success() -> None:
    batch = [_m(o) for o in range(4)]
    sink = Sink()
    sink.calling(batch)
    sink.add(Output("o", None, b"of-1", record=batch[1]))
    sink.add(Output("o", None, b"of-2", record=batch[2]))
    sink.add(Output("o", None, b"batch"))
    failed: dict[Message, BaseException] = {batch[2]: ValueError(), batch[3]: ValueError()}
    got = [(m.offset, [o.value for o in outs]) for m, outs in of_batch(batch, batch, failed,
                                                                       sink)]
    assert got == [(1, [b"of-1", b"batch"])]  # 2 failed: its output dropped; 1 the last ok


def test_batch_outputs_all_dropped_when_every_record_failed() -> None:
    batch = [_m(0), _m(1)]
    sink = Sink()
    sink.calling(batch)
    sink.add(Output("o", None, b"batch"))
    assert of_batch(batch, batch, dict.fromkeys(batch, ValueError()), sink) == []


def test_record_must_name_a_record_of_the_batch() -> None:
    sink = Sink()
    with pytest.raises(ValueError, match="single-record handler"):
        sink.add(Output("o", None, b"", record=_m(0)))
    sink.calling([_m(0), _m(1)])
    with pytest.raises(ValueError, match="not a record of this batch"):
        sink.add(Output("o", None, b"", record=_m(7)))


def test_the_buffer_hands_over_only_records_below_the_position() -> None:
    buf = OutputBuffer()
    part = object()
    buf.add(part, [Entry(o, _m(o), [Output("o", None, b"")]) for o in (0, 1, 3, 4)])
    assert [e.offset for e in buf.take(part, 3)] == [0, 1]
    assert buf.count == 2
    buf.drop(part)
    assert buf.count == 0 and buf.take(part, 99) == []


def test_produce_outside_a_handler_and_bad_values_are_refused() -> None:
    # outside any handler call: a fresh context (this test's own thread may have driven an
    # inline runner of an earlier test, which leaves its pass's sink behind in the context)
    refused = contextvars.Context().run(lambda: _raised(lambda: activity.produce("o", b"x")))
    assert isinstance(refused, RuntimeError) and "no handler call under way" in str(refused)
    token = outputs_module.current_sink.set(Sink())
    try:
        with pytest.raises(ValueError, match="topic must be a topic name"):
            activity.produce("", b"x")
        with pytest.raises(TypeError, match="value_serializer"):
            activity.produce("o", {"a": 1})
    finally:
        outputs_module.current_sink.reset(token)


def _raised(fn: Callable[[], object]) -> BaseException | None:
    try:
        fn()
    except Exception as exc:
        return exc
    return None


def test_exactly_once_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="guarantee"):
        Worker(topics=["t"], group_id="g", guarantee="twice")
    with pytest.raises(ConfigError, match="share group"):
        Worker(topics=["t"], group_id="g", guarantee="exactly_once", mode="share")


def test_at_least_once_sends_the_outputs_of_successful_attempts_only() -> None:
    handler = _fails_at_2
    consumer = ScriptedConsumer(_msgs(5), [])
    sender = RecordingSender()
    _run_worker([], handler, lambda: any(pos.get(("t", 0)) == 5 for pos, _ in consumer.commits),
                consumer, sender=sender)
    outs = Counter(v for t, v in sender.sent if t == "out")
    assert outs == Counter(m.value for m in _msgs(5) if m.offset != 2)
    assert [v for t, v in sender.sent if t != "out"] == [b"0@2"]  # its tier record
    assert any(pos.get(("t", 0)) == 5 for pos, _ in consumer.commits)


def test_an_async_handler_produces_the_same_way() -> None:
    async def handler(msg: Message) -> None:
        _one_output(msg)

    txns = FakeTransactions()
    _run(_msgs(12, 2), handler, txns, _settled(12, 2))
    assert _values(txns) == Counter(m.value for m in _msgs(12, 2))
    assert not txns.beyond_position()


def test_a_batch_handler_outputs_ride_with_their_record_or_the_batch() -> None:
    txns = FakeTransactions()

    def handle(batch: list[Message]) -> None:
        for m in batch:
            activity.produce("out", m.value, record=m,
                             headers={"src": f"{m.partition}@{m.offset}"})
        activity.produce("summary", str(len(batch)).encode())

    _run(_msgs(10), handle, txns, _settled(10), batch=4)
    assert _values(txns) == Counter(m.value for m in _msgs(10))
    assert sum(int(v or b"0") for v in _values(txns, "summary").elements()) == 10
    assert not txns.beyond_position()


def test_a_stale_generation_is_aborted_counted_fenced_and_sent_again() -> None:
    txns = FakeTransactions(script=["stale"])
    worker = _run(_msgs(6), _one_output, txns, _settled(6))
    assert txns.log[0].ended == "aborted"
    assert _values(txns) == Counter(m.value for m in _msgs(6))
    fenced = worker.metrics.transactions.labels("g", "fenced")._value.get()
    assert fenced == 1


def test_a_producer_fenced_by_another_stops_the_worker_without_taking_the_id_back() -> None:
    txns = FakeTransactions(script=["producer-fenced"])
    consumer = ScriptedConsumer(_msgs(4), [])
    worker = Worker(topics=["t"], group_id="g", guarantee="exactly_once",
                    consumer=lambda group: consumer if group == "g" else _idle(group),
                    transactions=lambda group: txns if group == "g" else FakeTransactions())
    worker.handler(_one_output)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(False)
        except BaseException as exc:  # the worker's fault, raised when it stops
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    consumer.go.set()
    thread.join(30)
    assert not thread.is_alive(), "the worker did not stop"
    assert failed and "transactional id" in str(failed[0]), failed
    assert txns.renewed == 0  # never took the id back from the other producer
    assert _values(txns) == Counter()  # nothing of the fenced transaction visible


def _to_invoices(msg: Message) -> None:
    activity.produce("invoices" if msg.offset == 2 else "out", msg.value,
                     headers={"src": f"{msg.partition}@{msg.offset}"})


def test_an_output_topic_that_does_not_exist_holds_the_records_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue #46, bug 2: the topic named with the broker's reason (one log line, the gauge,
    /readyz), nothing committed past the record meanwhile, every output once when it exists.
    Read from the double's transaction log."""
    txns = FakeTransactions()
    txns.absent.add("invoices")
    during: dict[str, Any] = {}
    box: list[Worker] = []

    def held_then_created(t: FakeTransactions) -> bool:
        if not during:
            w = box[0]
            gauge = w.metrics.registry.get_sample_value(
                "kworkers_output_topic_missing", {"group": "g", "topic": "invoices"})
            if gauge != 1 or w.unready_reason is None:
                return False
            with t.lock:
                during.update(reason=w.unready_reason, healthy=w.fault is None,
                              committed=dict(t.committed_offsets),
                              visible=list(t.visible()))
                t.absent.clear()  # the operator creates it
        return _settled(5)(t)

    caplog.set_level("INFO")
    _run(_msgs(5), _to_invoices, txns, held_then_created, box=box)
    assert during, "the worker never said the topic is missing"
    assert "invoices (Broker: Unknown topic or partition)" in during["reason"], during["reason"]
    assert during["healthy"]
    # nothing committed past the record whose output waits, and none of its outputs visible
    assert all(pos <= 2 for pos in during["committed"].values()), during["committed"]
    assert not [o for o in during["visible"] if o[0] == "invoices"]
    assert _values(txns) + _values(txns, "invoices") == Counter(m.value for m in _msgs(5))
    assert not txns.beyond_position()
    assert txns.asked.count("invoices") >= 2 and txns.asked.count("out") == 1  # asked once seen
    lines = [r.getMessage() for r in caplog.records]
    assert sum("output topic invoices does not exist" in m for m in lines) == 1, lines
    assert sum("output topic invoices exists now" in m for m in lines) == 1, lines
    assert not [m for m in lines if "not committed" in m]  # no abort-per-try noise
    w = box[0]
    assert w.unready_reason is None and w.metrics.registry.get_sample_value(
        "kworkers_output_topic_missing", {"group": "g", "topic": "invoices"}) == 0


def test_an_output_topic_missing_past_three_stall_bounds_turns_the_worker_unhealthy() -> None:
    txns = FakeTransactions()
    txns.absent.add("invoices")
    box: list[Worker] = []
    _run(_msgs(5), _to_invoices, txns, lambda _t: box[0].fault is not None, box=box,
         stall_timeout=0.2, revoke_timeout=1.0)
    fault = box[0].fault
    assert fault is not None and "invoices" in fault.reason, fault
    assert all(pos <= 2 for pos in txns.committed_offsets.values())


def test_a_scheduled_record_for_a_destination_that_does_not_exist_waits_and_is_named(
        tmp_path: Any) -> None:
    """The scheduler's delivery is an exactly-once output: its missing destination holds the
    rung record (nothing committed past it, nothing delivered) and is named the same way."""
    from kworkers.idempotency.sqlite import SqliteStore
    from kworkers.schedule import ScheduleLadder, Scheduler
    from kworkers.schedule.headers import rung_headers

    s = Scheduler("127.0.0.1:1", SqliteStore(tmp_path / "s.db"), ["invoices"],
                  ladder=ScheduleLadder((60.0,), horizon=60.0, max_ahead=3600.0))
    now = time.time()
    rung = s.ladder.topics("invoices")[-1]
    due = [Message(rung, 0, i, b"k%d" % i, b"v%d" % i,
                   rung_headers((), f"id-{i}", now - 1, now - 2, now - 1)) for i in range(2)]
    consumer, txns = ScriptedConsumer(due, [], "sched"), FakeTransactions()
    txns.absent.add("invoices")
    w = s.worker("sched", consumer=lambda g: consumer if g == "sched" else _idle(g),
                 transactions=lambda g: txns if g == "sched" else FakeTransactions())
    thread = threading.Thread(target=w.run, args=(False,), daemon=True)
    thread.start()
    consumer.go.set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (w.unready_reason is None
                                           or "invoices" not in w.unready_reason):
        time.sleep(0.01)
    reason = w.unready_reason
    with txns.lock:
        committed, visible = dict(txns.committed_offsets), list(txns.visible())
    txns.absent.clear()
    while time.monotonic() < deadline and txns.committed_offsets.get((rung, 0)) != 2:
        time.sleep(0.01)
    w.stop()
    thread.join(30)
    assert reason is not None and "output topic(s) missing: invoices" in reason, reason
    assert committed.get((rung, 0), 0) == 0 and visible == []
    assert _values(txns, "invoices") == Counter([b"v0", b"v1"])  # delivered once each, after
