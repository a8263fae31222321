"""A group's committed positions, read back from the broker, with the time of each reading.

Why timed: a position read back at time ``t`` says every record below it was committed before
``t``. A delivery after ``t`` of a record below it is committed work run again, whatever else
happened in the run (``checker.check`` reports it as ``rerun_committed``); an untimed list of
positions cannot say that. Why a sampler thread: a single reading at the end shows neither a
commit that went backwards and came forward again nor the moment a record was committed, so
the suites read the positions throughout the run, from a client of their own::

    with CommitSampler(bs, group, topic) as commits:   # every 0.25 s on a thread of its own
        ...                                              # the run; commits.sample(): one now
    report = check(ledger, log=read_log(bs, topic), commits=commits.samples, faults=...)

``stop`` (and leaving the ``with``) takes one last reading (retried while the coordinator is
loading), so the samples always end with the final positions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CommitSample", "CommitSampler", "committed", "sample_commits"]

log = logging.getLogger("kworkers.testing")

#: errors a reading waits out: the coordinator is moving or loading (after a broker restart)
_TRANSIENT = ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
              "_TIMED_OUT", "_TRANSPORT", "_WAIT_COORD")


@dataclass(frozen=True)
class CommitSample:
    """The group's committed position per partition (negative: none), as one reading returned.

    ``at``: when the reading had returned, so every commit it shows was made before then.
    ``started``: when it was asked for (None: unknown). Two readings are ordered only when one
    returned before the other was asked for; overlapping ones may answer in either order.
    """

    at: float
    positions: Mapping[int, int]
    started: float | None = None

    def before(self, other: CommitSample) -> bool:
        """Whether this reading certainly saw the broker before ``other`` did."""
        return self.at <= (other.started if other.started is not None else other.at)


def _consumer(bootstrap: str, group: str, config: Mapping[str, Any] | None,
              log_level: int = 3) -> Any:
    from confluent_kafka import Consumer  # adapter import, kept local

    return Consumer({"bootstrap.servers": bootstrap, "log_level": log_level, "group.id": group,
                     "enable.auto.commit": False, **(config or {})})


def _read(c: Any, topic: str, timeout: float) -> dict[int, int]:
    """One reading with ``c``; asks again (for up to ``timeout`` s) while the coordinator is
    moving or loading, as it does for a while after a broker restart."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    transient = {getattr(KafkaError, name) for name in _TRANSIENT}
    deadline = time.monotonic() + timeout
    while True:
        try:
            meta = c.list_topics(topic, timeout=10).topics[topic]
            tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
            return {tp.partition: int(tp.offset) for tp in c.committed(tps, timeout=10)}
        except KafkaException as exc:
            err = exc.args[0]
            if time.monotonic() > deadline or not (err.retriable() or err.code() in transient):
                raise
            time.sleep(0.5)


def committed(bootstrap: str, group: str, topic: str,
              config: Mapping[str, Any] | None = None, timeout: float = 60.0) -> dict[int, int]:
    """The group's committed position for every partition of ``topic`` (negative: none).

    Asks again (for up to ``timeout`` seconds) while the coordinator is moving or loading."""
    c = _consumer(bootstrap, group, config)
    try:
        return _read(c, topic, timeout)
    finally:
        c.close()


def sample_commits(bootstrap: str, group: str, topic: str,
                   config: Mapping[str, Any] | None = None,
                   timeout: float = 60.0) -> CommitSample:
    """``committed``, timed: one ``CommitSample``."""
    started = time.time()
    positions = committed(bootstrap, group, topic, config, timeout)
    return CommitSample(time.time(), positions, started)


class CommitSampler:
    """Reads the group's committed positions every ``every`` seconds on a thread of its own,
    from one client of its own (never a member of the group), until ``stop``.

    A reading that fails (the broker is down) is left out and counted in ``gaps``: a sampler
    thread must not fail the run it watches; ``sample`` and ``stop`` read until they succeed.
    """

    def __init__(self, bootstrap: str, group: str, topic: str, every: float = 0.25,
                 config: Mapping[str, Any] | None = None) -> None:
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.every = every
        self.config = config
        self.gaps = 0
        self._samples: list[CommitSample] = []
        self._lock = threading.Lock()  # one reading at a time on the client
        self._client: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def samples(self) -> list[CommitSample]:
        """The readings so far, in the order they returned."""
        with self._lock:
            return list(self._samples)

    def _take(self, timeout: float) -> CommitSample:
        with self._lock:
            if self._client is None:
                # quiet: it keeps asking while a test restarts the broker under it
                self._client = _consumer(self.bootstrap, self.group, self.config, log_level=0)
            started = time.time()
            positions = _read(self._client, self.topic, timeout)
            s = CommitSample(time.time(), positions, started)
            self._samples.append(s)
            return s

    def sample(self, timeout: float = 60.0) -> CommitSample:
        """One reading now (e.g. right before and after a fault), kept with the others."""
        return self._take(timeout)

    def latest(self) -> dict[int, int]:
        """The positions of a reading taken now (for ``FaultLog``'s floors)."""
        return dict(self._take(60.0).positions)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self._take(0.0)
            except Exception as exc:  # the broker is down or restarting: a gap, not a failure
                self.gaps += 1
                log.debug("commit sample failed: %s", exc)

    def start(self) -> CommitSampler:
        self._thread = threading.Thread(target=self._loop, name="kworkers-commit-sampler",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, final: bool = True) -> list[CommitSample]:
        """Stops the thread; with ``final``, takes one last reading first. The samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        try:
            if final:
                self._take(60.0)
        finally:
            with self._lock:
                if self._client is not None:
                    self._client.close()
                    self._client = None
        return self.samples

    def __enter__(self) -> CommitSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(final=exc[0] is None)
