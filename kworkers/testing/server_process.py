"""A server a test runs as a local process group (the broker, the schema registry) and can
stop, kill, pause and resume, as it would the same server in a container.

A process group of its own because the entrypoints are shell scripts that start a JVM: a
signal to the script alone would leave the JVM running (or, for SIGSTOP, serving)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path


class ServerProcess:
    def __init__(self, runner: Path, env: Mapping[str, str], log_path: Path, what: str) -> None:
        self.runner = runner
        self.env = dict(env)
        self.log_path = log_path
        #: the server's name in an error ("the broker is not running")
        self.what = what
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_ready: Callable[[Callable[[], bool]], None]) -> None:
        """Starts the server and blocks in ``wait_ready`` (given whether it still runs, so a
        server that died at start is an error at once, not a timeout)."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self._proc = proc = subprocess.Popen([str(self.runner)], env=self.env, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_ready(lambda: proc.poll() is None)

    def _signal(self, sig: int, wait: float) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)
            os.killpg(self._proc.pid, signal.SIGCONT)  # a paused server must run to stop
        try:
            self._proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)

    def stop(self) -> None:
        self._signal(signal.SIGTERM, 60)

    def kill(self) -> None:
        self._signal(signal.SIGKILL, 30)

    def _running(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        assert proc is not None and proc.poll() is None, f"the {self.what} is not running"
        return proc

    def pause(self) -> None:
        os.killpg(self._running().pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self._running().pid, signal.SIGCONT)

    def logs(self) -> str:
        path = self.log_path
        return path.read_text("utf-8", "replace") if path.exists() else ""
