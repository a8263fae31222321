"""Shared by the fault tests: where the idempotency stores are, the lease mode's limit, a
worker process read from outside (its /healthz, its memory from /proc), and the bounded wait
their chaos loops run in."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path

import pytest

from kworkers.testing.checker import CommitSample, Fault
from kworkers.testing.instruments import KillPoint
from kworkers.testing.ledger import Delivery, Effect

STORE_ENV = {"postgres": "KWORKERS_PG_DSN", "redis": "KWORKERS_REDIS_URL"}


def until(cond: Callable[[], bool], timeout: float, tick: Callable[[], None], what: str,
          where: Callable[[], str] | None = None) -> None:
    """Polls ``cond``, running ``tick`` (the test's chaos or revival) between polls; past
    ``timeout`` fails saying ``what`` it waited for and, with ``where``, where each part of it
    stood. Keep ``timeout`` under the test's pytest timeout: a test cut off by pytest-timeout
    says only where its thread slept (ci100)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f": {where()}" if where is not None else ""))
        tick()
        time.sleep(0.2)


def store_url(kind: str, tmp: Path) -> str:
    """The store URL of ``kind``; a missing server URL skips, which fails under CI (see
    ``kworkers.testing.pytest_plugin``)."""
    if kind == "sqlite":
        return f"sqlite:///{tmp}/store.db"
    url = os.environ.get(STORE_ENV[kind])
    if not url:
        pytest.skip(f"{STORE_ENV[kind]} is unset (scripts/test starts the server)")
    return url


def killed_between_effect_and_complete(effects: Iterable[Effect], completes: Iterable[Effect],
                                       victims: Collection[int]) -> set[str]:
    """Keys whose first effect was applied by a process that was then killed before the
    store's ``complete`` returned for it: ``completes`` are the rows ``ledger_worker
    --complete-marks`` writes once ``complete`` returned (pid included), ``victims`` the pids
    of the processes killed. A kill stops every lane of its process, so these are not only the
    kill point's own key."""
    first: dict[str, int] = {}
    for e in effects:
        first.setdefault(e.key, e.pid)
    done = {(c.key, c.pid) for c in completes}
    return {key for key, pid in first.items() if pid in victims and (key, pid) not in done}


def kill_point_landed(point: KillPoint, completed_by: Callable[[str], int | None],
                      victims: Collection[int]) -> bool:
    """Whether a kill point fired, or its key met the same fault another way and never can.

    Why: an ``after-complete`` point fires in the process whose ``complete`` returned first
    for its key. A kill stops every lane of its process, so when another lane's kill point
    lands between that ``complete`` and the step (both keys in flight at once, as after a
    broker restart's burst of redeliveries), the key is done in the store with no marker, and
    every later attempt is answered DONE before reaching the step: the point can never fire,
    and a run that waits for every marker never ends (2026-12-02: all keys applied, every
    worker alive, nothing stalled; in 39 runs that ended, 50 keys, 0 to 5 a run, were completed
    by a process that died before the step). Such a key took exactly the fault the point
    stands for (its process died after ``complete``, before committing), so it counts:
    ``completed_by(key)`` is the pid whose claim completed it (None: not done), and it must
    be one of the ``victims``."""
    assert point.key is not None
    if point.fired():
        return True
    if point.step != "after-complete":
        return False  # any other step is reached again by the attempt that takes over
    pid = completed_by(point.key)
    return pid is not None and pid in victims


def fired_by(markers: Path) -> set[int]:
    """The pids whose kill points fired (each marker holds its process's pid).

    Deaths are counted by pid, not by marker: two lanes of one process may both reach their
    kill points before its SIGKILL lands (2026-12-03, 2 of 22 runs: 6 markers, 5 deaths, and
    the test that counted markers failed). A kill loop also waits until each is a recorded
    victim: the marker is written just before the process kills itself, so a loop ending on
    the markers alone could judge before the death is noticed. A marker still empty is being
    written: its pid comes next time."""
    pids = set()
    for f in markers.iterdir():
        text = f.read_text().strip()
        if text:
            pids.add(int(text))
    return pids


#: worker log lines that tell a partition's owners and the client's own warnings (connection
#: failures while a broker restarts are left out: hundreds a second)
_STORY = re.compile(r"--- start|assigned|revoked|lost|%[34]\||Error|exited")
_NOISE = re.compile(r"Connect to |Connection refused|\.retry|^%7\||kworkers\.consumer\.commits")


def story(logs: Iterable[tuple[str, str]], limit: int = 400) -> str:
    """What each worker's log says of its partitions and its client, for a failed run's output
    (CI keeps no worker logs): ``logs`` are ``(name, text)`` pairs."""
    out = []
    for name, text in logs:
        out += [f"{name}: {line[:240]}" for line in text.splitlines()
                if _STORY.search(line) and not _NOISE.search(line)]
    return "\n".join(out[-limit:])


def beyond_the_lease_limit(duplicates: Mapping[str, int],
                           killed_after_effect: Collection[str]) -> list[str]:
    """Duplicates the lease mode's documented limit cannot produce.

    With the effect outside the store (lease mode), a worker killed between its effect and
    ``complete`` leaves the key leased; once the lease runs out the next attempt applies the
    effect again. So a key may be applied twice only when a kill landed there
    (``killed_between_effect_and_complete``), and never more than twice. Anything else (a key
    whose worker completed it, a key never killed) is a receiver that does not
    deduplicate."""
    never = ", its worker not killed between its effect and complete"
    return [f"{key} applied {n} times" + ("" if key in killed_after_effect else never)
            for key, n in sorted(duplicates.items())
            if n > 2 or key not in killed_after_effect]


def metric_total(port: int, name: str, **labels: str) -> float:
    """A worker metric as its ``/metrics`` exports it over HTTP: the sum of the samples named
    ``name`` whose labels include ``labels`` (e.g. every ``reason`` of a group's pauses)."""
    from tests.integration.test_metrics_http import scrape

    want = set(labels.items())
    return sum(v for (n, got), v in scrape(port).items() if n == name and want <= got)


def proc_mb(pid: int, field: str = "VmRSS") -> float:
    """A figure of ``/proc/<pid>/status`` in MiB, as the kernel keeps it (``VmRSS``: resident
    now; ``VmHWM``: the most it ever was); 0.0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


#: what a worker started with ``KWORKERS_TEST_COMMIT_LOG=1`` logs of its commits and partitions
COMMIT_LOG_ENV = {"KWORKERS_TEST_COMMIT_LOG": "1"}
#: the same, and its client's debug lines of the group and its partitions (librdkafka's
#: ``cgrp,topic``: the committed offset the coordinator answered at each assignment, a reset
#: to ``auto.offset.reset``, where fetching started); ``commit_evidence`` picks those out
EVIDENCE_ENV = {**COMMIT_LOG_ENV, "KWORKERS_TEST_CLIENT_DEBUG": "cgrp,topic"}


def _utc(at: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}"


def commit_evidence(partitions: Collection[int], *, topic: str, group: str, bootstrap: str,
                    samples: Iterable[CommitSample], deliveries: Iterable[Delivery],
                    faults: Iterable[Fault], logs: Iterable[tuple[str, str]],
                    out: Path | None = None) -> str:
    """Everything that says when ``partitions`` were committed and by whom, for a run that saw
    committed work run again (``rerun_committed``) or a commit go backwards: the sampler's
    readings (each change), the group's commits as ``__consumer_offsets`` keeps them (read
    now: a commit the sampler saw and the log lacks was never durable), each worker's commit
    trail and assignments (``COMMIT_LOG_ENV``), the deliveries (runs of offsets per process)
    and the faults. Written to ``out`` too, when given."""
    from kworkers.testing.offsets_log import offsets_history, render_history

    parts = set(partitions)
    lines = [f"== evidence for {topic} partitions {sorted(parts)} (times UTC)"]
    lines.append("-- faults")
    lines += [f"{_utc(f.at)} {f.what} floors {dict(sorted(f.floors.items()))}" for f in faults]
    for part in sorted(parts):
        lines.append(f"-- partition {part}: sampler readings (changes)")
        last: int | None = None
        for s in samples:
            pos = s.positions.get(part)
            if pos != last:
                asked = "" if s.started is None else f" (asked {_utc(s.started)})"
                lines.append(f"{_utc(s.at)} {pos}{asked}")
                last = pos
        lines.append(f"-- partition {part}: deliveries (runs of offsets per process)")
        run: list[Delivery] = []
        mine = (d for d in deliveries if d.topic == topic and d.partition == part)
        for d in sorted(mine, key=lambda d: d.at):
            if run and (d.pid != run[-1].pid or d.offset != run[-1].offset + 1):
                lines.append(_run_line(run))
                run = []
            run.append(d)
        if run:
            lines.append(_run_line(run))
    try:
        history = offsets_history(bootstrap, group, topic)
        lines.append(f"-- __consumer_offsets: {len(history)} commits of {group} on {topic}")
        lines.append(render_history(history, parts))
    except Exception as exc:  # the evidence must not hide the failure it explains
        lines.append(f"-- __consumer_offsets could not be read: {exc!r}")
    names = tuple(f"{topic}[{p}]" for p in sorted(parts))
    client = tuple(f"{topic} [{p}]" for p in sorted(parts))
    for name, text in logs:
        lines.append(f"-- {name}: commits and assignments (and the client's offsets, with "
                     f"KWORKERS_TEST_CLIENT_DEBUG=cgrp,topic)")
        for line in text.splitlines():
            if line.startswith("--- start") or ("kworkers.consumer" in line and (
                    any(n in line for n in names) or
                    any(w in line for w in (" assigned ", " revoked ", " lost ")))):
                lines.append(line[:300])
            elif line.startswith("%") and _CLIENT_OFFSETS.search(line) and \
                    any(n in line for n in client):
                lines.append(_client_line(line)[:300])
    text = "\n".join(lines)
    if out is not None:
        out.write_text(text)
    return text


#: librdkafka's debug lines that say where a partition starts: the committed offset the
#: coordinator answered, a reset to ``auto.offset.reset``, the first fetch position
_CLIENT_OFFSETS = re.compile(r"OffsetFetchResponse|offset reset|start fetching at|"
                             r"back to pending list")
_CLIENT_TIME = re.compile(r"^%(\d)\|(\d+\.\d+)\|")


def _client_line(line: str) -> str:
    """A librdkafka log line with its epoch time in UTC, as the rest of the evidence."""
    m = _CLIENT_TIME.match(line)
    return line if m is None else f"{_utc(float(m.group(2)))} %{m.group(1)}{line[m.end() - 1:]}"


def _run_line(run: list[Delivery]) -> str:
    return (f"{_utc(run[0].at)}-{_utc(run[-1].at)} pid {run[0].pid} offsets "
            f"{run[0].offset}..{run[-1].offset}")
