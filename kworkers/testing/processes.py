"""Worker processes a fault test can start, SIGTERM and SIGKILL, and a pool that restarts them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kworkers.testing.checker import FaultLog


def _stat(pid: str | int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (state first), or None."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a ``--processes`` pool's children)."""
    return sorted(int(d.name) for d in Path("/proc").glob("[0-9]*")
                  if (f := _stat(d.name)) is not None and int(f[1]) == pid)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's new parent may not have reaped it yet)."""
    f = _stat(pid)
    return f is not None and f[0] != "Z"


class WorkerProcess:
    def __init__(self, args: Sequence[str], log_dir: Path, name: str,
                 cwd: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.args = [sys.executable, *args]
        #: variables of this process beside the test's own
        self.env = dict(env or {})
        self.log_path = log_dir / f"{name}.log"
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> WorkerProcess:
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        log.write(f"--- start {self.starts}\n".encode())
        log.flush()
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.cwd, env=env, start_new_session=True)
        log.close()
        return self

    def ready_since_start(self) -> bool:
        """Whether the process started last has said ``worker ready`` (the test apps print it
        once their worker runs: its signal handlers are in)."""
        text = self.log()
        return "worker ready" in text.rsplit(f"--- start {self.starts}\n", 1)[-1]

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> int:
        """SIGKILL: no drain, no commit, no leave; the group notices after session.timeout."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(30)

    def terminate(self, timeout: float = 90.0) -> int:
        """SIGTERM: the worker drains, commits and leaves; returns its exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(30)

    def log(self) -> str:
        return self.log_path.read_text("utf-8", "replace") if self.log_path.exists() else ""


def keep_alive(workers: Sequence[WorkerProcess],
               faults: FaultLog | None = None) -> Callable[[], None]:
    """A tick that starts every worker not running; a worker that died (killed by the test or
    by its own kill point) is recorded in ``faults`` as the victim, with the commit floors of
    that moment, before it is started again."""

    def tick() -> None:
        for w in workers:
            if w.alive:
                continue
            if w.proc is not None and faults is not None:
                code = w.proc.returncode
                faults.record(f"{w.log_path.stem} (pid {w.proc.pid}) exited {code}",
                              victim_pid=w.proc.pid)
            w.start()

    return tick


def health(port: int) -> int:
    """A worker's ``/healthz`` status over HTTP (0: not answering): read from outside, as an
    orchestrator's probe reads it."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0
