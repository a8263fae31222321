"""``kworkers run MODULE:WORKER``: load a worker, apply outside settings, run one or N processes.

Settings come from flags, then ``KWORKERS_*`` variables, then the ``--config`` file, then the
worker module's own config (``kworkers.settings``); the worker is checked against the cluster
(reachable, credentials accepted, its topics there or created) before anything starts, so every
mistake is one line. ``--processes N`` runs N of them under one parent (``kworkers.cli.pool``).
"""

from __future__ import annotations

import faulthandler
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import click

from kworkers import settings
from kworkers.cli import child_secrets, collector, parent_watch
from kworkers.cli.options import (
    bootstrap_option,
    config_option,
    configure_logging,
    property_option,
    remember,
)
from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError
from kworkers.metrics import MetricsServer
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
    except ConfigError:
        raise  # a setting the module's config refused: its own line says which
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


def configure(target: str, flags: Mapping[str, object], environ: Mapping[str, str],
              config_path: str | None) -> Worker:
    """The worker of ``target`` with the outside settings applied (no broker needed)."""
    worker = load_target(target)
    config = settings.resolve(worker.config, flags, environ, config_path)
    remember(config.client)
    return with_config(worker, config)


def prepare(target: str, flags: Mapping[str, object], environ: Mapping[str, str],
            config_path: str | None) -> Worker:
    """Load, configure and pre-flight a worker: every mistake surfaces here as one line."""
    worker = configure(target, flags, environ, config_path)
    worker.prepare_topics()  # KafkaUnreachable: one line, within ~10 s
    return worker


def _mark_ready(worker: Worker) -> None:
    """Keeps ``kworkers_worker_ready`` (and the process counts, the group's too) at 1 while the
    worker is ready (it polls and nothing is degraded), 0 otherwise (a pool parent's /readyz
    counts them; a dashboard counts a group's ready replicas by its group's gauge)."""
    by_group = worker.metrics.group_processes_ready.labels(worker.config.group_id)

    def wait() -> None:
        while True:
            ready = 1 if worker.ready else 0
            worker.metrics.worker_ready.set(ready)
            worker.metrics.worker_processes_ready.set(ready)
            by_group.set(ready)
            time.sleep(0.1 if not worker.ready else 1.0)

    threading.Thread(target=wait, name="kworkers-ready", daemon=True).start()


def run_one(worker: Worker, metrics_port: int | None) -> int:
    server = None
    _mark_ready(worker)
    if metrics_port is not None:
        server = MetricsServer(worker.metrics, metrics_port,
                               unready=lambda: worker.unready_reason,
                               fault=lambda: worker.fault).start()
        worker.supervisor.watch("kworkers-metrics", server.alive)
        log.info("metrics on :%d (/metrics, /healthz, /readyz)", server.port)
    try:
        worker.run()  # WorkerFailed: one line, exit 1 (the orchestrator restarts the pod)
    finally:
        if server is not None:
            server.close()
    return 0


def _native_crashes_leave_a_stack() -> None:
    """A crash in native code (librdkafka's failed assertion after a broker pause aborted a
    worker with no word of its own, issue #43) leaves every thread's Python stack on stderr.
    An stderr that is not a file (a caller capturing it) gets none."""
    try:
        faulthandler.enable(sys.stderr, all_threads=True)
    except (OSError, ValueError, AttributeError):
        log.debug("stderr is not a file: no faulthandler stack for a native crash")


@click.command()
@click.argument("target", metavar="MODULE:WORKER")
@click.option("--processes", "-p", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes; each is a full Worker (a member of the group).")
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=None,
              help="Handler executions at once per process (env KWORKERS_CONCURRENCY).")
@click.option("--max-in-flight-bytes", "max_in_flight_bytes", default=None, metavar="SIZE",
              help="Bytes of records each poll loop may hold, such as 256MiB (env "
                   "KWORKERS_MAX_IN_FLIGHT_BYTES; docs/CONFIG.md: the worker's memory).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=None,
              help="Serve /metrics, /healthz, /readyz on PORT. With --processes N the "
                   "parent serves the pool there: its processes' metrics summed, ready when "
                   "every process is (kworkers_worker_processes_ready counts them).")
@config_option
@bootstrap_option
@property_option
@click.option("--group", "group_id", default=None, help="Consumer group (env KWORKERS_GROUP_ID).")
@click.option("--topic", "topics_", multiple=True, help="Source topic; repeat for several.")
@click.option("--rate-limit", "rate_limit", default=None, metavar="RATE",
              help="Handler starts per second for the whole pool, such as 50/s or 600/m "
                   "(env KWORKERS_RATE_LIMIT_PER_SECOND; a pool-wide limit needs the worker's "
                   "PostgreSQL or Redis store, else set rate_limit.scope=replica).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--gc-young-threshold", "gc_young", type=click.IntRange(min=1),
              default=collector.DEFAULT_YOUNG, show_default=True,
              envvar="KWORKERS_GC_YOUNG_THRESHOLD",
              help="The interpreter's cyclic collector: a young-generation pass after this "
                   "many tracked objects (CPython's own is 700; env "
                   "KWORKERS_GC_YOUNG_THRESHOLD). Set before MODULE is imported, so a module "
                   "that sets its own keeps it (docs/CONFIG.md: the garbage collector).")
@click.option(child_secrets.FD_OPTION, "secrets_fd", type=int, default=None, hidden=True)
@click.option(parent_watch.PARENT_OPTION, "parent_pid", type=int, default=None, hidden=True)
def run(target: str, processes: int, concurrency: int | None,
        max_in_flight_bytes: str | None, metrics_port: int | None,
        config_path: str | None, bootstrap: str | None, properties: tuple[str, ...],
        group_id: str | None, topics_: tuple[str, ...], rate_limit: str | None,
        log_level: str, gc_young: int, secrets_fd: int | None, parent_pid: int | None) -> int:
    """Run the Worker MODULE:WORKER (an instance, or a zero-argument factory returning one).

    Settings: flags > KWORKERS_* environment > --config file > the Worker's own config.
    Missing retry tier and DLQ topics are created, sized like their source topic (set
    KWORKERS_AUTO_CREATE_TOPICS=false to require them instead). SIGTERM or Ctrl-C drains
    in-flight work, commits and leaves the group; a second one exits at once.
    """
    from kworkers.cli.pool import run_pool

    _native_crashes_leave_a_stack()
    configure_logging(log_level)
    # a pool's child: the secrets its parent was given come through a pipe, as if by -X
    passed = child_secrets.read(secrets_fd) if secrets_fd is not None else {}
    per_second = None if rate_limit is None else settings.parse_rate(rate_limit, "--rate-limit")
    flags: dict[str, object] = {"concurrency": concurrency, "group_id": group_id,
                                "max_in_flight_bytes": max_in_flight_bytes,
                                "topics": topics_ or None,
                                "rate_limit.per_second": per_second,
                                **settings.client_flags(bootstrap, (
                                    *properties, *(f"{k}={v}" for k, v in passed.items())))}
    collector.set_young_threshold(gc_young)  # before the module: its own setting wins
    worker = prepare(target, flags, os.environ, config_path)
    if collector.young_threshold() != gc_young:
        log.info("the collector's young threshold is %d, as %s set it (not %d)",
                 collector.young_threshold(), target, gc_young)
    if processes == 1:
        if parent_pid is not None:  # a pool's child: it stops when the pool's parent is gone
            parent_watch.start(parent_pid)
        return run_one(worker, metrics_port)
    shown, secret = child_secrets.split_properties(properties)
    child: list[str] = [target, "--log-level", log_level, "--gc-young-threshold", str(gc_young)]
    if config_path is not None:
        child += ["--config", config_path]
    for opt, value in (("--concurrency", concurrency),
                       ("--max-in-flight-bytes", max_in_flight_bytes), ("--bootstrap", bootstrap),
                       ("--group", group_id), ("--rate-limit", rate_limit)):
        if value is not None:
            child += [opt, str(value)]
    for t in topics_:
        child += ["--topic", t]
    for prop in shown:
        child += ["-X", prop]
    # secrets never on a child's command line nor in its environment (kworkers.cli.child_secrets)
    return run_pool(child, processes, metrics_port,
                    env=child_secrets.child_environment(os.environ),
                    secrets=child_secrets.secrets_for_children(os.environ, secret))
