"""``kworkers run MODULE:WORKER``: load a worker, apply outside settings, run one or N processes.

Why N processes and not N threads: handlers are Python, and one process's GIL caps CPU-bound
handlers at one core; ``--processes`` is the cheap way to use the machine before scaling pods.

Why the children are fresh interpreters (``python -m kworkers.cli run ... --processes 1``)
rather than ``os.fork()`` of the parent: the parent has already talked to the broker (it checks
the topics before starting anything, so a typo fails once, in one line), and librdkafka's
threads and locks do not survive a fork. A fresh process per child imports the worker module
the same way the parent did, and nothing is shared but the command line.

The parent puts each child in a session of its own, so a terminal's Ctrl-C reaches the parent
once and is forwarded once (a second signal makes a worker exit at once, and a Ctrl-C sent to
the whole process group would count twice). It exits 0 only when every child exited 0; when a
child fails on its own, the parent stops the others, so a supervisor sees one failed pool and
restarts it, instead of a pool quietly running short.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from kworkers import settings
from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError
from kworkers.metrics import MetricsServer, MultiProcessMetrics
from kworkers.worker import Worker

log = logging.getLogger("kworkers.cli")


def load_target(spec: str) -> Worker:
    """The ``Worker`` named by ``module:attr`` (an instance, or a zero-argument factory)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"expected MODULE:WORKER (e.g. myapp.workers:worker), got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` does: the current project is importable
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise ConfigError(f"cannot import module {module_name!r}: no such module "
                              f"(from {cwd})") from None
        raise ConfigError(f"importing {module_name!r} failed: {type(exc).__name__}: "
                          f"{exc}") from None
    except Exception as exc:
        raise ConfigError(f"importing {module_name!r} failed: {type(exc).__name__}: "
                          f"{exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, Worker):
        return obj
    if callable(obj):
        try:
            made = obj()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"{spec}() failed: {type(exc).__name__}: {exc}") from None
        if isinstance(made, Worker):
            return made
        raise ConfigError(f"{spec}() returned a {type(made).__name__}, not a kworkers.Worker")
    raise ConfigError(f"{spec} is a {type(obj).__name__}, not a kworkers.Worker or a factory")


def with_config(worker: Worker, config: WorkerConfig) -> Worker:
    """A worker like ``worker`` with another config (``Worker.with_config``)."""
    return worker.with_config(config)


def prepare(target: str, flags: Mapping[str, object], environ: Mapping[str, str],
            config_path: str | None) -> Worker:
    """Load, configure and pre-flight a worker: every mistake surfaces here as one line."""
    worker = load_target(target)
    config = settings.resolve(worker.config, flags, environ, config_path)
    worker = with_config(worker, config)
    worker.check_topics()  # KafkaUnreachable: one line, within ~10 s
    return worker


def _mark_ready(worker: Worker) -> None:
    """Sets ``kworkers_worker_ready`` once the worker polls (a pool parent's /readyz sums it)."""
    def wait() -> None:
        while not worker.ready:
            time.sleep(0.1)
        worker.metrics.worker_ready.set(1)

    threading.Thread(target=wait, name="kworkers-ready", daemon=True).start()


def run_one(worker: Worker, metrics_port: int | None) -> int:
    server = None
    _mark_ready(worker)
    if metrics_port is not None:
        server = MetricsServer(worker.metrics, metrics_port, ready=lambda: worker.ready).start()
        log.info("metrics on :%d (/metrics, /healthz, /readyz)", server.port)
    try:
        worker.run()
    finally:
        if server is not None:
            server.close()
    return 0


def run_pool(child_args: Sequence[str], processes: int, metrics_port: int | None) -> int:
    """Start ``processes`` children, forward SIGTERM/SIGINT, wait for all of them."""
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop_all(sig: int) -> None:
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
    env = dict(os.environ)
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
            args = [sys.executable, "-m", "kworkers.cli", "run", *child_args, "--processes", "1"]
            children.append(subprocess.Popen(args, start_new_session=True, env=env))
            if stopping:
                stop_all(signal.SIGTERM)
        codes: dict[int, int] = {}
        while len(codes) < len(children):
            for i, c in enumerate(children):
                if i in codes:
                    continue
                rc = c.poll()
                if rc is None:
                    continue
                codes[i] = rc
                if rc != 0 and not stopping:
                    log.error("worker process %d (pid %d) exited with %d: stopping the others",
                              i, c.pid, rc)
                    stopping = True
                    stop_all(signal.SIGTERM)
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
        log.error("worker processes failed: %s", ", ".join(f"#{i} exit {rc}"
                                                           for i, rc in sorted(failed.items())))
        return 1
    return 0
