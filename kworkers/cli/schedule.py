"""``kworkers schedule``: schedule a record for later, cancel it, run the scheduler worker,
create its topics.

Every command names the configured destinations (``--destination``, repeatable: the
allow-list; ``add`` allows its own ``--topic``), the ids' store (``--store``, env
``KWORKERS_STORE_URL``) and the ladder (``--thresholds``): the scheduling side and the worker
must agree on the ladder, since the rung topics are named after it (docs/SCHEDULING.md).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from kworkers.cli.options import client_options, configure_logging, log_level_option
from kworkers.cli.produce import _header
from kworkers.errors import ConfigError
from kworkers.kafka.settings import ClientSettings

F = TypeVar("F", bound=Callable[..., Any])


def _common(fn: F) -> F:
    @click.option("--store", required=True, envvar="KWORKERS_STORE_URL", metavar="URL",
                  help="The scheduled ids' store (sqlite:, postgresql:, redis:; env "
                       "KWORKERS_STORE_URL).")
    @click.option("--thresholds", default="60,3600,86400", show_default=True,
                  metavar="S,S,...", help="The ladder's rung thresholds in seconds.")
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


def _scheduler(client: ClientSettings, store: str, thresholds: str,
               destinations: tuple[str, ...]) -> Any:
    from kworkers.idempotency import open_store
    from kworkers.schedule import ScheduleLadder, Scheduler

    return Scheduler(client, open_store(store), destinations,
                     ladder=ScheduleLadder(_thresholds(thresholds)))


def _thresholds(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise ConfigError(f"--thresholds: expected seconds like 60,3600, got {text!r}") from None


def _at(text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"expected an ISO 8601 time, got {text!r}",
                                 param_hint="--at") from None
    if at.tzinfo is None:
        raise click.BadParameter("give a time zone (2030-01-01T09:00:00+00:00)",
                                 param_hint="--at")
    return at


@click.group("schedule")
def schedule() -> None:
    """Scheduled records: deliver a record to a topic at its due time (docs/SCHEDULING.md)."""


@schedule.command("add")
@client_options
@_common
@click.option("--topic", "-t", required=True, help="The destination topic.")
@click.option("--key", "-k", default=None, help="Record key (UTF-8).")
@click.option("--header", "-H", "headers", multiple=True, metavar="NAME=VALUE",
              help="A header of the record; repeat for several.")
@click.option("--at", "at_text", default=None, metavar="TIME",
              help="When: an ISO 8601 time with a zone.")
@click.option("--after", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="When: this many seconds from now.")
@click.option("--id", "sid", default=None, help="A stable id (one delivery however often "
              "scheduled; default: a fresh one).")
@click.argument("value")
def add(client: ClientSettings, store: str, thresholds: str, topic: str, key: str | None,
        headers: tuple[str, ...], at_text: str | None, after: float | None, sid: str | None,
        value: str) -> int:
    """Schedule VALUE (UTF-8) for TOPIC at --at or --after; prints its id and due time."""
    s = _scheduler(client, store, thresholds, (topic,))
    try:
        got = s.schedule(topic, value, key=key, headers=dict(_header(h) for h in headers),
                         at=_at(at_text), after=after, id=sid)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    finally:
        s.close()
    due = dt.datetime.fromtimestamp(got.due_at, dt.UTC).isoformat(timespec="milliseconds")
    click.echo(f"scheduled id={got.id} due={due} rung={got.rung_topic}")
    return 0


@schedule.command("cancel")
@click.option("--store", required=True, envvar="KWORKERS_STORE_URL", metavar="URL",
              help="The scheduled ids' store (env KWORKERS_STORE_URL).")
@click.argument("sid", metavar="ID")
def cancel(store: str, sid: str) -> int:
    """Cancel ID before its delivery; exit status 1 when its delivery had begun."""
    from kworkers.idempotency import open_store
    from kworkers.schedule import ScheduleState
    from kworkers.schedule.headers import check_id

    try:
        check_id(sid)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    st = ScheduleState(open_store(store))
    if st.cancel(sid, dt.datetime.now(dt.UTC).timestamp()):
        click.echo(f"cancelled id={sid}")
        return 0
    click.echo(f"too late: id={sid} is being or was delivered", err=True)
    return 1


@schedule.command("run")
@client_options
@_common
@click.option("--destination", "-d", "destinations", multiple=True, required=True,
              help="A destination this scheduler delivers to; repeat for several.")
@click.option("--group", "-g", required=True, help="The scheduler worker's consumer group.")
@click.option("--transactional-id", default=None,
              help="A stable name for this instance (its transactional ids derive from it).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=None,
              help="Serve /metrics, /healthz, /readyz on PORT (docs/SCHEDULING.md's metrics).")
@log_level_option
def run_scheduler(client: ClientSettings, store: str, thresholds: str,
                  destinations: tuple[str, ...], group: str,
                  transactional_id: str | None, metrics_port: int | None,
                  log_level: str) -> int:
    """Run the scheduler worker over the rungs of each --destination (exactly once)."""
    from kworkers.cli.run import run_one

    configure_logging(log_level)
    s = _scheduler(client, store, thresholds, destinations)
    s.check_topics()  # a missing rung or destination: one line naming it (and what to run)
    worker = s.worker(group, transactional_id=transactional_id)
    worker.prepare_topics()  # the worker's own tiers and DLQ, created when missing
    return run_one(worker, metrics_port)


@schedule.command("topics")
@client_options
@click.option("--thresholds", default="60,3600,86400", show_default=True,
              metavar="S,S,...", help="The ladder's rung thresholds in seconds.")
@click.option("--destination", "-d", "destinations", multiple=True, required=True,
              help="A destination to schedule for; repeat for several.")
@click.option("--partitions", type=click.IntRange(min=1), default=6, show_default=True,
              help="Partitions of each rung topic (its tiers and DLQ get as many).")
def schedule_topics(client: ClientSettings, thresholds: str, destinations: tuple[str, ...],
                    partitions: int) -> int:
    """Create the rung topics of each --destination (one per threshold, and `.due`) and the
    scheduler worker's retry tier and DLQ topics; what exists is left as it is."""
    from kworkers.schedule import ScheduleLadder, ScheduleRules
    from kworkers.schedule.scheduler import create_schedule_topics

    rules = ScheduleRules.of(ScheduleLadder(_thresholds(thresholds)), destinations)
    made = create_schedule_topics(client, rules, partitions)
    for t in made:
        click.echo(f"created {t}")
    click.echo(f"created={len(made)} rungs={len(rules.rungs)}")
    return 0
