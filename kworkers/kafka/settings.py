"""How kworkers talks to a cluster: one ``ClientSettings`` value, and every client's configuration.

Why one place: each client kworkers makes (the worker's consumer and hand-off producer, the
pre-flight admin client, the operator tools' topic reader, the redrive's transactional producer)
needs the same bootstrap address and the same connection security (``security.*``, ``sasl.*``,
``ssl.*``). When each module built its own dictionary, the operator commands lost SASL. Here a
``ClientSettings`` carries the address and the properties every client shares, and the
``*_settings`` functions below are the only code that turns it into a librdkafka configuration,
each adding what its role needs and what kworkers must own (a consumer's ``group.id``, offsets
committed only by kworkers, a reader's ``read_committed``).

Precedence inside one configuration, lowest first: the role's defaults, the shared overrides,
the shared security, the role's own overrides (``consumer_config`` / ``producer_config``), and
the keys kworkers owns. The settings value itself comes from the outside through
``kworkers.settings`` (a ``--config`` file, ``KWORKERS_*`` variables, ``-X key=value``).

Secrets (``sasl.password``, ``ssl.key.password``, ...) never leave this value in text: its
``repr`` masks them and ``redact`` takes them out of any message before it is printed.

Pure: no client library is imported here; ``kworkers.kafka.clients`` builds the clients.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kworkers.errors import ConfigError
from kworkers.memory import MESSAGE_MAX_BYTES, FetchSizes
from kworkers.properties import MASK as MASK  # re-exported: the mask of every printed setting
from kworkers.properties import PROPERTY_KEY as _KEY
from kworkers.properties import parse_property as parse_property  # re-exported: ``-X``

Prop = str | int | float | bool
Properties = Mapping[str, Prop]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")

#: Keys kworkers sets per client role: no user setting (shared or per role) may carry them,
#: because the guarantees rest on them (commit only after durable work, incremental
#: rebalancing, explicit share acknowledgements, read_committed reads).
OWNED_KEYS = frozenset({
    "bootstrap.servers", "group.id", "group.protocol", "enable.auto.commit",
    "enable.auto.offset.store", "transactional.id", "isolation.level",
    "share.acknowledgement.mode",
})


def owned_in(props: Mapping[str, object]) -> list[str]:
    """The keys of ``props`` that kworkers owns (``OWNED_KEYS``), sorted."""
    return sorted(OWNED_KEYS & set(props))
#: Parts of a property name that mark its value as a secret.
_SECRET_MARKERS = ("password", "secret", "ssl.key.pem", "sasl.oauthbearer.config",
                   "sasl.jaas.config")

#: The librdkafka properties a ``KWORKERS_*`` variable may set (what a ConfigMap and a Secret
#: carry); every other property comes from a ``--config`` file, ``-X`` or the worker's code.
ENV_PROPERTIES: Mapping[str, str] = {
    "KWORKERS_SECURITY_PROTOCOL": "security.protocol",
    "KWORKERS_SASL_MECHANISM": "sasl.mechanism",
    "KWORKERS_SASL_USERNAME": "sasl.username",
    "KWORKERS_SASL_PASSWORD": "sasl.password",
    "KWORKERS_SSL_CA_LOCATION": "ssl.ca.location",
    "KWORKERS_SSL_CERTIFICATE_LOCATION": "ssl.certificate.location",
    "KWORKERS_SSL_KEY_LOCATION": "ssl.key.location",
    "KWORKERS_SSL_KEY_PASSWORD": "ssl.key.password",
    "KWORKERS_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "ssl.endpoint.identification.algorithm",
    "KWORKERS_SASL_OAUTHBEARER_METHOD": "sasl.oauthbearer.method",
    "KWORKERS_SASL_OAUTHBEARER_CLIENT_ID": "sasl.oauthbearer.client.id",
    "KWORKERS_SASL_OAUTHBEARER_CLIENT_SECRET": "sasl.oauthbearer.client.secret",
    "KWORKERS_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "sasl.oauthbearer.token.endpoint.url",
    "KWORKERS_SASL_OAUTHBEARER_SCOPE": "sasl.oauthbearer.scope",
    "KWORKERS_KAFKA_LOG_LEVEL": "log_level",
}


def is_security_key(key: str) -> bool:
    return key.startswith(SECURITY_PREFIXES)


def is_secret_key(key: str) -> bool:
    return any(marker in key for marker in _SECRET_MARKERS)


def check_properties(props: Mapping[str, object], what: str) -> dict[str, Prop]:
    """A copy of ``props`` if every key is a property name and every value a scalar."""
    out: dict[str, Prop] = {}
    for k, v in props.items():
        if not isinstance(k, str) or not _KEY.fullmatch(k):
            raise ConfigError(f"{what}: {k!r} is not a librdkafka property name")
        if not isinstance(v, str | int | float | bool):
            shown = MASK if is_secret_key(k) else repr(v)
            raise ConfigError(f"{what}: {k} = {shown} is not a property value")
        out[k] = v
    return out


@dataclass(frozen=True, repr=False)
class ClientSettings:
    """Where the cluster is and how to connect: shared by every client kworkers makes.

    ``security`` holds the ``security.*``, ``sasl.*`` and ``ssl.*`` properties; ``overrides``
    any other librdkafka property every client should get (``client.id``, ``log_level``, ...).
    Credentials without ``security.protocol`` mean ``SASL_PLAINTEXT`` (``SASL_SSL`` when an
    ``ssl.*`` property is set too), and without a mechanism ``PLAIN``.
    """

    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    security: Properties = field(default_factory=dict)
    overrides: Properties = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap servers: must not be empty")
        security = check_properties(self.security, "client security")
        overrides = check_properties(self.overrides, "client settings")
        for what, props, ok in (("client security", security, True),
                                ("client settings", overrides, False)):
            wrong = sorted(k for k in props if is_security_key(k) != ok)
            if wrong:
                raise ConfigError(f"{what}: {wrong} belong in the "
                                  f"{'overrides' if ok else 'security'} part")
            owned = owned_in(props)
            if owned:
                raise ConfigError(f"{what}: {owned} are set by kworkers itself")
        object.__setattr__(self, "bootstrap_servers", self.bootstrap_servers.strip())
        object.__setattr__(self, "security", _with_security_defaults(security))
        object.__setattr__(self, "overrides", overrides)

    @classmethod
    def of(cls, bootstrap_servers: str, properties: Mapping[str, object] | None = None
           ) -> ClientSettings:
        """Settings from one property table, split into security and overrides."""
        props = check_properties(properties or {}, "client settings")
        return cls(bootstrap_servers,
                   {k: v for k, v in props.items() if is_security_key(k)},
                   {k: v for k, v in props.items() if not is_security_key(k)})

    @property
    def properties(self) -> dict[str, Prop]:
        """Every shared property (overrides, then security)."""
        return {**self.overrides, **self.security}

    def secrets(self) -> list[str]:
        """The secret values, longest first (so a secret inside another is masked whole)."""
        values = {str(v) for k, v in self.properties.items() if is_secret_key(k) and str(v)}
        return sorted(values, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """``text`` with every secret value of these settings masked."""
        for secret in self.secrets():
            text = text.replace(secret, MASK)
        return text

    def masked(self) -> dict[str, Prop]:
        """The shared properties with secret values masked (safe to print)."""
        return {k: MASK if is_secret_key(k) else v for k, v in self.properties.items()}

    def __repr__(self) -> str:
        return f"ClientSettings({self.bootstrap_servers!r}, {self.masked()!r})"


def as_client(client: ClientSettings | str) -> ClientSettings:
    """A bootstrap address alone means a cluster that needs no security settings."""
    return client if isinstance(client, ClientSettings) else ClientSettings(client)


def _with_security_defaults(security: dict[str, Prop]) -> dict[str, Prop]:
    user, password = security.get("sasl.username"), security.get("sasl.password")
    if (user is None) != (password is None):
        raise ConfigError("sasl.username and sasl.password go together; only one is set")
    if user is None:
        return security
    out = dict(security)
    if "security.protocol" not in out:
        tls = any(k.startswith("ssl.") for k in out)
        out["security.protocol"] = "SASL_SSL" if tls else "SASL_PLAINTEXT"
    if "sasl.mechanism" not in out and "sasl.mechanisms" not in out:
        out["sasl.mechanism"] = "PLAIN"
    return out


# --- every client's configuration ------------------------------------------------------------


def _config(client: ClientSettings | str, defaults: Mapping[str, Any],
            role: Mapping[str, Any] | None, owned: Mapping[str, Any]) -> dict[str, Any]:
    c = as_client(client)
    taken = owned_in(role or {})
    if taken:
        raise ConfigError(f"consumer_config/producer_config: {taken} are set by kworkers "
                          "itself")
    return {**defaults, **c.overrides, **c.security, **(role or {}), **owned,
            "bootstrap.servers": c.bootstrap_servers}


#: The classic protocol's session timeout for worker pools (librdkafka's default is 45 s): a
#: member that dies without leaving (SIGKILL, OOM, a lost node) hands its partitions over
#: after this. kworkers can afford it short: librdkafka heartbeats from its own thread and
#: kworkers' poll loop never waits for a handler, so only a broker or network stall this long
#: expels a live member (which then rejoins; its uncommitted records are redelivered, never
#: lost). Under KIP-848 (group.protocol=consumer) the broker decides instead:
#: group.consumer.session.timeout.ms (45 s by default, bounded below by
#: group.consumer.min.session.timeout.ms, also 45 s).
CLASSIC_SESSION_TIMEOUT_MS = 10_000
#: a third of the session timeout: two heartbeats may be lost before the member is
CLASSIC_HEARTBEAT_INTERVAL_MS = 3_000


def consumer_settings(client: ClientSettings | str, group: str, protocol: str = "classic",
                      overrides: Mapping[str, Any] | None = None, *,
                      in_flight_bytes: int | None = None) -> dict[str, Any]:
    """A worker's consumer: offsets stored and committed by kworkers alone. With
    ``in_flight_bytes`` (the worker's byte bound), its read-ahead is sized from it
    (``kworkers.memory.FetchSizes``) unless the overrides set those properties themselves."""
    defaults: dict[str, Any] = {
        "auto.offset.reset": "earliest",
        # Headroom for a paused partition's heartbeat-only polls; handlers never run here.
        "max.poll.interval.ms": 300_000,
        # librdkafka waits this long before fetching a partition again once its local queue was
        # full (default 1000 ms): with a backlog that is a one-second stall per full queue.
        "fetch.queue.backoff.ms": 10,
        # the statistics say when the group coordinator last answered (self-fencing)
        "statistics.interval.ms": 1000,
        # the end of a partition's log, reported: what lets backpressure hold a partition at
        # its share instead of pausing it (``kworkers.consumer.backpressure``)
        "enable.partition.eof": True,
        "log_level": 4,
    }
    if in_flight_bytes is not None:
        shared = {**as_client(client).overrides, **(overrides or {})}
        defaults.update(FetchSizes.of(
            in_flight_bytes, int(shared.get("message.max.bytes", MESSAGE_MAX_BYTES))
        ).properties())
    if protocol == "classic":
        defaults["partition.assignment.strategy"] = "cooperative-sticky"
        # failover: a member that dies without leaving holds its partitions this long
        defaults["session.timeout.ms"] = CLASSIC_SESSION_TIMEOUT_MS
        defaults["heartbeat.interval.ms"] = CLASSIC_HEARTBEAT_INTERVAL_MS
    return _config(client, defaults, overrides, {
        "group.id": group, "enable.auto.commit": False, "enable.auto.offset.store": False,
        "group.protocol": protocol,
    })


#: the one consumer property share mode turns into a group config (share.auto.offset.reset)
OFFSET_RESET = "auto.offset.reset"
#: records one share poll may acquire: a crash adds a delivery to every record its member held,
#: so hold about what the lanes start soon (the broker still hands a larger producer batch
#: over whole); librdkafka's default is 500
SHARE_MAX_POLL_RECORDS = 100


def share_consumer_settings(client: ClientSettings | str, group: str,
                            overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A share-group consumer (KIP-932): records acknowledged one by one, explicitly, by
    kworkers alone (implicit mode would accept a poll's records on the next poll, done or not).
    ``auto.offset.reset`` is not a share consumer property: share mode sets the group's
    ``share.auto.offset.reset`` from it instead (``kworkers.share``)."""
    role = dict(overrides or {})
    role.pop(OFFSET_RESET, None)
    return _config(client, {"log_level": 4, "max.poll.records": SHARE_MAX_POLL_RECORDS}, role, {
        "group.id": group, "share.acknowledgement.mode": "explicit"})


def producer_settings(client: ClientSettings | str,
                      overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The hand-off producer: idempotent, acks from all replicas, bounded delivery time.

    ``linger.ms`` 20, not librdkafka's 5: hand-offs and outputs come in bursts (a storm, a
    batch's outputs), and fuller batches halved the client's and the broker's CPU per failed
    record in a storm (``benchmarks.storm``, 2026-12-02); a hand-off's acknowledgement, and so
    its offset's commit, comes at most 15 ms later. ``producer_config`` overrides it."""
    return _config(client, {
        "enable.idempotence": True, "acks": "all", "linger.ms": 20,
        "delivery.timeout.ms": 30_000, "log_level": 4,
    }, overrides, {})


def transactional_producer_settings(client: ClientSettings | str, transactional_id: str,
                                    transaction_timeout_ms: int = 30_000,
                                    overrides: Mapping[str, Any] | None = None
                                    ) -> dict[str, Any]:
    """A producer whose writes commit or abort together (the redrive's replay and ledger, an
    exactly-once loop's outputs and offsets). Its deliveries time out with its transaction."""
    return _config(client, {
        "enable.idempotence": True, "acks": "all", "linger.ms": 5, "log_level": 0,
        "transaction.timeout.ms": transaction_timeout_ms,
        "message.timeout.ms": transaction_timeout_ms,
    }, overrides, {"transactional.id": transactional_id})


def admin_settings(client: ClientSettings | str) -> dict[str, Any]:
    """Topic administration. Its librdkafka log is silent: errors come back as exceptions."""
    return _config(client, {"log_level": 0}, None, {})


@dataclass(frozen=True)
class ReadAhead:
    """What librdkafka may fetch ahead of a reader: ``records`` a partition
    (``queued.min.messages``) and ``kbytes`` of record values in all
    (``queued.max.messages.kbytes``, also the most one fetch brings). Why both: librdkafka
    counts only values against the bytes, so records with small values and large headers (a
    dead letter: 100 B of value, 600 B of headers) pass the bytes limit by far; the count
    holds them."""

    records: int
    kbytes: int

    def settings(self) -> dict[str, Any]:
        return {"queued.min.messages": self.records, "queued.max.messages.kbytes": self.kbytes,
                # at least a record of the largest size a broker accepts by default
                "fetch.max.bytes": max(self.kbytes * 1024, 1_048_576),
                # a full queue waits this long before the next fetch (librdkafka: 1 s): with
                # a small read-ahead, 1 s idle per refill would set the pace (measured: a
                # 100k-record read 6x slower)
                "fetch.queue.backoff.ms": 10}


def reader_settings(client: ClientSettings | str, group: str = "kworkers-reader",
                    read_ahead: ReadAhead | None = None) -> dict[str, Any]:
    """A reader that assigns partitions itself and never commits: it moves nobody's offsets.

    ``group`` is only used to look committed offsets up (``kworkers lag``); a plain read
    joins no group. ``read_committed`` like the workers, so an aborted write is invisible
    here as it is to them. ``read_ahead`` caps what librdkafka fetches ahead of the reader,
    for a read of a topic of any size in bounded memory (``reader.stream``); unset,
    librdkafka's defaults (100,000 records a partition, 64 MiB of values).
    """
    ahead: dict[str, Any] = {} if read_ahead is None else read_ahead.settings()
    return _config(client, {"auto.offset.reset": "earliest", "log_level": 0, **ahead}, None, {
        "group.id": group, "enable.auto.commit": False, "enable.auto.offset.store": False,
        "enable.partition.eof": True, "isolation.level": "read_committed",
    })


# --- client properties from the outside ------------------------------------------------------


def parse_properties(text: str, source: str) -> dict[str, str]:
    """A client properties file (Kafka's ``--command-config``): ``key=value`` or ``key: value``
    lines, ``#`` and ``!`` comments, a trailing ``\\`` continues a line.

    Java clients' ``sasl.jaas.config`` is translated for librdkafka when it is the PLAIN or
    SCRAM login module with a username and password, or OAUTHBEARER's with a client id and
    secret (OIDC, with Kafka's ``OAuthBearerLoginCallbackHandler``), and a PEM truststore
    becomes ``ssl.ca.location``; a ``bootstrap.servers`` line is kept (the caller lifts it
    out).
    """
    out: dict[str, str] = {}
    pending = ""
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if not pending:
            start = n
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        cut = [i for i in (line.find("="), line.find(":")) if i > 0]
        key = line[:min(cut)].strip() if cut else ""
        if not key or not _KEY.fullmatch(key):
            raise ConfigError(f"{source}:{start}: expected key=value (a librdkafka property); "
                              "a kworkers settings file must end in .toml")
        out[key] = line[min(cut) + 1:].strip()
    if pending:
        raise ConfigError(f"{source}:{start}: the file ends inside a continued line")
    return _translate_jaas(out, source)


_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+required\b(?P<options>.*?);?\s*$", re.S)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
#: the Java login callback handler of OAUTHBEARER through OIDC (librdkafka: method=oidc)
_OIDC_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
#: OAuthBearerLoginModule's JAAS options -> librdkafka's properties
_OIDC_OPTIONS = {"clientId": "sasl.oauthbearer.client.id",
                 "clientSecret": "sasl.oauthbearer.client.secret",
                 "scope": "sasl.oauthbearer.scope"}


def _translate_jaas(props: dict[str, str], source: str) -> dict[str, str]:
    """Java clients' settings librdkafka spells otherwise: the PLAIN, SCRAM and OAUTHBEARER
    (OIDC) login modules, and a PEM truststore (``ssl.ca.location``)."""
    _translate_truststore(props, source)
    handler = props.pop("sasl.login.callback.handler.class", None)
    if handler is not None and handler.strip() != _OIDC_HANDLER:
        raise ConfigError(f"{source}: sasl.login.callback.handler.class names a Java class; "
                          "only Kafka's OIDC handler (OAuthBearerLoginCallbackHandler) has a "
                          "librdkafka equivalent")
    jaas = props.pop("sasl.jaas.config", None)
    if jaas is None:
        return props
    m = _JAAS.match(jaas)
    options = dict(_JAAS_OPTION.findall(m["options"])) if m else {}
    module = m["module"].rsplit(".", 1)[-1] if m else ""
    if module == "OAuthBearerLoginModule" and "clientId" in options and (
            "clientSecret" in options):
        props.setdefault("sasl.oauthbearer.method", "oidc")
        for option, prop in _OIDC_OPTIONS.items():
            if option in options:
                props.setdefault(prop, options[option])
        return props
    if module not in ("PlainLoginModule", "ScramLoginModule") or not (
            "username" in options and "password" in options):
        raise ConfigError(f"{source}: sasl.jaas.config is for Java clients; only the PLAIN or "
                          "SCRAM login module with username and password, or OAUTHBEARER's "
                          "with clientId and clientSecret, can be used here (or set "
                          "sasl.username and sasl.password)")
    props.setdefault("sasl.username", options["username"])
    props.setdefault("sasl.password", options["password"])
    if module == "PlainLoginModule" and "sasl.mechanisms" not in props:
        props.setdefault("sasl.mechanism", "PLAIN")
    return props


def _translate_truststore(props: dict[str, str], source: str) -> None:
    kind = props.pop("ssl.truststore.type", None)
    location = props.pop("ssl.truststore.location", None)
    if location is None:
        return
    if (kind or "JKS").strip().upper() != "PEM":
        raise ConfigError(f"{source}: ssl.truststore.location is a {kind or 'JKS'} truststore, "
                          "which only Java clients read; give the CA certificates as a PEM "
                          "file in ssl.ca.location")
    props.setdefault("ssl.ca.location", location)


def properties_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The client properties set by ``KWORKERS_*`` variables (``ENV_PROPERTIES``)."""
    return {prop: environ[var].strip() for var, prop in ENV_PROPERTIES.items()
            if environ.get(var, "").strip()}


def env_var_of(prop: str) -> str | None:
    """The variable that carries ``prop``, if one does."""
    return next((var for var, p in ENV_PROPERTIES.items() if p == prop), None)
