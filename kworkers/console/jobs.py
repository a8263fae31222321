"""Redrives the console started: each runs on a thread of its own, and its page follows it.

A redrive can take minutes (a large DLQ, a ``rate``), longer than a browser waits for an
answer, so the POST starts it here and redirects to a page that shows its progress (the
redrive's own ``progress(done, total)`` callback: DLQ records gone through, with the rate and
the time left) until it ends with the redrive's summary or
its one-line error. One redrive per DLQ at a time: a second would only be fenced by the first's
transactional id, so it is refused up front with a clear message instead.

Jobs live in this process's memory: after a restart the History page still has every
redrive, from any console or the CLI, from the DLQ's audit topic (who, when, what, how it
ended: ``kworkers.dlq.audit``) and its ledger (each replay).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kworkers.dlq.redrive import Progress, RedriveSummary
from kworkers.errors import ConfigError

#: Jobs kept for their pages; the oldest finished ones are forgotten past this.
KEEP = 100


class Busy(ConfigError):
    """A redrive of this DLQ is already running."""


@dataclass(frozen=True)
class Job:
    id: str
    dlq: str
    what: str
    started: float
    state: str = "running"  # running | done | failed
    done: int = 0
    total: int | None = None
    summary: RedriveSummary | None = None
    error: str | None = None
    finished: float | None = None
    #: when ``done`` was last reported
    updated: float | None = None

    @property
    def rate(self) -> float | None:
        """DLQ records gone through a second, on average since the start."""
        if self.updated is None or self.updated <= self.started or not self.done:
            return None
        return self.done / (self.updated - self.started)

    @property
    def eta(self) -> float | None:
        """Seconds left at ``rate`` (None until there is one, or without a total)."""
        rate = self.rate
        if rate is None or self.total is None:
            return None
        return max(0.0, self.total - self.done) / rate


@dataclass
class Jobs:
    """The redrives of this console, by id (ids are random: a job page is not guessable)."""

    clock: Callable[[], float] = time.time
    _jobs: dict[str, Job] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def recent(self, dlq: str | None = None) -> list[Job]:
        with self._lock:
            jobs = [j for j in self._jobs.values() if dlq is None or j.dlq == dlq]
        return sorted(jobs, key=lambda j: j.started, reverse=True)

    def _update(self, job_id: str, **changes: object) -> None:
        with self._lock:
            self._jobs[job_id] = replace(self._jobs[job_id], **changes)  # type: ignore[arg-type]

    def start(self, dlq: str, what: str, run: Callable[[Progress], RedriveSummary],
              redact: Callable[[str], str]) -> Job:
        """Start ``run(progress)`` on a thread; ``Busy`` if ``dlq`` has a redrive running."""
        with self._lock:
            if any(j.dlq == dlq and j.state == "running" for j in self._jobs.values()):
                raise Busy(f"a redrive of {dlq} is already running; wait for it to end")
            job = Job(secrets.token_hex(8), dlq, what, self.clock())
            self._jobs[job.id] = job
            done = sorted((j for j in self._jobs.values() if j.state != "running"),
                          key=lambda j: j.started)
            for old in done[:max(0, len(self._jobs) - KEEP)]:
                del self._jobs[old.id]

        def progress(n: int, total: int) -> None:
            self._update(job.id, done=n, total=total, updated=self.clock())

        def work() -> None:
            try:
                summary = run(progress)
            except Exception as exc:  # the page shows it; the process serves on
                self._update(job.id, state="failed", finished=self.clock(),
                             error=redact(" ".join(f"{type(exc).__name__}: {exc}".split())))
                return
            now = self.get(job.id)
            total = None if now is None else now.total  # the whole span was gone through
            self._update(job.id, state="done", summary=summary, finished=self.clock(),
                         done=summary.read if total is None else total)

        threading.Thread(target=work, name=f"kworkers-console-redrive-{job.id}",
                         daemon=True).start()
        return job
