"""``Scheduler``: schedule a record for a configured destination, cancel it, run the mover.

Scheduling writes the record to the rung of its time left (``ladder``), with its own key and
headers plus ``kw-scheduled-*``. A scheduler *worker* (``Scheduler.worker``: a kworkers
``Worker`` over every rung of every configured destination) reads the rungs into the retry
tiers' bounded timer heap (``TierGate``, under ``ScheduleRules``), and when a record's release
time comes either moves it to the next rung down or, once due, delivers it to its destination.

Delivered once: the worker runs ``guarantee="exactly_once"``: the move or the delivery is a
handler output (``activity.produce``), committed in one Kafka transaction with the rung
record's offset, so a crash at any point aborts both and the record is read again. Duplicates
of an id and cancellations are decided by the id's state in the store (``state``).
Destinations come from configuration only: a rung belongs to one configured destination, and
a record's headers never name where it goes.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kworkers import preflight
from kworkers.activity import produce as produce_output
from kworkers.clock import Clock, SystemClock
from kworkers.config import WorkerConfig
from kworkers.consumer.commit import CommitPolicy
from kworkers.errors import ConfigError, KworkersError
from kworkers.idempotency.store import IdempotencyStore
from kworkers.kafka import clients
from kworkers.kafka.admin import create_topics
from kworkers.kafka.producer import KafkaSender
from kworkers.kafka.settings import ClientSettings, producer_settings
from kworkers.message import Headers, Message
from kworkers.metrics import Metrics
from kworkers.retry_tiers.headers import origin_of
from kworkers.schedule.headers import (
    SCHEDULED_PREFIX,
    check_id,
    delivered_headers,
    rung_headers,
)
from kworkers.schedule.ladder import ScheduleLadder
from kworkers.schedule.rules import Admitted, ScheduleRules
from kworkers.schedule.state import ScheduleState, Verdict
from kworkers.topic_plan import TopicSpec
from kworkers.worker import Worker

#: the scheduler worker's transaction interval (a hop's lateness is at most about this)
COMMIT_INTERVAL_S = 0.1
#: how long ``schedule`` waits for the broker's acknowledgement
SEND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Scheduled:
    """A record scheduled: its id, due time and the rung topic it waits in first."""

    id: str
    due_at: float
    rung_topic: str


def due_time(now: float, at: dt.datetime | float | None, after: float | None) -> float:
    """The due time from ``at`` (an aware datetime, or epoch seconds) or ``after`` (seconds
    from ``now``): exactly one of them. ValueError with the reason otherwise."""
    if (at is None) == (after is None):
        raise ValueError("schedule: give exactly one of at= (a time) or after= (seconds)")
    if after is not None:
        if not isinstance(after, (int, float)) or not after >= 0:
            raise ValueError(f"schedule: after= must be seconds >= 0, got {after!r}")
        return now + float(after)
    if isinstance(at, dt.datetime):
        if at.tzinfo is None:
            raise ValueError("schedule: at= must be a timezone-aware datetime (a naive one "
                             "has no single instant)")
        return at.timestamp()
    if isinstance(at, (int, float)) and at >= 0:
        return float(at)
    raise ValueError(f"schedule: at= must be an aware datetime or epoch seconds, got {at!r}")


def _headers(headers: Mapping[str, str | bytes] | Headers | None) -> Headers:
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
    out: list[tuple[str, bytes]] = []
    for k, v in items:
        if not isinstance(k, str) or k.startswith("kw-"):
            raise ValueError(f"schedule: header {k!r}: kw-* headers are kworkers' own")
        if not isinstance(v, (str, bytes)):
            raise ValueError(f"schedule: header {k!r}: a value is str or bytes, got {v!r:.40}")
        out.append((k, v.encode() if isinstance(v, str) else v))
    return tuple(out)


def _bytes(obj: str | bytes | None, what: str) -> bytes | None:
    if obj is None or isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode()
    raise ValueError(f"schedule: {what} must be bytes, str or None, got {type(obj).__name__}")


class Scheduler:
    """Scheduled records for the configured ``destinations``, their state in ``store``."""

    def __init__(self, bootstrap_servers: str | ClientSettings, store: IdempotencyStore,
                 destinations: Iterable[str], *, ladder: ScheduleLadder | None = None,
                 clock: Clock | None = None, metrics: Metrics | None = None,
                 producer_config: Mapping[str, Any] | None = None) -> None:
        self.client = (bootstrap_servers if isinstance(bootstrap_servers, ClientSettings)
                       else ClientSettings(bootstrap_servers))
        self.destinations = tuple(dict.fromkeys(destinations))
        if not self.destinations:
            raise ConfigError("a Scheduler needs at least one destination topic")
        self.ladder = ladder or ScheduleLadder()
        self.rules = ScheduleRules.of(self.ladder, self.destinations)  # checks the names
        self.state = ScheduleState(store)
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self._producer_conf = producer_settings(self.client, producer_config)
        #: one idempotent producer for every schedule call (made on first use)
        self._producer: KafkaSender | None = None
        self._lock = threading.Lock()
        #: rung topics seen on the cluster (``_check_rung``)
        self._present: set[str] = set()

    def topics(self) -> tuple[str, ...]:
        """Every rung topic of every destination (what the scheduler worker consumes)."""
        return tuple(self.rules.rungs)

    # ---------------------------------------------------------------- scheduling
    def schedule(self, topic: str, value: str | bytes | None, key: str | bytes | None = None,
                 headers: Mapping[str, str | bytes] | Headers | None = None, *,
                 at: dt.datetime | float | None = None, after: float | None = None,
                 id: str | None = None) -> Scheduled:
        """Deliver ``value`` (with ``key`` and ``headers``) to ``topic`` at ``at`` or
        ``after`` seconds; ``id`` makes it one delivery however often it is scheduled (a
        fresh one otherwise). Returns once the record is durable in its first rung."""
        if topic not in self.destinations:
            raise ConfigError(f"schedule: {topic!r} is not a configured destination "
                              f"(configured: {', '.join(self.destinations)})")
        now = self.clock.now()
        due = due_time(now, at, after)
        if due - now > self.ladder.max_ahead:
            raise ValueError(f"schedule: due {due - now:.0f} s from now, more than the "
                             f"{self.ladder.max_ahead:g} s a record may be scheduled ahead")
        sid = check_id(id if id is not None else uuid.uuid4().hex)
        hop = self.ladder.plan(due, now)
        rung = self.ladder.topics(topic)[hop.rung]
        hs = rung_headers(_headers(headers), sid, due, now, hop.release_at)
        self._check_rung(rung)
        self._write(rung, _bytes(key, "key"), _bytes(value, "value"), hs)
        return Scheduled(sid, due, rung)

    def _write(self, topic: str, key: bytes | None, value: bytes | None,
               headers: Headers) -> None:
        """Produce and wait for the broker's acknowledgement (``KworkersError`` if refused)."""
        acked = threading.Event()
        failed: list[BaseException] = []

        def done(exc: BaseException | None) -> None:
            if exc is not None:
                failed.append(exc)
            acked.set()

        with self._lock:
            if self._producer is None:
                self._producer = KafkaSender(self._producer_conf)
            sender = self._producer
        sender.send(topic, key, value, headers, done)
        if not acked.wait(SEND_TIMEOUT_S):
            failed.append(TimeoutError("no acknowledgement"))
        if failed:
            raise KworkersError(f"schedule: not written to {topic}: {failed[0]}")

    def create_topics(self, partitions: int = 6, **worker_settings: Any) -> list[str]:
        """Create the rung topics (``partitions`` each) and the retry tier and DLQ topics of
        a scheduler worker with ``worker_settings`` (its ``tiers``) that are missing; returns
        the names created (``kworkers schedule topics``)."""
        return create_schedule_topics(self.client, self.rules, partitions, **worker_settings)

    def topics_command(self) -> str:
        """``kworkers schedule topics`` as it works when pasted, for this scheduler."""
        dests = " ".join(f"-d {d}" for d in self.destinations)
        ts = ",".join(f"{t:g}" for t in self.ladder.thresholds)
        return (f"kworkers schedule topics -b {self.client.bootstrap_servers} {dests} "
                f"--thresholds {ts}")

    def check_topics(self) -> None:
        """``ConfigError`` naming the first missing topic a scheduler worker needs: a rung
        (with the command that creates them), or a destination (yours to create: its
        partitions and retention are your decision)."""
        have = clients.list_topics(self.client)  # KafkaUnreachable: one line
        for rung in self.topics():
            if rung not in have:
                self._check_rung(rung)
        gone = [d for d in self.destinations if d not in have]
        if gone:
            raise ConfigError(f"schedule: destination topic {', '.join(gone)} does not exist on "
                              f"{self.client.bootstrap_servers}; create it first (its "
                              "partitions and retention are yours to choose)")

    def _check_rung(self, topic: str) -> None:
        """A rung that does not exist is said at once, naming it and how to create the
        scheduler's topics (a produce to it would wait out its delivery timeout for an
        acknowledgement that never comes). Asked once per rung; one that exists is not asked
        again."""
        if topic in self._present:
            return
        have = clients.list_topics(self.client)  # KafkaUnreachable: one line
        if topic not in have:
            raise ConfigError(f"schedule: rung topic {topic} does not exist on "
                              f"{self.client.bootstrap_servers}; create the scheduler's "
                              f"topics: `{self.topics_command()}`")
        self._present.update(t for t in self.topics() if t in have)

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.close(SEND_TIMEOUT_S)
                self._producer = None

    def cancel(self, sid: str) -> bool:
        """Cancel ``sid`` before it is delivered: True when it will not be delivered (now, or
        it was cancelled before), False when its delivery had begun."""
        return self.state.cancel(check_id(sid), self.clock.now())

    # ---------------------------------------------------------------- the mover
    def handle(self, msg: Message) -> None:
        """The scheduler worker's handler for a released rung record: move it closer, or
        deliver it once due (never before: the clock is read again here)."""
        o = origin_of(msg)  # the rung it was first read from, when it comes from a retry tier
        now = self.clock.now()
        adm: Admitted = self.rules.check(msg._replace(topic=o.topic), now)
        info, dest = adm.info, adm.destination
        if info.due_at > now:
            hop = self.ladder.plan(info.due_at, now)
            produce_output(self.ladder.topics(dest)[hop.rung], msg.value, key=msg.key,
                           headers=rung_headers(msg.headers, info.id, info.due_at,
                                                info.scheduled_at, hop.release_at))
            self.metrics.scheduled_records.labels(dest, "moved").inc()
            return
        verdict = self.state.claim_delivery(info.id, f"{o.topic}/{o.partition}@{o.offset}", now)
        if verdict is Verdict.DELIVER:
            produce_output(dest, msg.value, key=msg.key,
                           headers=delivered_headers(msg.headers, info, now))
            self.metrics.schedule_lateness.labels(dest).observe(max(0.0, now - info.due_at))
        self.metrics.scheduled_records.labels(dest, verdict.value if verdict is not
                                              Verdict.DELIVER else "delivered").inc()

    def worker(self, group_id: str, **settings: Any) -> Worker:
        """The scheduler worker: exactly once over every rung, this scheduler's handler."""
        if settings.get("guarantee", "exactly_once") != "exactly_once":
            raise ConfigError("a scheduler worker runs guarantee='exactly_once': a move or a "
                              "delivery commits with its rung record's offset")
        settings["guarantee"] = "exactly_once"
        # a move or a delivery is seen (and the next rung reads it) only once its transaction
        # commits: at the default 1 s interval each hop would add up to a second of lateness
        settings.setdefault("commit", CommitPolicy(interval_s=COMMIT_INTERVAL_S))
        settings.setdefault("client_config", {**self.client.security, **self.client.overrides})
        w = Worker(topics=self.topics(), group_id=group_id,
                   bootstrap_servers=self.client.bootstrap_servers, metrics=self.metrics,
                   clock=self.clock, hold=self.rules, **settings)
        w.handler(self.handle)
        return w


def create_schedule_topics(client: ClientSettings, rules: ScheduleRules, partitions: int = 6,
                           **worker_settings: Any) -> list[str]:
    """The rung topics of ``rules`` (``partitions`` each), then the retry tier and DLQ
    topics their scheduler worker (``worker_settings``: its ``tiers``) needs, sized like
    the rungs; the ones created. No store is needed: nothing is scheduled."""
    made = create_topics(clients.admin(client), [TopicSpec(t, partitions) for t in rules.rungs])
    cfg = WorkerConfig(topics=tuple(rules.rungs), group_id="kworkers-scheduler",
                       bootstrap_servers=client.bootstrap_servers,
                       client_config={**client.security, **client.overrides},
                       **worker_settings)
    return made + preflight.create_topics(cfg, partitions)


__all__ = ["SCHEDULED_PREFIX", "Scheduled", "Scheduler", "create_schedule_topics", "due_time"]
