"""The hostile-record suite's instruments (no tests here): what was written where, what ran.

Every verdict is computed from data read back from the broker (topic end offsets, committed
positions, the DLQ and source logs read by a fresh ``read_committed`` consumer) and from the
append-only ledger the test's own handler writes, never from kworkers' counters. Each check
returns the list of problems it found, so a canary can show the same check failing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from kworkers import Message, NonRetryableError
from kworkers.kafka.admin import admin_client
from kworkers.testing.checker import committed, read_log
from kworkers.testing.ledger import Ledger

Ends = dict[str, dict[int, int]]

#: the handler's instructions, carried in a user header
OK, FAIL_ONCE, POISON, ALWAYS = "ok", "fail-once", "poison", "always"


def topic_ends(bs: str, timeout: float = 60.0) -> Ends:
    """Every topic on the broker (internal ones aside: they carry every group's commits) and
    the end offset of each of its partitions, asked of the partition leaders (asked again
    while a new topic's leaders are being elected)."""
    admin = admin_client(bs)
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=10)
        tps = [TopicPartition(n, p) for n, t in md.topics.items() if not n.startswith("__")
               for p in t.partitions]
        try:
            futures = admin.list_offsets({tp: OffsetSpec.latest()  # type: ignore[no-untyped-call]
                                          for tp in tps},
                                         request_timeout=10)
            out: Ends = {}
            for tp, fut in futures.items():
                out.setdefault(tp.topic, {})[tp.partition] = int(fut.result().offset)
            return out
        except KafkaException:  # a leader being elected, a topic deleted meanwhile
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def until_clean(check: Callable[[], list[str]], timeout: float, what: str) -> None:
    """Polls ``check`` until it finds no problem; the timeout only bounds a hang, and its
    error lists what was still wrong."""
    deadline = time.monotonic() + timeout
    while True:
        problems = check()
        if not problems:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {problems[:10]}")
        time.sleep(0.2)


def written_outside(before: Ends, after: Ends, ours: Collection[str]) -> list[str]:
    """Topics other than ``ours`` that appeared or grew between the two listings."""
    return [f"{t}: {before.get(t, 'absent')} -> {ends}" for t, ends in after.items()
            if t not in ours and ends != before.get(t)]


def stalled(bs: str, group: str, topics: Iterable[str]) -> list[str]:
    """Partitions where the group's committed position is not past every record in the log
    (control records of transactions are gaps, so the last *record* is what counts)."""
    out = []
    for topic in topics:
        log = read_log(bs, topic, timeout=30)
        pos = committed(bs, group, topic)
        for p, records in log.records.items():
            if records and pos.get(p, -1) <= records[-1].offset:
                out.append(f"{group} on {topic}/{p}: committed {pos.get(p)}, last record "
                           f"{records[-1].offset}")
    return out


def handler(group: str, ledger: Ledger) -> Callable[[Message], None]:
    """Records one delivery per call and one effect per success, keyed by group, record id and
    the dead letter a replay came from."""
    def handle(msg: Message) -> None:
        key = run_key(group, msg.headers)
        ledger.delivered(key, msg)
        do = msg.header_str("h-do") or OK
        if do == POISON:
            raise NonRetryableError("Poison", "the handler refuses this record")
        if do == ALWAYS or (do == FAIL_ONCE and msg.attempt == 1):
            raise RuntimeError(f"{do}: attempt {msg.attempt} failed")
        ledger.apply(key, msg)
    return handle


def run_key(group: str, headers: Iterable[tuple[str, bytes]]) -> str:
    h = dict(headers)
    return f"{group}/{h.get('h-id', b'?').decode()}/{h.get('kw-redrive-of', b'').decode()}"


@dataclass(frozen=True)
class Expect:
    """What must become of one hostile record, per group: ``handled`` (applied exactly once,
    never dead-lettered); ``dead`` with a reason containing ``why``; ``skip`` (never run by
    that group, never dead-lettered by it); or ``either`` (a randomly damaged record: applied
    exactly once, or dead-lettered once with a reason, not both)."""

    hid: str
    outcome: Mapping[str, str]  # group -> "handled" | "dead" | "skip" | "either"
    why: str = ""
    redrive_of: str = ""
    never_run: bool = False  # corrupt: must not reach any handler


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    handled: int = 0
    dead: int = 0
    skipped: int = 0


def dead_letters(bs: str, dlq: str) -> dict[str, list[dict[str, bytes]]]:
    """run_key -> headers of every dead letter in ``dlq`` (read back, read_committed)."""
    out: dict[str, list[dict[str, bytes]]] = {}
    for records in read_log(bs, dlq, timeout=30).records.values():
        for r in records:
            h = dict(r.headers)
            out.setdefault(run_key(h.get("kw-group", b"?").decode("utf-8", "replace"),
                                   r.headers), []).append(h)
    return out


def judge(expects: Iterable[Expect], ledger: Ledger,
          dead: Mapping[str, list[dict[str, bytes]]]) -> Verdict:
    v = Verdict()
    applied = ledger.applications()
    delivered = Counter(d.key for d in ledger.deliveries())
    for e in expects:
        for group, outcome in e.outcome.items():
            key = f"{group}/{e.hid}/{e.redrive_of}"
            died = dead.get(key, [])
            if outcome == "handled":
                v.handled += 1
                if applied.get(key, 0) != 1 or died:  # applied twice is not handled
                    v.problems.append(f"{key}: not handled exactly once (applied "
                                      f"{applied.get(key, 0)}, dead letters {len(died)})")
            elif outcome == "either":
                ran = applied.get(key, 0) >= 1
                v.handled += ran
                v.dead += bool(died)
                if ran == bool(died) or applied.get(key, 0) > 1 or len(died) > 1 or (
                        died and not died[0].get("kw-error-type")):
                    v.problems.append(f"{key}: applied {applied.get(key, 0)}, dead letters "
                                      f"{len(died)}: expected one of the two")
            elif outcome == "dead":
                v.dead += 1
                if len(died) != 1:
                    v.problems.append(f"{key}: {len(died)} dead letters, expected 1")
                    continue
                h = died[0]
                reason = h.get("kw-error-type", b"").decode() + ": " + h.get(
                    "kw-error-message", b"").decode()
                if not h.get("kw-error-type") or e.why not in reason:
                    v.problems.append(f"{key}: dead letter without the reason {e.why!r}: "
                                      f"{reason[:200]!r}")
                if e.never_run and delivered.get(key):
                    v.problems.append(f"{key}: a corrupt record reached the handler")
            else:
                v.skipped += 1
                if delivered.get(key) or died:
                    v.problems.append(f"{key}: another group's record was run "
                                      f"({delivered.get(key, 0)}x) or dead-lettered "
                                      f"({len(died)}x) by {group}")
    return v


def redrive_problems(expected: Iterable[str], replays: Iterable[str]) -> list[str]:
    """Every dead letter the redrive had to replay (``kw-redrive-of``: ``dlq/partition/
    offset``) replayed exactly once, and nothing else: a count of replays equal to the count
    of dead letters would pass one replayed twice and another never."""
    want, got = Counter(expected), Counter(replays)
    wrong = [f"{ref}: replayed {got[ref]} times, expected {n}" for ref, n in sorted(want.items())
             if got[ref] != n]
    return wrong + [f"{ref}: replayed {n} times, never expected" for ref, n in sorted(got.items())
                    if ref not in want]
