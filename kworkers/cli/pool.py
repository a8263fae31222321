"""``kworkers run --processes N``: N worker processes under one parent.

Why N processes and not N threads: handlers are Python, and one process's GIL caps CPU-bound
handlers at one core; ``--processes`` is the cheap way to use the machine before scaling pods.

Why the children are fresh interpreters (``python -m kworkers.cli run ... --processes 1``)
rather than ``os.fork()`` of the parent: the parent has already talked to the broker (it checks
the topics before starting anything, so a typo fails once, in one line), and librdkafka's
threads and locks do not survive a fork. A fresh process per child imports the worker module
the same way the parent did, and nothing is shared but the command line, the environment
and a pipe with the secrets (``kworkers.cli.child_secrets``: never on a command line).

The parent puts each child in a session of its own, so a terminal's Ctrl-C reaches the parent
once and is forwarded once (a second signal makes a worker exit at once, and a Ctrl-C sent to
the whole process group would count twice). So a child is told its parent's pid and stops by
itself when the parent is gone without a word (``kworkers.cli.parent_watch``). It exits 0
only when every child exited 0; when a child fails on its own, the parent stops the others, so
a supervisor sees one failed pool and restarts it, instead of a pool quietly running short.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from kworkers.cli.child_secrets import attach
from kworkers.cli.parent_watch import PARENT_OPTION
from kworkers.metrics import MetricsServer, MultiProcessMetrics, mark_process_dead

log = logging.getLogger("kworkers.cli")


def run_pool(child_args: Sequence[str], processes: int, metrics_port: int | None,
             env: Mapping[str, str] | None = None,
             secrets: Mapping[str, str] | None = None) -> int:
    """Start ``processes`` children, forward SIGTERM/SIGINT, wait for all of them.

    ``env``: the children's environment (default: this process's); ``secrets``: client
    properties each child reads from a pipe of its own (``kworkers.cli.child_secrets``)."""
    children: list[subprocess.Popen[bytes]] = []
    stopping = False
    #: the signals this parent sent its children (``counted``)
    sent: set[int] = set()

    def stop_all(sig: int) -> None:
        sent.add(sig)
        for c in children:
            if c.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    c.send_signal(sig)

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        log.info("signal %d: forwarding to %d worker processes", signum, len(children))
        stop_all(signum)

    # One /metrics for the pool: children write their values to a shared directory
    # (prometheus-client's multiprocess mode) and this parent serves the sum.
    env = dict(os.environ if env is None else env)
    server: MetricsServer | None = None
    mp_dir: str | None = None
    if metrics_port is not None:
        mp_dir = tempfile.mkdtemp(prefix="kworkers-metrics-")
        env["PROMETHEUS_MULTIPROC_DIR"] = mp_dir
        pool_metrics = MultiProcessMetrics(mp_dir)
        server = MetricsServer(
            pool_metrics, metrics_port,
            ready=lambda: (all(c.poll() is None for c in children)
                           and pool_metrics.ready_workers() >= processes)).start()
        log.info("metrics of %d processes on :%d", processes, server.port)
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for _ in range(processes):
            args, fd = attach([sys.executable, "-m", "kworkers.cli", "run", *child_args,
                               "--processes", "1", PARENT_OPTION, str(os.getpid())],
                              secrets or {})
            try:
                children.append(subprocess.Popen(args, start_new_session=True, env=env,
                                                 pass_fds=() if fd is None else (fd,)))
            finally:
                if fd is not None:
                    os.close(fd)
            if stopping:
                stop_all(signal.SIGTERM)
        codes: dict[int, int] = {}
        while len(codes) < len(children):
            for i, c in enumerate(children):
                if i in codes:
                    continue
                raw = c.poll()
                if raw is None:
                    continue
                rc = codes[i] = counted(raw, sent)
                if rc != raw:
                    log.info("worker process %d (pid %d) was stopped by the %s it was sent "
                             "before it had started (it had taken no record)", i, c.pid,
                             signal.Signals(-raw).name)
                if mp_dir is not None:  # its live gauges leave the pool's sums and minima
                    mark_process_dead(c.pid, mp_dir)
                if rc != 0 and not stopping:
                    log.error("worker process %d (pid %d) %s: stopping the others", i, c.pid,
                              exit_text(rc))
                    stopping = True
                    stop_all(signal.SIGTERM)
                elif rc < 0 and -rc not in (signal.SIGTERM, signal.SIGINT):
                    log.error("worker process %d (pid %d) %s", i, c.pid, exit_text(rc))
            time.sleep(0.1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if server is not None:
            server.close()
        if mp_dir is not None:
            shutil.rmtree(mp_dir, ignore_errors=True)
    failed = {i: rc for i, rc in codes.items() if rc != 0}
    if failed:
        log.error("worker processes failed: %s", ", ".join(f"#{i} {exit_text(rc)}"
                                                           for i, rc in sorted(failed.items())))
        return 1
    return 0


def counted(rc: int, sent: set[int]) -> int:
    """A child's exit status as the pool counts it: killed by a signal this parent sent it (a
    SIGTERM forwarded to it, or the stop after another child failed) is a clean stop. A child
    installs its handlers before it subscribes and restores them after it has left the group,
    so the signal's default action can only have ended it before its first record or after
    its last commit. (Seen in CI: a child still importing when the pool was told to stop was
    counted as failed, and the pool exited 1.)"""
    return 0 if rc < 0 and -rc in sent else rc


#: signals of a crash in native code (the client library's assertion, a segfault)
_NATIVE = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}


def exit_text(rc: int) -> str:
    """How a child ended, for the one line the parent writes: its exit status, or the signal
    that killed it and what that usually means."""
    if rc >= 0:
        return f"exited with {rc}"
    try:
        sig = signal.Signals(-rc)
    except ValueError:
        return f"was killed by signal {-rc}"
    why = ""
    if sig in _NATIVE:
        why = " (a crash in native code: its Python stack, from faulthandler, is in its output)"
    elif sig is signal.SIGKILL:
        why = " (kill -9, or the kernel's OOM killer)"
    return f"was killed by {sig.name} (signal {-rc}){why}"
