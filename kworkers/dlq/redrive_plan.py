"""What a redrive replays, and where: pure, so the CLI, a console and tests share one answer.

An operator fixes a bug or waits out an outage, then redrives the dead letters it caused,
typically one error type over one time window; ``RedriveFilter`` is that selection.

Where a replay goes is decided by the DLQ's name, never by a dead letter's headers: the DLQ
``<source>.dlq`` replays to ``<source>`` (``redrive_target``). A dead letter's recorded origin
(``kw-original-topic``) is a claim written by whoever produced the record; one that disagrees
with the DLQ's source (it names another pipeline's topic, or an illegal name) is refused with a
reason, unless the operator names the target explicitly. Otherwise write access to one DLQ
would be write access to every topic a redrive can reach.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from kworkers.dlq.record import DeadLetter
from kworkers.errors import ConfigError
from kworkers.topic_names import (
    dlq_source,
    is_derived,
    is_legal_topic,
    is_tier_topic,
    source_topic_of,
)


@dataclass(frozen=True)
class RedriveFilter:
    """Criteria that all must hold; an unset one matches everything.

    ``since``/``until`` are a half-open window ``[since, until)`` on ``dead_lettered_at``
    (when it died is what an incident timeline gives), so consecutive windows never
    redrive a record twice. ``min_offset``/``max_offset`` are inclusive bounds on the
    *DLQ* offset, the position the redrive tool reads and can resume from.
    ``error_type`` and ``key`` match exactly.
    """

    error_type: str | None = None
    key: bytes | None = None
    since: float | None = None
    until: float | None = None
    min_offset: int | None = None
    max_offset: int | None = None

    def __post_init__(self) -> None:
        # An impossible filter silently matching nothing looks like "nothing to redrive".
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ConfigError(f"empty time window: since={self.since} >= until={self.until}")
        if self.min_offset is not None and self.min_offset < 0:
            raise ConfigError(f"min_offset must be >= 0, got {self.min_offset}")
        if (
            self.min_offset is not None
            and self.max_offset is not None
            and self.min_offset > self.max_offset
        ):
            raise ConfigError(
                f"empty offset range: min_offset={self.min_offset} > max_offset={self.max_offset}"
            )

    def matches(self, d: DeadLetter) -> bool:
        return (
            (self.error_type is None or d.error_type == self.error_type)
            and (self.key is None or d.key == self.key)
            and (self.since is None or d.dead_lettered_at >= self.since)
            and (self.until is None or d.dead_lettered_at < self.until)
            and (self.min_offset is None or d.dlq_offset >= self.min_offset)
            and (self.max_offset is None or d.dlq_offset <= self.max_offset)
        )


def ledger_key(d: DeadLetter) -> str:
    """A dead letter's identity: where it sits in the DLQ, which never changes."""
    return f"{d.dlq_topic}/{d.dlq_partition}/{d.dlq_offset}"


def check_target(to: str) -> str:
    """An operator's explicit target: a legal topic name that is not a retry tier or a DLQ
    (a replay there would be read as a forged retry, or loop back into a DLQ)."""
    if not is_legal_topic(to):
        raise ConfigError(f"redrive target {to[:80]!r} is not a legal topic name")
    if is_derived(to):
        raise ConfigError(f"redrive target {to!r} is a retry tier or a DLQ; name a source topic")
    return to


@dataclass(frozen=True)
class Refused:
    """A dead letter the redrive will not replay, and why."""

    dead: DeadLetter
    reason: str


def redrive_target(dlq: str, d: DeadLetter, to: str | None = None) -> str | Refused:
    """Where ``d`` (read from ``dlq``) is replayed: ``to`` when the operator named it (checked
    once by ``check_target``), else the source topic ``dlq`` is the DLQ of, if ``d``'s recorded
    origin agrees (it is that source or one of its tiers)."""
    if to is not None:
        return to
    source = dlq_source(dlq)
    if source is None:
        return Refused(d, f"{dlq!r} is not named <source>.dlq, so it has no default target; "
                          "name one explicitly (--to, or the console's replay-to field)")
    recorded = d.original_topic
    ours = recorded == source or (is_tier_topic(recorded) and source_topic_of(recorded) == source)
    if not ours:
        return Refused(d, f"its recorded origin {recorded[:80]!r} is not {source!r} (the "
                          f"source of {dlq!r}); replay it only by naming the target explicitly")
    return source


@dataclass(frozen=True)
class Replay:
    """One dead letter and where its replay goes (partition None: by the key)."""

    dead: DeadLetter
    topic: str
    partition: int | None


@dataclass(frozen=True)
class RedrivePlan:
    """``selected`` matched the filter; of those, ``todo`` are replayed, ``refused`` are not
    (with the reason), and the rest were replayed by an earlier run (in the ledger)."""

    selected: list[DeadLetter]
    todo: list[Replay]
    refused: list[Refused] = field(default_factory=list)

    @property
    def skipped_already(self) -> int:
        return len(self.selected) - len(self.todo) - len(self.refused)


def decide(dlq: str, d: DeadLetter, to: str | None,
           partitions: Mapping[str, int]) -> Replay | Refused:
    """Where a selected dead letter that no redrive replayed yet goes: its ``Replay``, or why it
    is ``Refused``. ``ConfigError`` when its target does not exist (every replay of one redrive
    goes to one target, ``to`` or the DLQ's source: the first replay finds it missing, before
    anything was produced)."""
    target = redrive_target(dlq, d, to)
    if isinstance(target, Refused):
        return target
    n = partitions.get(target)
    if n is None:
        raise ConfigError(
            f"redrive target topic {target!r} does not exist (dead letter "
            f"{ledger_key(d)}); create it or pass --to")
    same = target == d.original_topic and d.original_partition < n
    return Replay(d, target, d.original_partition if same else None)


def plan(dlq: str, dead_letters: Collection[DeadLetter], flt: RedriveFilter,
         done: Collection[str], to: str | None, partitions: Mapping[str, int]) -> RedrivePlan:
    """The whole redrive, given the DLQ's dead letters, the ledger (``done``: ledger keys
    already replayed), the operator's ``to`` and the topics that exist (name -> partitions).
    (The redrive itself decides each dead letter as it reads it, ``sweep``; this is the same
    decision over a list, for tests and small callers.)

    ``ConfigError`` when ``to`` is not a topic a replay may go to, or a target does not exist.
    """
    if to is not None:
        check_target(to)
    selected = [d for d in dead_letters if flt.matches(d)]
    todo: list[Replay] = []
    refused: list[Refused] = []
    for d in selected:
        if ledger_key(d) in done:
            continue
        got = decide(dlq, d, to, partitions)
        if isinstance(got, Refused):
            refused.append(got)
        else:
            todo.append(got)
    return RedrivePlan(selected, todo, refused)
