"""Which partitions to pause and resume: one pure decision over explicit inputs.

Why pure and in one place: every reason to stop fetching (too much in flight overall or on one
partition, a full timer heap, a drain, an open circuit breaker) is an input here, so a new
reason is one more input rather than another branch in the poll loop, and the whole policy is
tested without a consumer. Pausing keeps records in Kafka instead of in memory; hysteresis
(resume only at half the limit) keeps a partition from flapping between the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kworkers.consumer.ports import TP


@dataclass(frozen=True, slots=True)
class Limits:
    max_in_flight: int
    per_partition: int
    #: capacity of the retry loop's timer heap (None: no heap)
    buffer_capacity: int | None = None


class PartitionLoad(NamedTuple):
    tp: TP
    #: records held for the partition: from its lowest incomplete offset on, completed or not
    #: (one record whose hand-off is stuck keeps everything behind it uncommittable)
    in_flight: int
    paused: bool


@dataclass(frozen=True, slots=True)
class Load:
    parts: Sequence[PartitionLoad]
    #: records waiting in the timer heap
    buffered: int = 0
    #: the heap was full at the last decision and has not drained to half since
    buffer_full: bool = False
    #: a graceful stop is under way: fetch nothing more
    draining: bool = False
    #: the circuit breaker is not closed: keep the backlog in Kafka
    breaker_open: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    pause: tuple[TP, ...]
    resume: tuple[TP, ...]
    #: carry into the next ``Load.buffer_full``
    buffer_full: bool
    in_flight: int


def decide(limits: Limits, load: Load) -> Decision:
    total = sum(p.in_flight for p in load.parts)
    buffer_full = load.buffer_full
    cap = limits.buffer_capacity
    if cap is not None:
        if load.buffered >= cap:
            buffer_full = True
        elif load.buffered <= cap // 2:
            buffer_full = False
    stop_all = (load.draining or load.breaker_open or buffer_full
                or total >= limits.max_in_flight)
    room = total <= limits.max_in_flight // 2
    pause: list[TP] = []
    resume: list[TP] = []
    for p in load.parts:
        if not p.paused and (stop_all or p.in_flight >= limits.per_partition):
            pause.append(p.tp)
        elif (p.paused and not stop_all and room
              and p.in_flight <= limits.per_partition // 2):
            resume.append(p.tp)
    return Decision(tuple(pause), tuple(resume), buffer_full, total)
