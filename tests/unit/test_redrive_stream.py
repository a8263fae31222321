"""The redrive's one pass, without a broker: the ledger as bits, the pass's counts and samples,
and the bar's rate and ETA (issue #50: a DLQ of any size in bounded memory)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from rich.console import Console
from rich.progress import Task

from kworkers.cli.bars import RateColumn, progress_bar
from kworkers.console.jobs import Job
from kworkers.dlq import DeadLetter, RedriveFilter, sweep
from kworkers.dlq.reader import Unreadable
from kworkers.dlq.redrive import RedriveSummary
from kworkers.dlq.redrive_plan import Replay, ledger_key
from kworkers.dlq.replayed import ReplayedOffsets, coordinates
from kworkers.errors import ConfigError
from kworkers.kafka.reader import STREAM_READ_AHEAD
from kworkers.kafka.settings import ClientSettings, reader_settings
from kworkers.message import Message

BASE = DeadLetter(
    dlq_topic="orders.dlq", dlq_partition=0, dlq_offset=0, original_topic="orders",
    original_partition=1, original_offset=7, key=b"k", value=b"v", attempts=3,
    error_type="Timeout", error_message="slow", first_failure_at=1.0, last_failure_at=2.0,
    dead_lettered_at=3.0, reason="exhausted", group="g", headers=())


def test_replayed_offsets_keep_a_bit_per_offset_of_the_span() -> None:
    done = ReplayedOffsets({0: (1_000, 1_000_000), 1: (0, 10)})
    assert done.nbytes == (999_000 + 7) // 8 + 2  # 125 KB a million dead letters
    assert done.add(0, 1_000) and done.add(0, 999_999) and done.add(1, 9)
    assert not done.add(0, 1_000)  # marked already
    assert not done.add(0, 999) and not done.add(0, 1_000_000)  # outside the span
    assert not done.add(2, 0)  # a partition the span does not have
    assert len(done) == 3
    assert done.has(0, 1_000) and done.has(0, 999_999) and done.has(1, 9)
    assert not done.has(0, 1_001) and not done.has(1, 8) and not done.has(5, 1)
    assert not done.has(0, 999) and not done.has(1, 10)


def test_a_ledger_key_is_read_as_its_coordinates_of_this_dlq_only() -> None:
    key = ledger_key(dataclasses.replace(BASE, dlq_partition=3, dlq_offset=42)).encode()
    assert coordinates(key, "orders.dlq") == (3, 42)
    assert coordinates(b"other.dlq/3/42", "orders.dlq") is None
    assert coordinates(b"orders.dlq/x/42", "orders.dlq") is None
    assert coordinates(None, "orders.dlq") is None
    assert coordinates(b"run-1/start", "orders.dlq") is None


def _stream(n: int, partitions: int = 2) -> Iterator[list[DeadLetter | Unreadable]]:
    """``n`` dead letters over ``partitions``, in chunks of 7, offset 5 of each partition a
    record that is not a dead letter."""
    items: list[DeadLetter | Unreadable] = []
    for i in range(n):
        p, o = i % partitions, i // partitions
        if o == 5:
            items.append(Unreadable(Message("orders.dlq", p, o, None, b"x"), "not ours"))
            continue
        origin = "elsewhere" if o % 4 == 3 else "orders"
        items.append(dataclasses.replace(BASE, dlq_partition=p, dlq_offset=o,
                                         original_topic=origin,
                                         error_type="Boom" if o % 2 else "Timeout"))
    for i in range(0, len(items), 7):
        yield items[i:i + 7]


def test_a_pass_counts_everything_and_keeps_a_bounded_sample(
        monkeypatch: pytest.MonkeyPatch) -> None:
    n = 2 * sweep.SAMPLE * 3
    spans = {0: (0, n // 2), 1: (0, n // 2)}
    monkeypatch.setattr(sweep, "stream_dlq", lambda *_a, **_k: _stream(n))
    done = ReplayedOffsets(spans)
    for o in range(0, 40):
        done.add(0, o)
    sent: list[Replay] = []
    seen: list[tuple[int, int]] = []
    tally = sweep.sweep("x:1", "orders.dlq", RedriveFilter(), None, {"orders": 3}, spans,
                        done, sent.append, lambda d, t: seen.append((d, t)))
    assert tally.read == n and tally.unreadable == 2
    assert tally.selected == n - 2
    assert tally.skipped_already == 40 - 1  # offset 5 of partition 0 is no dead letter
    refused = sum(1 for p in (0, 1) for o in range(n // 2) if o % 4 == 3
                  and not (p == 0 and o < 40))
    assert tally.refused == refused and len(tally.refusals) == sweep.SAMPLE
    assert tally.todo == len(sent) == n - 2 - 39 - refused
    assert tally.targets == {"orders": tally.todo}
    assert tally.replays == sent[:sweep.SAMPLE]  # the sample is the first ones, in order
    assert {(r.topic, r.partition) for r in sent} == {("orders", 1)}
    assert seen[0] == (0, n) and seen[-1] == (n, n)  # DLQ records gone through, of the span
    assert [d for d, _t in seen] == sorted(d for d, _t in seen)

    # a filter, and the summary the CLI and the console show
    monkeypatch.setattr(sweep, "stream_dlq", lambda *_a, **_k: _stream(n))
    boom = sweep.sweep("x:1", "orders.dlq", RedriveFilter(error_type="Boom"), None,
                       {"orders": 3}, spans, ReplayedOffsets(spans))
    assert boom.selected == sum(1 for p in (0, 1) for o in range(n // 2) if o % 2 and o != 5)
    s = RedriveSummary.of("orders.dlq", tally, True, 0, {0: n // 2, 1: n // 2})
    assert s.pending == tally.todo and s.refused_total == refused
    assert len(s.refused) == sweep.SAMPLE and s.refused[0][0] == "orders.dlq/1/3"
    assert s.line().endswith(f"refused={refused} would_redrive={tally.todo} (dry run: "
                             "nothing was produced)")
    assert s.ends == ((0, n // 2), (1, n // 2)) and s.read == n


def test_a_missing_target_stops_the_pass_before_anything_is_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "stream_dlq", lambda *_a, **_k: _stream(20))
    sent: list[Replay] = []
    with pytest.raises(ConfigError, match="target topic 'orders' does not exist"):
        sweep.sweep("x:1", "orders.dlq", RedriveFilter(), None, {}, {0: (0, 10), 1: (0, 10)},
                    ReplayedOffsets({}), sent.append)
    assert sent == []


def test_the_bar_shows_rate_and_eta() -> None:
    now = [0.0]
    out = Console(force_terminal=True, width=160)
    bar = progress_bar(out, "redrive", " records")
    bar.get_time = lambda: now[0]
    task_id = bar.add_task("orders.dlq", total=1_000_000)
    task: Task = bar.tasks[0]
    assert str(RateColumn(" records").render(task)) == "- records/s"
    now[0] = 10.0
    bar.update(task_id, completed=100_000)
    now[0] = 20.0
    bar.update(task_id, completed=200_000)
    assert str(RateColumn(" records").render(task)) == "10,000 records/s"
    assert task.time_remaining == 80.0  # the ETA column's figure
    names = [type(c).__name__ for c in bar.columns]
    assert "RateColumn" in names and "TimeRemainingColumn" in names


def test_the_console_job_shows_rate_and_eta() -> None:
    job = Job("j", "orders.dlq", "all", started=100.0, done=0, total=1_000)
    assert job.rate is None and job.eta is None
    job = dataclasses.replace(job, done=250, updated=110.0)
    assert job.rate == 25.0 and job.eta == 30.0


def test_a_stream_caps_the_read_ahead_in_records_too() -> None:
    """Dead letters carry ~600 B of headers on 100 B values and librdkafka weighs only values:
    without the count, its queue held a 100k-record DLQ whole (measured: 72 MB of RSS)."""
    plain = reader_settings("x:1")
    capped = reader_settings("x:1", read_ahead=STREAM_READ_AHEAD)
    assert "queued.min.messages" not in plain
    assert capped["queued.min.messages"] == STREAM_READ_AHEAD.records == 1_000
    assert capped["queued.max.messages.kbytes"] == 8_192
    assert capped["fetch.max.bytes"] == 8_192 * 1024 and capped["fetch.queue.backoff.ms"] == 10
    assert capped["isolation.level"] == "read_committed"
    mine = reader_settings(ClientSettings.of("x:1", {"queued.min.messages": "50"}),
                           read_ahead=STREAM_READ_AHEAD)
    assert mine["queued.min.messages"] == "50"  # an operator's -X still wins


class _Record:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "orders.dlq"

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list[tuple[str, bytes]]:
        return []

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)


class _Consumer:
    """Gives one record a ``consume``, offsets 0, 1, 2."""

    def __init__(self) -> None:
        self.next = 0

    def assign(self, _tps: object) -> None:
        pass

    def pause(self, _tps: object) -> None:
        pass

    def consume(self, _n: int, _timeout: float) -> list[_Record]:
        self.next += 1
        return [_Record(self.next - 1)]


@pytest.mark.parametrize("idle", [True, False])
def test_a_streams_timeout_counts_the_brokers_silence_not_the_callers_work(
        monkeypatch: pytest.MonkeyPatch, idle: bool) -> None:
    """A redrive at ``--rate 5/s`` spends 100 s on a chunk of 500: that is not the broker
    being silent. With ``idle`` (a stream) the read goes on; a scan's whole-read bound (the
    canary here) would give up."""
    from confluent_kafka import TopicPartition

    from kworkers.kafka import reader

    now = [0.0]
    monkeypatch.setattr(reader, "time", SimpleNamespace(monotonic=lambda: now[0]))
    got = []
    chunks = reader._read(_Consumer(), "orders.dlq",  # type: ignore[arg-type]
                          [TopicPartition("orders.dlq", 0, 0)], {0: 3}, None, set(), 60.0,
                          idle=idle)
    try:
        for chunk in chunks:
            got += [m.offset for m in chunk]
            now[0] += 100.0  # the caller works on it (replays at a slow rate)
    except reader.ReadTimeout:
        assert not idle
        return
    assert idle and got == [0, 1, 2]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_console_job_page_shows_rate_and_eta() -> None:
    import threading
    import warnings

    from kworkers.console.jobs import Jobs
    from kworkers.console.settings import ConsoleSettings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

        from kworkers.console.app import create_app

    ticks = iter([100.0, 110.0])
    jobs = Jobs(clock=lambda: next(ticks, 110.0))
    reported, release = threading.Event(), threading.Event()

    def run(progress: Callable[[int, int], None]) -> RedriveSummary:
        progress(250, 1_000)
        reported.set()
        release.wait(30)
        return RedriveSummary("orders.dlq", 1_000, 1_000, 0, 0, False)

    job = jobs.start("orders.dlq", "all", run, str)
    assert reported.wait(30)
    s = ConsoleSettings(ClientSettings.of("127.0.0.1:1", {}), connect_timeout=0.5)
    try:
        with TestClient(create_app(s, jobs=jobs, secret=b"s" * 32),
                        base_url="http://127.0.0.1:8080") as c:
            text = c.get(f"/jobs/{job.id}").text
    finally:
        release.set()
    assert '<span id="job-count">250 / 1,000</span> records of the DLQ gone through' in text
    assert '<span id="job-rate">25/s</span>' in text and '<span id="job-eta">30 s</span>' in text
