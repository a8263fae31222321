"""The clients kworkers makes, built from one ``ClientSettings`` (an adapter module).

Every admin client, topic reader, share consumer and transactional producer comes from here,
with the configuration ``kworkers.kafka.settings`` gives its role, so no module builds a client
dictionary of its own. Client trouble becomes a ``ConfigError`` with one line an operator can
act on: a property librdkafka refuses, a cluster that cannot be reached (``KafkaUnreachable``),
credentials it refuses (said at once, not after the connect timeout), a missing topic
(``TopicNotFound``). Secret values are masked out of every such message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import ClusterMetadata

from kworkers.errors import ConfigError
from kworkers.kafka import diagnose, tls_probe
from kworkers.kafka.settings import (
    ClientSettings,
    ReadAhead,
    admin_settings,
    as_client,
    reader_settings,
    share_consumer_settings,
    transactional_producer_settings,
)

#: How long to wait for a broker to answer before saying it cannot be reached.
CONNECT_TIMEOUT = 10.0
#: Errors that mean "these credentials are refused": no point waiting for the timeout.
_AUTH_ERRORS = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
T = TypeVar("T")


class KafkaUnreachable(ConfigError):
    """No broker answered at the bootstrap address (or it refused the credentials)."""

    def __init__(self, bootstrap: str, detail: str = "") -> None:
        tail = f" ({detail})" if detail else ""
        super().__init__(f"cannot reach Kafka at {bootstrap}{tail}")
        self.bootstrap = bootstrap


class TopicNotFound(ConfigError):
    """A topic the operator named does not exist."""

    def __init__(self, topic: str, bootstrap: str, hint: str = "") -> None:
        tail = f"; {hint}" if hint else ""
        super().__init__(f"topic {topic!r} does not exist on {bootstrap}{tail}")
        self.topic = topic


def reason(exc: BaseException) -> str:
    """The client's own text for an error (it names the failure, never the credentials)."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    return err.str() if isinstance(err, KafkaError) else str(err)


def _build(make: Callable[[dict[str, Any]], T], conf: Mapping[str, Any],
           client: ClientSettings) -> T:
    try:
        return make(dict(conf))
    except (KafkaException, ValueError, TypeError) as exc:
        text = reason(exc)
        cause = diagnose.from_error(client, text) if "ssl." in text else None
        raise ConfigError(f"client settings: {client.redact(cause or text)}") from None


def admin(client: ClientSettings | str, **callbacks: Any) -> AdminClient:
    c = as_client(client)
    return _build(AdminClient, {**admin_settings(c), **callbacks}, c)


def share_consumer(client: ClientSettings | str, group: str,
                   overrides: Mapping[str, Any] | None = None) -> ShareConsumer:
    c = as_client(client)
    return _build(ShareConsumer, share_consumer_settings(c, group, overrides), c)


def reader(client: ClientSettings | str, group: str = "kworkers-reader",
           read_ahead: ReadAhead | None = None) -> Consumer:
    c = as_client(client)
    return _build(Consumer, reader_settings(c, group, read_ahead), c)


def transactional_producer(client: ClientSettings | str, transactional_id: str,
                           transaction_timeout_ms: int = 30_000,
                           overrides: Mapping[str, Any] | None = None) -> Producer:
    c = as_client(client)
    return _build(Producer, transactional_producer_settings(
        c, transactional_id, transaction_timeout_ms, overrides), c)


def unreachable(client: ClientSettings | str, exc: BaseException) -> KafkaUnreachable:
    """``exc`` (a client error while talking to the cluster) as one operator line."""
    c = as_client(client)
    return KafkaUnreachable(c.bootstrap_servers, c.redact(reason(exc)))


def metadata(client: ClientSettings | str, timeout: float = CONNECT_TIMEOUT) -> ClusterMetadata:
    """The cluster's metadata; ``KafkaUnreachable`` when nobody answers within ``timeout``, at
    once when the credentials or the TLS certificates are refused, naming the cause
    (``kworkers.kafka.diagnose``)."""
    c = as_client(client)
    seen: list[KafkaError] = []
    a = admin(c, error_cb=seen.append)
    deadline = time.monotonic() + timeout
    probed = False
    while True:
        left = deadline - time.monotonic()
        try:
            return a.list_topics(timeout=max(0.1, min(1.0, left)))
        except KafkaException as exc:
            a.poll(0)  # serves the error callback
            cause = _refused(c, seen)
            if cause is None and not probed and any(
                    e.code() == KafkaError._ALL_BROKERS_DOWN for e in seen):
                probed = True  # a protocol that does not match the listener: said at once
                cause = diagnose.protocol_mismatch(c, _probe_bootstrap(c))
            if cause is not None:
                raise KafkaUnreachable(c.bootstrap_servers, c.redact(cause)) from None
            if left <= 1.0:
                raise KafkaUnreachable(c.bootstrap_servers,
                                       c.redact(_no_answer(c, seen) or reason(exc))) from None
            time.sleep(0.1)  # a refused connection fails at once: do not spin


def _refused(c: ClientSettings, seen: list[KafkaError]) -> str | None:
    """The cause of the first error that will not go away by waiting: credentials refused, a
    certificate that does not verify, a TLS alert from the broker."""
    for err in seen:
        text = err.str()
        definite = (err.code() in _AUTH_ERRORS or err.code() == KafkaError._SSL
                    or (err.code() == KafkaError._TRANSPORT and " alert " in text))
        if definite:
            return _cause(c, text) or text
    return None


def _cause(c: ClientSettings, text: str) -> str | None:
    where = diagnose.broker_address(text)
    probe = None
    if where is not None and "certificate verify failed" in text.lower():
        probe = tls_probe.probe(c, *where)
    expired = tls_probe.expired_on(str(c.security.get("ssl.certificate.location") or ""))
    return diagnose.from_error(c, text, probe, expired)


def _no_answer(c: ClientSettings, seen: list[KafkaError]) -> str | None:
    """After the timeout: what a transport error or a probe of the first address says."""
    for err in seen:
        cause = diagnose.from_error(c, err.str()) if err.code() == KafkaError._TRANSPORT else None
        if cause is not None:
            return cause
    return diagnose.no_answer(c, _probe_bootstrap(c))


def _probe_bootstrap(c: ClientSettings) -> diagnose.Probe | None:
    host, _, port = c.bootstrap_servers.split(",")[0].strip().rpartition(":")
    return tls_probe.probe(c, host.strip("[]"), int(port)) if port.isdigit() else None


def list_topics(client: ClientSettings | str, timeout: float = CONNECT_TIMEOUT
                ) -> dict[str, int]:
    """Topic name -> partition count, internal topics left out; checks the broker answers."""
    return {n: p for n, (p, _r) in topic_sizes(client, timeout).items()}


def topic_sizes(client: ClientSettings | str, timeout: float = CONNECT_TIMEOUT
                ) -> dict[str, tuple[int, int]]:
    """Topic name -> (partitions, replicas of its first partition), internal topics left out."""
    md = metadata(client, timeout)
    out: dict[str, tuple[int, int]] = {}
    for name, t in md.topics.items():
        if name.startswith("__") or t.error is not None:
            continue
        first = t.partitions.get(0)
        out[name] = (len(t.partitions), len(first.replicas) if first is not None else 1)
    return out


def require_topic(client: ClientSettings | str, topic: str,
                  have: Mapping[str, int] | None = None, hint: str = "") -> int:
    """The partition count of ``topic``; ``TopicNotFound`` when it does not exist."""
    known = list_topics(client) if have is None else have
    if topic not in known:
        raise TopicNotFound(topic, as_client(client).bootstrap_servers, hint)
    return known[topic]


def wait_for_broker(client: ClientSettings | str, timeout: float) -> None:
    """Block until the cluster answers (a container that starts beside its broker)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            metadata(client, min(CONNECT_TIMEOUT, max(0.5, deadline - time.monotonic())))
            return
        except KafkaUnreachable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
