"""A real Apache Kafka broker for tests, benchmarks and the demo.

Three ways to get one, behind one interface, chosen by ``broker_from_env``:

- ``KWORKERS_BOOTSTRAP`` set: an existing broker (no faults can be injected into it);
- default: a container started with testcontainers from ``KWORKERS_KAFKA_IMAGE`` (the official
  ``apache/kafka`` image, or the locally built ``kworkers/kafka:<v>-local``), host networking,
  free ports on 127.0.0.1;
- ``KWORKERS_BROKER=process``: the same jars run as a local process, for machines that cannot
  run a Docker engine.

A fault test needs to stop, SIGKILL and restart the broker *with its data*: the container is
stopped and started again (its filesystem survives), the process is restarted on the same data
directory and ports. ``pause()``/``resume()`` freeze the broker without closing a socket
(``docker pause`` / SIGSTOP and SIGCONT), so a client's request is sent and never answered: the
way to make a commit or a produce time out for certain.

``listeners={"NETNS": "10.213.0.1:39092"}`` adds a plaintext listener on another address,
advertised as itself (the network-partition test reaches the broker from a network namespace
through it; the address must exist on the host before the broker starts).

``security=Security(...)`` adds the listeners production clusters are reached through, each on
a port of its own (``Broker.secure[NAME]``): ``SCRAM`` (SASL_SSL, SCRAM-SHA-512, the users
created at format time as KRaft allows), ``MTLS`` (SSL, client certificates required, the
principal being the certificate's CN), ``OAUTH`` (SASL_SSL, OAUTHBEARER validated against a
JWKS: ``kworkers.testing.oidc``), and ``WRONGHOST`` (SSL with a certificate for another host
name: what a client that verifies host names must refuse), with the ACL authorizer on. The
certificates are made at test time (``kworkers.testing.tls``). Such a broker always runs the
repository's ``kafka-run`` (bind-mounted into a container), which formats the storage with the
SCRAM credentials; the official image's entry point cannot.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kworkers.testing.server_container import ServerContainer
from kworkers.testing.server_process import ServerProcess
from kworkers.testing.tls import Pki

KAFKA_VERSION = "4.3.1"
DEFAULT_KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
READY_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sasl_env(port: int, controller_port: int, sasl_port: int,
             users: dict[str, str]) -> dict[str, str]:
    """A SASL_PLAINTEXT listener (mechanism PLAIN) beside the plaintext one, for these users."""
    jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required " + " ".join(
        f'user_{u}="{p}"' for u, p in users.items()) + ";"
    return {
        "KAFKA_LISTENERS": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:"
                           f"{controller_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{port},"
                                      f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "KAFKA_SASL_ENABLED_MECHANISMS": "PLAIN",
        "KAFKA_LISTENER_NAME_SASL__PLAINTEXT_PLAIN_SASL_JAAS_CONFIG": jaas,
    }


def listener_env(env: Mapping[str, str], listeners: Mapping[str, str]) -> dict[str, str]:
    """``env`` with one more plaintext listener per ``NAME: host:port``, advertised as is."""
    out = dict(env)
    for name, address in listeners.items():
        out["KAFKA_LISTENERS"] += f",{name}://{address}"
        out["KAFKA_ADVERTISED_LISTENERS"] += f",{name}://{address}"
        out["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"] += f",{name}:PLAINTEXT"
    return out


#: the secure listeners a ``Security`` adds, and the security protocol of each
SECURE_LISTENERS = {"SCRAM": "SASL_SSL", "MTLS": "SSL", "OAUTH": "SASL_SSL", "WRONGHOST": "SSL"}
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: the repository's broker entry point (what a secure broker runs, in a container or not)
KAFKA_RUN = Path(__file__).resolve().parents[2] / "deploy" / "images" / "kafka" / "kafka-run"


@dataclass(frozen=True)
class Security:
    """What the secure listeners are made of (see the module docstring).

    ``super_users``: principals the authorizer lets do anything (``User:ANONYMOUS``, the
    plaintext listener, always is: tests set up and read back through it); every other
    principal may do only what an ACL grants. ``jwks_url`` and ``jvm_options`` (the
    ``allowed.urls`` system property) come from ``kworkers.testing.oidc.Idp``."""

    pki: Pki
    scram_users: Mapping[str, str]
    jwks_url: str
    jvm_options: str
    audience: str
    issuer: str
    super_users: tuple[str, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)


def secure_env(env: Mapping[str, str], ports: Mapping[str, int], sec: Security) -> dict[str, str]:
    """``env`` with the listeners of ``SECURE_LISTENERS`` on ``ports`` and the authorizer."""
    out = dict(env)
    for name, protocol in SECURE_LISTENERS.items():
        address = f"127.0.0.1:{ports[name]}"
        out["KAFKA_LISTENERS"] += f",{name}://{address}"
        out["KAFKA_ADVERTISED_LISTENERS"] += f",{name}://{address}"
        out["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"] += f",{name}:{protocol}"
    supers = ";".join(dict.fromkeys(("User:ANONYMOUS", *sec.super_users)))
    scram = SCRAM_MECHANISM.replace("-", "___")
    out.update({
        "KAFKA_AUTHORIZER_CLASS_NAME":
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "KAFKA_SUPER_USERS": supers,
        # TLS: one PEM keystore and truststore for every TLS listener, but WRONGHOST's own
        "KAFKA_SSL_KEYSTORE_TYPE": "PEM",
        "KAFKA_SSL_KEYSTORE_LOCATION": str(sec.pki.server),
        "KAFKA_SSL_TRUSTSTORE_TYPE": "PEM",
        "KAFKA_SSL_TRUSTSTORE_LOCATION": str(sec.pki.ca),
        "KAFKA_LISTENER_NAME_WRONGHOST_SSL_KEYSTORE_LOCATION": str(sec.pki.wrong_host),
        "KAFKA_LISTENER_NAME_MTLS_SSL_CLIENT_AUTH": "required",
        # a client certificate's principal is its CN: User:alice, not User:CN=alice
        "KAFKA_SSL_PRINCIPAL_MAPPING_RULES": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
        # SCRAM: users made at format time (kafka-run), checked on this listener only
        "KWORKERS_KAFKA_SCRAM": "\n".join(
            f"{SCRAM_MECHANISM}=[name={u},password={p}]" for u, p in sec.scram_users.items()),
        "KAFKA_LISTENER_NAME_SCRAM_SASL_ENABLED_MECHANISMS": SCRAM_MECHANISM,
        f"KAFKA_LISTENER_NAME_SCRAM_{scram}_SASL_JAAS_CONFIG":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        # OAUTHBEARER through OIDC: signed JWTs checked against the test's JWKS
        "KAFKA_LISTENER_NAME_OAUTH_SASL_ENABLED_MECHANISMS": "OAUTHBEARER",
        "KAFKA_LISTENER_NAME_OAUTH_OAUTHBEARER_SASL_JAAS_CONFIG":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        "KAFKA_LISTENER_NAME_OAUTH_OAUTHBEARER_SASL_SERVER_CALLBACK_HANDLER_CLASS":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
        "KAFKA_SASL_OAUTHBEARER_JWKS_ENDPOINT_URL": sec.jwks_url,
        "KAFKA_SASL_OAUTHBEARER_EXPECTED_AUDIENCE": sec.audience,
        "KAFKA_SASL_OAUTHBEARER_EXPECTED_ISSUER": sec.issuer,
        "KAFKA_OPTS": f"{env.get('KAFKA_OPTS', '')} {sec.jvm_options}".strip(),
        **sec.extra,
    })
    return out


def _server_env(port: int, controller_port: int) -> dict[str, str]:
    """Full KRaft single-node config in the official image's KAFKA_* convention.

    The locally built image reads the same variables, so one fixture drives either image.
    """
    return {
        "KWORKERS_KAFKA_PORT": str(port),
        "KWORKERS_KAFKA_CONTROLLER_PORT": str(controller_port),
        "CLUSTER_ID": "kWorkersLocalCluster0w",
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@127.0.0.1:{controller_port}",
        "KAFKA_LOG_DIRS": "/var/lib/kafka/data",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "10",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS": "1000",
        "KAFKA_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS": "1000",
        "KAFKA_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "6000",
        "KAFKA_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS": "200",
        "KAFKA_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
        # share groups get the same failure detection (their defaults are 45 s and 5 s: a
        # member killed in a test kept its records for 45 s); the record lock stays at its
        # 30 s default: ShareRules' deadlines are built on it, and a 10 s lock let loaded
        # handlers outlive it (redeliveries nobody killed, issue #42)
        "KAFKA_GROUP_SHARE_MIN_SESSION_TIMEOUT_MS": "1000",
        "KAFKA_GROUP_SHARE_SESSION_TIMEOUT_MS": "6000",
        "KAFKA_GROUP_SHARE_MIN_HEARTBEAT_INTERVAL_MS": "200",
        "KAFKA_GROUP_SHARE_HEARTBEAT_INTERVAL_MS": "500",
        "KAFKA_HEAP_OPTS": "-Xms256m -Xmx768m",
    }


def wait_ready(bootstrap: str, timeout: float = READY_TIMEOUT_S, alive: Any = None) -> None:
    """Block until the broker answers metadata requests and has a controller."""
    from confluent_kafka.admin import AdminClient  # adapter import, kept local

    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"the broker at {bootstrap} exited while starting")
        try:
            with socket.create_connection(_host_port(bootstrap), timeout=1):
                pass
            admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
            md = admin.list_topics(timeout=5)
            if md.brokers and md.controller_id >= 0:
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.3)
    raise TimeoutError(f"Kafka at {bootstrap} not ready after {timeout:.0f}s: {last}")


def _host_port(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0]
    host, _, port = first.rpartition(":")
    return host, int(port)


class Broker(Protocol):
    """A broker a test can use and, where ``supports_faults``, stop, kill, pause and restart."""

    bootstrap_servers: str
    supports_faults: bool
    #: the secure listeners' addresses by name (``Security``); empty without them
    secure: dict[str, str]

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def restart(self, hard: bool = False) -> None: ...
    def close(self) -> None: ...
    def logs(self) -> str: ...


class ExternalBroker:
    """A broker somebody else runs (``KWORKERS_BOOTSTRAP``); faults cannot be injected."""

    supports_faults = False

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.secure: dict[str, str] = {}

    def start(self) -> None:
        wait_ready(self.bootstrap_servers)

    def stop(self) -> None:
        raise NotImplementedError("cannot stop an external broker")

    kill = stop
    pause = stop
    resume = stop

    def restart(self, hard: bool = False) -> None:
        raise NotImplementedError("cannot restart an external broker")

    def close(self) -> None:
        return None

    def logs(self) -> str:
        return ""


class ContainerBroker:
    """One KRaft node in a container with host networking (testcontainers, no reaper)."""

    supports_faults = True

    def __init__(self, image: str = DEFAULT_KAFKA_IMAGE, extra_env: dict[str, str] | None = None,
                 sasl_users: dict[str, str] | None = None,
                 listeners: Mapping[str, str] | None = None,
                 security: Security | None = None):
        self.image = image
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self.security = security
        self.env, self.sasl_bootstrap, self.secure = _listeners(
            {**_server_env(self.port, self.controller_port), **(extra_env or {})},
            self.port, self.controller_port, sasl_users, listeners, security)
        volumes: list[tuple[str, str]] = []
        if security is not None:
            self.env["KWORKERS_KAFKA_HOME"] = "/opt/kafka"  # the jars, in either image
            pki = str(security.pki.dir)
            volumes = [(pki, pki), (str(KAFKA_RUN), "/kworkers/kafka-run")]
        self.server = ServerContainer(
            image, self.env, None if security is None else ["/kworkers/kafka-run"], volumes)

    def start(self) -> None:
        self.server.start(lambda alive: wait_ready(self.bootstrap_servers, alive=alive))

    def stop(self) -> None:
        self.server.stop()

    def kill(self) -> None:
        self.server.kill()

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def restart(self, hard: bool = False) -> None:
        self.kill() if hard else self.stop()
        self.start()

    def close(self) -> None:
        self.server.close()

    def logs(self) -> str:
        return self.server.logs()


def default_kafka_home() -> Path:
    cache = Path(os.environ.get("KWORKERS_CACHE", Path.home() / ".cache" / "kworkers"))
    return Path(os.environ.get("KWORKERS_KAFKA_HOME", cache / f"kafka-{KAFKA_VERSION}"))


class ProcessBroker:
    """The same jars and entrypoint as the image, as a local process (no Docker engine)."""

    supports_faults = True

    def __init__(self, kafka_home: Path | None = None, extra_env: dict[str, str] | None = None,
                 sasl_users: dict[str, str] | None = None,
                 listeners: Mapping[str, str] | None = None,
                 security: Security | None = None):
        self.home = kafka_home or default_kafka_home()
        runner = self.home / "bin" / "kafka-run"
        if not runner.exists():
            raise FileNotFoundError(
                f"{runner} is missing: run deploy/images/kafka/build --jars-only first"
            )
        self.runner = KAFKA_RUN if security is not None else runner
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self.workdir = Path(tempfile.mkdtemp(prefix="kworkers-kafka-"))
        self.env = {
            **os.environ,
            **_server_env(self.port, self.controller_port),
            "KWORKERS_KAFKA_HOME": str(self.home),
            "KWORKERS_KAFKA_DATA_DIR": str(self.workdir / "data"),
            "KWORKERS_KAFKA_CONF_DIR": str(self.workdir / "conf"),
            "KAFKA_LOG_DIRS": str(self.workdir / "data"),
            **(extra_env or {}),
        }
        self.env, self.sasl_bootstrap, self.secure = _listeners(
            self.env, self.port, self.controller_port, sasl_users, listeners, security)
        self.server = ServerProcess(self.runner, self.env, self.workdir / "broker.log", "broker")

    def start(self) -> None:
        self.server.start(lambda alive: wait_ready(self.bootstrap_servers, alive=alive))

    def stop(self) -> None:
        self.server.stop()

    def kill(self) -> None:
        self.server.kill()

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def restart(self, hard: bool = False) -> None:
        self.kill() if hard else self.stop()
        self.start()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> str:
        return self.server.logs()


def broker_from_env(extra_env: dict[str, str] | None = None,
                    sasl_users: dict[str, str] | None = None, *, own: bool = False,
                    listeners: Mapping[str, str] | None = None,
                    security: Security | None = None) -> Broker:
    """The broker this environment asks for (not started yet).

    ``own``: a broker of the caller's own even when ``KWORKERS_BOOTSTRAP`` names an external
    one (a test that kills or pauses the broker must never do that to somebody else's); a
    broker with ``security`` is always the caller's own."""
    bootstrap = os.environ.get("KWORKERS_BOOTSTRAP")
    if bootstrap and not own and security is None:
        return ExternalBroker(bootstrap)
    if os.environ.get("KWORKERS_BROKER", "container") == "process":
        return ProcessBroker(extra_env=extra_env, sasl_users=sasl_users, listeners=listeners,
                             security=security)
    return ContainerBroker(os.environ.get("KWORKERS_KAFKA_IMAGE") or default_image(), extra_env,
                           sasl_users, listeners, security)


def _listeners(env: dict[str, str], port: int, controller_port: int,
               sasl_users: Mapping[str, str] | None, listeners: Mapping[str, str] | None,
               security: Security | None) -> tuple[dict[str, str], str | None, dict[str, str]]:
    """``env`` with every listener asked for; the SASL/PLAIN address and the secure ones."""
    sasl_bootstrap: str | None = None
    if sasl_users:
        sasl_port = free_port()
        sasl_bootstrap = f"127.0.0.1:{sasl_port}"
        env = {**env, **sasl_env(port, controller_port, sasl_port, dict(sasl_users))}
    env = listener_env(env, listeners or {})
    secure: dict[str, str] = {}
    if security is not None:
        ports = {name: free_port() for name in SECURE_LISTENERS}
        env = secure_env(env, ports, security)
        secure = {name: f"127.0.0.1:{p}" for name, p in ports.items()}
    return env, sasl_bootstrap, secure


LOCAL_KAFKA_IMAGE = f"kworkers/kafka:{KAFKA_VERSION}-local"


def default_image() -> str:
    """The official image, unless only the locally built one is present (no registry here)."""
    try:
        import docker

        client = docker.from_env()
        try:
            client.images.get(DEFAULT_KAFKA_IMAGE)
            return DEFAULT_KAFKA_IMAGE
        except docker.errors.ImageNotFound:
            client.images.get(LOCAL_KAFKA_IMAGE)
            return LOCAL_KAFKA_IMAGE
    except Exception:
        return DEFAULT_KAFKA_IMAGE
