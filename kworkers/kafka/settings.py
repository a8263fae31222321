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

Prop = str | int | float | bool
Properties = Mapping[str, Prop]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")
MASK = "****"

#: Keys kworkers sets per client role; a shared setting may not carry them.
OWNED_KEYS = frozenset({
    "bootstrap.servers", "group.id", "group.protocol", "enable.auto.commit",
    "enable.auto.offset.store", "transactional.id", "isolation.level",
})
#: Parts of a property name that mark its value as a secret.
_SECRET_MARKERS = ("password", "secret", "ssl.key.pem", "sasl.oauthbearer.config",
                   "sasl.jaas.config")
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

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
            owned = sorted(OWNED_KEYS & set(props))
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
    return {**defaults, **c.overrides, **c.security, **(role or {}), **owned,
            "bootstrap.servers": c.bootstrap_servers}


def consumer_settings(client: ClientSettings | str, group: str, protocol: str = "classic",
                      overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A worker's consumer: offsets stored and committed by kworkers alone."""
    defaults: dict[str, Any] = {
        "auto.offset.reset": "earliest",
        # Headroom for a paused partition's heartbeat-only polls; handlers never run here.
        "max.poll.interval.ms": 300_000,
        # librdkafka waits this long before fetching a partition again once its local queue was
        # full (default 1000 ms): with a backlog that is a one-second stall per full queue.
        "fetch.queue.backoff.ms": 10,
        "log_level": 4,
    }
    if protocol == "classic":
        defaults["partition.assignment.strategy"] = "cooperative-sticky"
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
    if "share.acknowledgement.mode" in role:
        raise ConfigError("consumer_config: share.acknowledgement.mode is set by kworkers itself "
                          "in share mode (explicit: a record is accepted once its work is "
                          "durable)")
    role.pop(OFFSET_RESET, None)
    return _config(client, {"log_level": 4, "max.poll.records": SHARE_MAX_POLL_RECORDS}, role, {
        "group.id": group, "share.acknowledgement.mode": "explicit"})


def producer_settings(client: ClientSettings | str,
                      overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The hand-off producer: idempotent, acks from all replicas, bounded delivery time."""
    return _config(client, {
        "enable.idempotence": True, "acks": "all", "linger.ms": 5,
        "delivery.timeout.ms": 30_000, "log_level": 4,
    }, overrides, {})


def transactional_producer_settings(client: ClientSettings | str, transactional_id: str,
                                    transaction_timeout_ms: int = 30_000) -> dict[str, Any]:
    """A producer whose writes commit or abort together (the redrive's replay and ledger)."""
    return _config(client, {
        "enable.idempotence": True, "acks": "all", "linger.ms": 5, "log_level": 0,
        "transaction.timeout.ms": transaction_timeout_ms,
    }, None, {"transactional.id": transactional_id})


def admin_settings(client: ClientSettings | str) -> dict[str, Any]:
    """Topic administration. Its librdkafka log is silent: errors come back as exceptions."""
    return _config(client, {"log_level": 0}, None, {})


def reader_settings(client: ClientSettings | str, group: str = "kworkers-reader"
                    ) -> dict[str, Any]:
    """A reader that assigns partitions itself and never commits: it moves nobody's offsets.

    ``group`` is only used to look committed offsets up (``kworkers lag``); a plain read
    joins no group. ``read_committed`` like the workers, so an aborted write is invisible
    here as it is to them.
    """
    return _config(client, {"auto.offset.reset": "earliest", "log_level": 0}, None, {
        "group.id": group, "enable.auto.commit": False, "enable.auto.offset.store": False,
        "enable.partition.eof": True, "isolation.level": "read_committed",
    })


# --- client properties from the outside ------------------------------------------------------


def parse_property(text: str, what: str = "-X") -> tuple[str, str]:
    """``key=value`` (as kcat's ``-X``); the value is never echoed in an error."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.fullmatch(key):
        raise ConfigError(f"{what}: expected a librdkafka property as key=value, such as "
                          "security.protocol=SASL_SSL")
    return key, value.strip()


def parse_properties(text: str, source: str) -> dict[str, str]:
    """A client properties file (Kafka's ``--command-config``): ``key=value`` or ``key: value``
    lines, ``#`` and ``!`` comments, a trailing ``\\`` continues a line.

    Java clients' ``sasl.jaas.config`` is translated for librdkafka when it is the PLAIN or
    SCRAM login module with a username and password; a ``bootstrap.servers`` line is kept (the
    caller lifts it out).
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


def _translate_jaas(props: dict[str, str], source: str) -> dict[str, str]:
    jaas = props.pop("sasl.jaas.config", None)
    if jaas is None:
        return props
    m = _JAAS.match(jaas)
    options = dict(_JAAS_OPTION.findall(m["options"])) if m else {}
    module = m["module"].rsplit(".", 1)[-1] if m else ""
    if module not in ("PlainLoginModule", "ScramLoginModule") or not (
            "username" in options and "password" in options):
        raise ConfigError(f"{source}: sasl.jaas.config is for Java clients; only the PLAIN or "
                          "SCRAM login module with username and password can be used here "
                          "(or set sasl.username and sasl.password)")
    props.setdefault("sasl.username", options["username"])
    props.setdefault("sasl.password", options["password"])
    if module == "PlainLoginModule" and "sasl.mechanisms" not in props:
        props.setdefault("sasl.mechanism", "PLAIN")
    return props


def properties_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The client properties set by ``KWORKERS_*`` variables (``ENV_PROPERTIES``)."""
    return {prop: environ[var].strip() for var, prop in ENV_PROPERTIES.items()
            if environ.get(var, "").strip()}


def env_var_of(prop: str) -> str | None:
    """The variable that carries ``prop``, if one does."""
    return next((var for var, p in ENV_PROPERTIES.items() if p == prop), None)
