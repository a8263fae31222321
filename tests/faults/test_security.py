"""Real cluster security, end to end: TLS, mTLS, SCRAM and OAUTHBEARER on real listeners.

One broker of this module's own (``kworkers.testing.broker.Security``) with the listeners
production clusters are reached through, an ACL authorizer, a CA and certificates made now with
openssl (``kworkers.testing.tls``), SCRAM users made when the storage was formatted, and an
OIDC token endpoint and JWKS served by this test on loopback (``kworkers.testing.oidc``):

- ``SCRAM``: SASL_SSL, SCRAM-SHA-512 (alice);
- ``MTLS``: SSL with client certificates required (alice's key is encrypted: a key password);
- ``OAUTH``: SASL_SSL, OAUTHBEARER through OIDC (client ``svc-orders``);
- ``WRONGHOST``: SSL with a certificate for another host name (only refusals are tested there).

Set-up and read-back go through the plaintext listener (a super user), never through the code
under test.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import selectors
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

import httpx
import pytest
import yaml
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

from kworkers import TierLadder, Worker, WorkerConfig
from kworkers.deploy import render
from kworkers.dlq.audit import Actor
from kworkers.dlq.redrive import CRASH_EXIT_CODE, read_audit
from kworkers.kafka.admin import TopicSpec, admin_client, create_topics, existing_topics
from kworkers.kafka.settings import ENV_PROPERTIES
from kworkers.testing.broker import Security, broker_from_env, free_port
from kworkers.testing.oidc import AUDIENCE, ISSUER, Idp
from kworkers.testing.processes import children
from kworkers.testing.tls import Pki, make_pki
from kworkers.testing.workload import (
    committed_total,
    make_topic,
    produce_numbered,
    read_all,
    unique,
)
from tests.integration.conftest import running, wait_for
from tests.integration.test_cli_support import DeadLetters, make_dead_letters

pytestmark = [pytest.mark.integration, pytest.mark.faults]

ROOT = str(Path(__file__).resolve().parents[2])

#: a read-back asked while the group's coordinator moves or loads: asked again
_COORDINATOR_MOVING = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS})


def committed_total_now(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """The group's committed total, read back; -1 while its coordinator moves or loads."""
    try:
        return committed_total(bootstrap, group, topic, partitions)
    except KafkaException as exc:
        if exc.args and isinstance(exc.args[0], KafkaError) and (
                exc.args[0].code() in _COORDINATOR_MOVING):
            return -1
        raise


SCRAM_SECRET = "alice-scram-s3cret"
KEY_SECRET = "alice-key-pa55phrase"
OIDC_SECRET = "svc-orders-oidc-s3cret"
BOB_SECRET = "bob-scram-0ther-s3cret"
WRONG = "definitely-wrong-pass"
CONSOLE_ALICE = "alice-console-token-0123456789"
CONSOLE_BOB = "bob-console-token-9876543210"
#: every secret the tests hold: none may ever appear in any output
SECRETS = (SCRAM_SECRET, KEY_SECRET, OIDC_SECRET, BOB_SECRET, WRONG, CONSOLE_ALICE, CONSOLE_BOB)
OIDC_CLIENT = "svc-orders"
LISTENERS = ("SCRAM", "MTLS", "OAUTH")

Props = dict[str, str]


@dataclass(frozen=True)
class Cluster:
    plain: str  # PLAINTEXT listener, super user: set-up and read-back
    secure: dict[str, str]  # listener name -> address
    pki: Pki
    idp: Idp
    tmp: Path

    def props(self, listener: str) -> Props:
        """The librdkafka properties of a good client of ``listener``."""
        ca = str(self.pki.ca)
        if listener == "SCRAM":
            return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": "alice", "sasl.password": SCRAM_SECRET,
                    "ssl.ca.location": ca}
        if listener == "MTLS":
            cert = self.pki.client("alice", KEY_SECRET)
            return {"security.protocol": "SSL", "ssl.ca.location": ca,
                    "ssl.certificate.location": str(cert.cert),
                    "ssl.key.location": str(cert.key), "ssl.key.password": KEY_SECRET}
        assert listener == "OAUTH", listener
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": OIDC_CLIENT,
                "sasl.oauthbearer.client.secret": OIDC_SECRET,
                "sasl.oauthbearer.token.endpoint.url": self.idp.token_url,
                "sasl.oauthbearer.scope": "kafka", "ssl.ca.location": ca}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    tmp = Path(tempfile.mkdtemp(prefix="kworkers-security-"))
    tmp.chmod(0o755)  # the broker in its container reads the keystores as another user
    pki = make_pki(tmp / "pki")
    pki.dir.chmod(0o755)
    idp = Idp(tmp, {OIDC_CLIENT: OIDC_SECRET}).start()
    security = Security(pki, {"alice": SCRAM_SECRET, "bob": BOB_SECRET}, idp.jwks_url,
                        idp.allowed_urls_opt(), AUDIENCE, ISSUER,
                        super_users=("User:alice", f"User:{OIDC_CLIENT}"))
    broker = broker_from_env(security=security)
    broker.start()
    try:
        yield Cluster(broker.bootstrap_servers, dict(broker.secure), pki, idp, tmp)
    finally:
        broker.close()
        idp.close()


@pytest.fixture(scope="module")
def dead_letters(cluster: Cluster) -> DeadLetters:
    """Dead letters made through the plaintext listener, shared by the tests below: each
    redrives keys of its own (``POISON`` slices), the others only read."""
    return make_dead_letters(cluster.plain, n=24, partitions=1)


def poison(d: DeadLetters, first: int, n: int) -> list[str]:
    """Keys of dead letters ``first .. first + n - 1`` (a test's own, to redrive)."""
    return [f"k{i}" for i in sorted(d.poison)[first:first + n]]


# --- helpers ---------------------------------------------------------------------------------


def kworkers(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``kworkers ARGS`` through its real entry point, started (run several at once); no
    ``KWORKERS_*`` variable of this process leaks into it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KWORKERS_")}
    return subprocess.Popen([sys.executable, "-m", "kworkers.cli", *args], cwd=ROOT, text=True,
                            env={**base, "PYTHONPATH": ROOT, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def done(p: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=180)  # bounds a hang only
    return p.returncode, out, err


def x_flags(props: Props) -> list[str]:
    return [a for k, v in props.items() for a in ("-X", f"{k}={v}")]


def no_secret(text: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"secrets {leaked} in the output:\n{text[-3000:]}"


# --- every listener works ------------------------------------------------------------------


def test_a_worker_consumes_over_each_listener(cluster: Cluster) -> None:
    """One worker per listener, all at once, each with that listener's credentials."""
    runs = []
    for listener in LISTENERS:
        topic = make_topic(cluster.plain, unique(f"sec-{listener.lower()}"), 2)
        produce_numbered(cluster.plain, topic, 20)
        w = Worker(topics=[topic], group_id=unique("g"),
                   bootstrap_servers=cluster.secure[listener],
                   client_config=cluster.props(listener))
        seen: set[bytes] = set()
        w.handler(lambda msg, seen=seen: seen.add(msg.value or b""))
        runs.append((listener, topic, w, seen))
    with contextlib.ExitStack() as stack:
        for _listener, _topic, w, _seen in runs:
            stack.enter_context(running(w))
        for listener, topic, w, seen in runs:
            wait_for(cast("Callable[[], bool]", lambda seen=seen: len(seen) == 20), 60,
                     f"20 records over {listener}")
            # read back through the plaintext listener: the group committed all 20
            wait_for(cast("Callable[[], bool]", lambda topic=topic, w=w: committed_total_now(
                cluster.plain, w.config.group_id, topic, 2) == 20), 30, "the commits")


# --- refusals: one line naming the cause ---------------------------------------------------


def _refusals(c: Cluster) -> list[tuple[str, str, Props, str]]:
    """(case, listener, client properties, what the one error line must say)."""
    scram, mtls, oauth = c.props("SCRAM"), c.props("MTLS"), c.props("OAUTH")
    expired, untrusted = c.pki.expired("carol"), c.pki.untrusted("mallory")
    no_cert = {k: v for k, v in mtls.items() if not k.startswith(("ssl.certificate",
                                                                    "ssl.key"))}
    return [
        ("wrong CA", "SCRAM", {**scram, "ssl.ca.location": str(c.pki.other_ca)},
         f"TLS: the broker's certificate is not signed by a CA in the CA file ssl.ca.location "
         f"({c.pki.other_ca})"),
        ("host name", "WRONGHOST", {"security.protocol": "SSL", "ssl.ca.location": str(c.pki.ca)},
         "TLS: the broker's certificate is not valid for 127.0.0.1 (IP address mismatch"),
        ("no client certificate", "MTLS", no_cert,
         "TLS: the broker requires a client certificate (mTLS): set ssl.certificate.location"),
        ("expired client certificate", "MTLS",
         {**no_cert, "ssl.certificate.location": str(expired.cert),
          "ssl.key.location": str(expired.key)},
         f"TLS: the broker refused the client certificate {expired.cert}: it expired on "
         "2020-01-02 00:00 UTC"),
        ("untrusted client certificate", "MTLS",
         {**no_cert, "ssl.certificate.location": str(untrusted.cert),
          "ssl.key.location": str(untrusted.key)},
         f"TLS: the broker refused the client certificate {untrusted.cert} (TLS alert: "),
        ("wrong key password", "MTLS", {**mtls, "ssl.key.password": WRONG},
         f"TLS: cannot use the private key ssl.key.location ({mtls['ssl.key.location']}): a "
         "wrong ssl.key.password"),
        ("wrong SCRAM password", "SCRAM", {**scram, "sasl.password": WRONG},
         "authentication failed: wrong user name or password for SASL mechanism SCRAM-SHA-512"),
        ("wrong OIDC secret", "OAUTH", {**oauth, "sasl.oauthbearer.client.secret": WRONG},
         f"authentication failed: the token endpoint {c.idp.token_url} issued no token"),
        ("plaintext client", "SCRAM", {},
         "the listener speaks TLS but security.protocol is PLAINTEXT"),
    ]


def test_each_refusal_is_one_line_naming_its_cause_without_a_secret(cluster: Cluster) -> None:
    cases = _refusals(cluster)
    runs = [(case, want, kworkers("topics", "plan", "--topic", "orders", "--partitions", "1",
                                  "-b", cluster.secure[listener], *x_flags(props)))
            for case, listener, props, want in cases]
    for case, want, p in runs:
        code, out, err = done(p)
        assert code == 2, (case, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kworkers: error: "), (case, err)
        assert want in lines[0], (case, lines[0])
        assert "Traceback" not in out + err
        no_secret(out + err)
    assert cluster.idp.refused[OIDC_CLIENT] >= 1  # the OIDC refusal came from the endpoint


def test_a_client_that_skips_host_name_verification_gets_in_the_canary(cluster: Cluster) -> None:
    """The WRONGHOST certificate is trusted but names another host: only host name
    verification refuses it, so a kworkers that switched verification off would pass."""
    p = kworkers("topics", "plan", "--topic", "orders", "--partitions", "1",
                 "-b", cluster.secure["WRONGHOST"], "-X", "security.protocol=SSL",
                 "-X", f"ssl.ca.location={cluster.pki.ca}",
                 "-X", "ssl.endpoint.identification.algorithm=none")
    code, out, err = done(p)
    assert code == 0 and "plan: create=" in out, err



# --- the three ways to give credentials ----------------------------------------------------

#: property -> the KWORKERS_* variable that carries it
ENV_OF = {prop: var for var, prop in ENV_PROPERTIES.items()}
WAYS = ("file", "flags", "env")


def props_file(c: Cluster, listener: str) -> Path:
    """A client properties file as Kafka's tools take it (``--command-config``): the Java
    spelling where there is one (JAAS login modules, a PEM truststore), mode 0600."""
    ca = f"ssl.truststore.type=PEM\nssl.truststore.location={c.pki.ca}\n"
    if listener == "SCRAM":
        text = ("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
                f'required username="alice" password="{SCRAM_SECRET}";\n' + ca)
    elif listener == "OAUTH":
        text = ("security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
                f"sasl.oauthbearer.token.endpoint.url={c.idp.token_url}\n"
                "sasl.login.callback.handler.class=org.apache.kafka.common.security."
                "oauthbearer.OAuthBearerLoginCallbackHandler\n"
                "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer."
                f'OAuthBearerLoginModule required clientId="{OIDC_CLIENT}" '
                f'clientSecret="{OIDC_SECRET}" scope="kafka";\n' + ca)
    else:  # no Java spelling for a PEM client certificate: librdkafka's own properties
        text = "".join(f"{k}={v}\n" for k, v in c.props(listener).items())
    path = c.tmp / f"{listener.lower()}-{unique('client')}.properties"
    path.write_text(text)
    path.chmod(0o600)
    return path


def way(c: Cluster, listener: str, how: str) -> tuple[list[str], dict[str, str]]:
    """The command-line arguments and environment that give ``listener``'s credentials."""
    address = c.secure[listener]
    if how == "file":
        return ["-b", address, "--config", str(props_file(c, listener))], {}
    if how == "flags":
        return ["-b", address, *x_flags(c.props(listener))], {}
    assert how == "env", how
    return [], {"KWORKERS_BOOTSTRAP_SERVERS": address,
                **{ENV_OF[k]: v for k, v in c.props(listener).items()}}


# --- kworkers run --processes: secrets never on a child's command line nor in its environ ---

APP = """
from kworkers import Worker

# placeholders: the command line supplies the topic and the group
worker = Worker(topics=["placeholder"], group_id="placeholder")
worker.handler(lambda msg: None)
"""


def _exposed(pid: int) -> dict[str, list[str]]:
    """The secrets readable in ``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ``."""
    found: dict[str, list[str]] = {}
    for part in ("cmdline", "environ"):
        text = (Path("/proc") / str(pid) / part).read_bytes().decode(errors="replace")
        found[part] = [s for s in SECRETS if s in text]
    return found


def _pool(c: Cluster, tmp: Path, args: list[str], env: dict[str, str],
          launcher: list[str] | None = None) -> subprocess.Popen[str]:
    (tmp / "secapp.py").write_text(APP)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KWORKERS_")}
    command = launcher or [sys.executable, "-m", "kworkers.cli", "run", "secapp:worker",
                           "--processes", "2", *args]
    log = open(tmp / "pool.log", "w")  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(command, cwd=tmp, text=True, stdout=log,
                                stderr=subprocess.STDOUT,
                                env={**base, "PYTHONPATH": f"{ROOT}:{tmp}", **env})
    finally:
        log.close()


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _two_children(p: subprocess.Popen[str]) -> list[int]:
    """The pool's two children, once each runs its own program (between fork and exec a
    child still shows its parent's command line)."""
    kids: list[int] = []

    def two() -> bool:
        kids[:] = children(p.pid)
        started = all(b"--processes\x001\x00" in _cmdline(k) for k in kids)
        return (len(kids) == 2 and started) or p.poll() is not None

    wait_for(two, 60, "two worker processes")
    assert p.poll() is None and len(kids) == 2, p.pid
    return kids


def _stop(p: subprocess.Popen[str]) -> int:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    return p.wait(timeout=120)  # bounds a hang only


@pytest.mark.parametrize(("listener", "how"), [("SCRAM", "env"), ("MTLS", "flags"),
                                               ("OAUTH", "file")])
def test_processes_hand_secrets_to_children_through_a_pipe(cluster: Cluster, tmp_path: Path,
                                                           listener: str, how: str) -> None:
    topic = make_topic(cluster.plain, unique(f"pool-{listener.lower()}"), 4)
    group = unique("pool")
    produce_numbered(cluster.plain, topic, 40)
    args, env = way(cluster, listener, how)
    p = _pool(cluster, tmp_path, ["--topic", topic, "--group", group, *args], env)
    try:
        kids = _two_children(p)
        # read back through the plaintext listener: both children consumed and committed
        wait_for(lambda: p.poll() is not None
                 or committed_total_now(cluster.plain, group, topic, 4) == 40, 90,
                 "the pool to commit all 40 records")
        assert p.poll() is None, (tmp_path / "pool.log").read_text()[-3000:]
        for kid in kids:
            assert _exposed(kid) == {"cmdline": [], "environ": []}, kid
        # where the parent was given a secret on its command line or in its environment, it
        # is there (the check reads what it claims to read), and the children have none
        parent = _exposed(p.pid)
        given = {"env": "environ", "flags": "cmdline"}.get(how)
        if given is not None:
            assert parent[given], parent
    finally:
        code = _stop(p)
    assert code == 0
    assert committed_total_now(cluster.plain, group, topic, 4) == 40


CANARY_LAUNCHER = """
import sys
from kworkers.cli.pool import run_pool

# the launcher before kworkers.cli.child_secrets: -X flags and the environment handed on as is
sys.exit(run_pool(sys.argv[1:], 2, None))
"""


def test_the_cmdline_and_environ_checks_catch_an_argv_passing_launcher(
        cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "old_launcher.py").write_text(CANARY_LAUNCHER)
    topic = make_topic(cluster.plain, unique("canary"), 2)
    args, _ = way(cluster, "SCRAM", "flags")
    _, env = way(cluster, "MTLS", "env")  # KWORKERS_SSL_KEY_PASSWORD in the environment
    p = _pool(cluster, tmp_path, [], env, launcher=[
        sys.executable, str(tmp_path / "old_launcher.py"), "secapp:worker", "--topic", topic,
        "--group", unique("canary"), *args])
    try:
        kids = _two_children(p)
        for kid in kids:
            found = _exposed(kid)
            assert SCRAM_SECRET in found["cmdline"], found
            assert KEY_SECRET in found["environ"], found
    finally:
        _stop(p)


# --- every operator command, on every listener, every way -----------------------------------


def _commands(d: DeadLetters, listener: int) -> list[list[str]]:
    """The operator commands, on the dead letters ``d`` made through the plaintext listener
    (``listener``: which listener runs them, so each creates a topic of its own)."""
    return [
        ["topics", "plan", "--topic", d.topic, "--tiers", "250ms"],
        ["topics", "create", "--topic", f"{d.topic}-made-{listener}", "--partitions", "1",
         "--tiers", "250ms"],
        ["dlq", "list", "--dlq", d.dlq],
        ["dlq", "show", "--dlq", d.dlq, "-p", "0", "-o", "0"],
        ["dlq", "redrive", "--dlq", d.dlq, "--dry-run"],
        ["lag", "--group", d.group, "--topic", d.topic],
    ]


def test_every_operator_command_on_every_listener_every_way(cluster: Cluster,
                                                            dead_letters: DeadLetters) -> None:
    """A covering array: command j on listener i gets its credentials the way (i + j) mod 3,
    so every command meets every listener and every way, and every listener every way."""
    d = dead_letters
    runs = []
    for i, listener in enumerate(LISTENERS):
        for j, cmd in enumerate(_commands(d, i)):
            args, env = way(cluster, listener, WAYS[(i + j) % 3])
            runs.append((listener, cmd, kworkers(*cmd, *args, env=env)))
    for listener, cmd, p in runs:
        code, out, err = done(p)
        assert code == 0, (listener, cmd, err)
        no_secret(out + err)
    have = existing_topics(admin_client(cluster.plain))  # read back: created once each
    assert {f"{d.topic}-made-{i}" for i in range(3)} <= set(have)

    # a real redrive per listener (one at a time: a second would be fenced), one key each
    keys = poison(d, 0, 3)
    for i, listener in enumerate(LISTENERS):
        args, env = way(cluster, listener, WAYS[i])
        code, out, err = done(kworkers("dlq", "redrive", "--dlq", d.dlq, "--key", keys[i],
                                       *args, env=env))
        assert code == 0 and out.strip().endswith("redriven=1 skipped_already=0 selected=1"), (
            listener, out, err)
        no_secret(out + err)
    replays = [k for k, _v, h in read_all(cluster.plain, d.topic, 5) if "kw-redrive-of" in h]
    wanted = sorted(k.encode() for k in keys)
    assert sorted(k for k in replays if k in wanted) == wanted  # read back: once each


# --- the console ---------------------------------------------------------------------------


@contextlib.contextmanager
def console(args: list[str], env: dict[str, str]) -> Iterator[str]:
    """``kworkers console --port 0 ARGS``; yields the URL it announced."""
    p = kworkers("console", "--port", "0", *args, env={"PYTHONUNBUFFERED": "1", **env})
    assert p.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    line = p.stdout.readline() if sel.select(timeout=60) else ""
    try:
        if not line.startswith("kworkers console: "):
            p.kill()
            raise AssertionError(f"console did not start: {line!r} {p.communicate()[1]}")
        yield line.split()[2].rstrip("/")
    finally:
        p.terminate()
        _out, err = p.communicate(timeout=30)
        no_secret(_out + err)


def test_the_console_reads_the_dlq_over_every_listener(cluster: Cluster,
                                                       dead_letters: DeadLetters) -> None:
    d = dead_letters
    for i, listener in enumerate(LISTENERS):
        args, env = way(cluster, listener, WAYS[(i + 1) % 3])
        with console(args, env) as url:
            page = httpx.get(f"{url}/dlq/{d.dlq}", timeout=60)
            assert page.status_code == 200, page.text[-2000:]
            for n in d.poison:
                assert f"k{n}" in page.text
            no_secret(page.text)
            groups = httpx.get(f"{url}/groups", timeout=60)
            assert groups.status_code == 200 and d.group in groups.text, groups.text[-2000:]
            no_secret(groups.text)


# --- a worker started exactly as the rendered Deployment starts it --------------------------

Secrets = dict[str, dict[str, bytes]]


def pod(files: dict[str, str], secrets: Secrets, root: Path) -> tuple[list[str], dict[str, str]]:
    """The container's command line and environment as the kubelet builds them from the
    rendered Deployment: the ConfigMap (``envFrom``), the Secrets' variables
    (``secretKeyRef``) and the Secret volumes, whose keys are written as files under ``root``
    at their ``mountPath`` (the variables naming a path there follow it)."""
    dep = yaml.safe_load(files["k8s/deployment.yaml"])
    cm = yaml.safe_load(files["k8s/configmap.yaml"])
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env: dict[str, str] = {}
    for src in c["envFrom"]:
        assert src["configMapRef"]["name"] == cm["metadata"]["name"]
        env.update(cm["data"])
    for var in c.get("env", []):
        ref = var["valueFrom"]["secretKeyRef"]
        env[var["name"]] = secrets[ref["name"]][ref["key"]].decode()
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in c.get("volumeMounts", []):
        vol = volumes[mount["name"]]["secret"]
        where = root / mount["mountPath"].lstrip("/")
        where.mkdir(parents=True)
        for item in vol["items"]:
            path = where / item["path"]
            path.write_bytes(secrets[vol["secretName"]][item["key"]])
            path.chmod(vol["defaultMode"])
        env = {k: v.replace(mount["mountPath"], str(where), 1)
               if v.startswith(mount["mountPath"] + "/") else v for k, v in env.items()}
    return [*c["command"], *c["args"]], env


def start_pod(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """The image's entry point is the installed ``kworkers`` script; the package under test
    stands in for the image's installed one (PYTHONPATH), and nothing else is set."""
    bin_dir = str(Path(sys.executable).parent)
    assert (Path(bin_dir) / command[0]).exists(), f"no {command[0]} script in {bin_dir}"
    return subprocess.Popen(command, cwd="/", text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={
                                "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": ROOT, **env})


def _pool_config(c: Cluster, listener: str, client: Props) -> WorkerConfig:
    topic = make_topic(c.plain, unique(f"deploy-{listener.lower()}"), 2)
    config = WorkerConfig(topics=(topic,), group_id=unique("pods"),
                          bootstrap_servers=c.secure[listener], tiers=TierLadder((0.5,)),
                          drain_timeout=5, revoke_timeout=5, client_config=client)
    for name in (*config.tier_topics(), *config.dlq_topics()):
        make_topic(c.plain, name, 2)
    produce_numbered(c.plain, topic, 20)
    return config


if TYPE_CHECKING:
    class _RenderArgs(TypedDict):
        """The arguments of ``render`` both deployments share."""

        image: str
        app: str
        partitions: int
        module: str
        allow_loopback: bool


def _deployments(c: Cluster) -> list[tuple[str, WorkerConfig, dict[str, str], Secrets]]:
    """SCRAM over TLS (the SASL Secret as variables, the CA Secret as a file) and mTLS (the
    CA, the certificate and its key as files), each rendered as `deploy render` would."""
    alice = c.pki.client("alice")  # a Secret's tls.key is not encrypted
    scram = _pool_config(c, "SCRAM", {"sasl.mechanism": "SCRAM-SHA-512"})
    mtls = _pool_config(c, "MTLS", {"security.protocol": "SSL"})
    common: _RenderArgs = {"image": "kworkers/worker:test", "app": "orders", "partitions": 2,
              "module": "kworkers.deploy.example:worker", "allow_loopback": True}
    return [
        ("SCRAM", scram, render(scram, **common, metrics_port=free_port(),
                                sasl_secret="orders-kafka-sasl", tls_secret="orders-kafka-ca"),
         {"orders-kafka-sasl": {"username": b"alice", "password": SCRAM_SECRET.encode()},
          "orders-kafka-ca": {"ca.crt": c.pki.ca.read_bytes()}}),
        ("MTLS", mtls, render(mtls, **common, metrics_port=free_port(),
                              tls_secret="orders-kafka-tls", tls_client_cert=True),
         {"orders-kafka-tls": {"ca.crt": c.pki.ca.read_bytes(),
                               "tls.crt": alice.cert.read_bytes(),
                               "tls.key": alice.key.read_bytes()}}),
    ]


def test_the_rendered_deployment_reaches_the_tls_listeners(cluster: Cluster,
                                                           tmp_path: Path) -> None:
    runs = []
    for listener, config, files, secrets in _deployments(cluster):
        dep = files["k8s/deployment.yaml"]
        assert "mountPath: /etc/kworkers/tls" in dep and "readOnly: true" in dep
        command, env = pod(files, secrets, tmp_path / listener)
        assert command[:2] == ["kworkers", "run"]
        # certificates come as files, never as variables' values
        assert not any("BEGIN" in v for v in env.values())
        runs.append((listener, config, start_pod(command, env)))
    try:
        for listener, config, p in runs:
            topic = config.topics[0]
            wait_for(lambda: p.poll() is not None or committed_total_now(  # noqa: B023
                cluster.plain, config.group_id, topic, 2) == 20, 120,  # noqa: B023
                f"the {listener} pod to consume and commit all 20 records")
            assert p.poll() is None, p.communicate()[1][-3000:]
    finally:
        for _listener, _config, p in runs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
    for listener, config, p in runs:
        out, err = p.communicate(timeout=120)  # bounds a hang only
        assert p.returncode == 0, (listener, err[-3000:])
        no_secret(out + err)
        # read back through the plaintext listener: every record committed by the pods' group
        assert committed_total_now(cluster.plain, config.group_id, config.topics[0], 2) == 20

    # canary: the same pods with a CA Secret that did not sign the broker's certificate fail
    # in one line naming it, and never start consuming
    for listener, _config, files, secrets in _deployments(cluster):
        wrong = {name: {**keys, "ca.crt": cluster.pki.other_ca.read_bytes()}
                 if "ca.crt" in keys else keys for name, keys in secrets.items()}
        command, env = pod(files, wrong, tmp_path / f"{listener}-wrong-ca")
        out, err = start_pod(command, env).communicate(timeout=120)
        errors = [line for line in err.splitlines() if line.startswith("kworkers: error:")]
        assert len(errors) == 1 and "is not signed by a CA in the CA file" in errors[0], err
        no_secret(out + err)


# --- topics created as durable as their source -----------------------------------------------


def _min_insync(plain: str, topics: list[str]) -> dict[str, tuple[str, bool]]:
    """Each topic's min.insync.replicas and whether it is the topic's own, read back."""
    admin = admin_client(plain)
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics])
    out = {}
    for res, fut in futures.items():
        entry = fut.result(30)["min.insync.replicas"]
        source = getattr(entry.source, "value", entry.source)
        out[res.name] = (str(entry.value), source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    return out


def test_a_worker_creates_its_topics_as_durable_as_the_source(cluster: Cluster) -> None:
    plain = cluster.plain
    strict = unique("durable")
    create_topics(admin_client(plain), [TopicSpec(strict, 2, config={"min.insync.replicas": "2"})])
    loose = make_topic(plain, unique("loose"), 2)  # the broker's default (1)
    ladder = TierLadder((1.0,))
    derived = {src: [*(t.topic for t in ladder.tiers(src)), ladder.dlq_topic(src)]
               for src in (strict, loose)}
    # what `kworkers topics plan` says it will create, over the SCRAM listener
    args, env = way(cluster, "SCRAM", "flags")
    code, out, err = done(kworkers("topics", "plan", "--topic", strict, "--tiers", "1s",
                                   *args, env=env))
    assert code == 0 and out.count("1, min.insync.replicas=2") == 2, (out, err)

    w = Worker(topics=[strict, loose], group_id=unique("g"),
               bootstrap_servers=cluster.secure["SCRAM"], client_config=cluster.props("SCRAM"),
               tiers=ladder)
    assert sorted(w.prepare_topics()) == sorted(t for ts in derived.values() for t in ts)
    # read back through the plaintext listener
    have = admin_client(plain).list_topics(timeout=10).topics
    assert {len(have[t].partitions[0].replicas) for ts in derived.values() for t in ts} == {1}
    got = _min_insync(plain, [t for ts in derived.values() for t in ts])
    assert {got[t] for t in derived[strict]} == {("2", True)}  # copied from the source
    assert {got[t] for t in derived[loose]} == {("1", False)}  # the canary: the default


# --- the redrive audit: who replayed what, durably ------------------------------------------

def _console_redrive(url: str, dlq: str, key: str, user: str, token: str) -> str:
    """Plan and confirm a redrive of ``key`` in the console as ``user``; its job page."""
    with httpx.Client(base_url=url, auth=(user, token), timeout=60) as c:
        plan = c.get(f"/dlq/{dlq}/plan", params={"key": key})
        assert plan.status_code == 200, plan.text[-2000:]
        form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">',
                               plan.text))
        done = c.post(f"/dlq/{dlq}/redrive", data={k: html.unescape(v) for k, v in form.items()})
        assert done.status_code == 303, done.text[-2000:]
        job = done.headers["location"]
        page = ""

        def finished() -> bool:
            nonlocal page
            page = c.get(job).text
            return 'id="job-state">running' not in page

        wait_for(finished, 60, "the console's redrive to end")
        return page


def test_every_redrive_is_audited_and_the_console_shows_it_after_a_restart(
        cluster: Cluster, dead_letters: DeadLetters, tmp_path: Path) -> None:
    d = dead_letters
    k0, k3, k6 = poison(d, 3, 3)
    args, env = way(cluster, "SCRAM", "file")
    # the CLI, as this OS user
    code, out, err = done(kworkers("dlq", "redrive", "--dlq", d.dlq, "--key", k0, *args,
                                   env=env))
    assert code == 0 and out.strip().endswith("redriven=1 skipped_already=0 selected=1"), err
    # a redrive killed between its replay and its commit
    code, out, err = done(kworkers("dlq", "redrive", "--dlq", d.dlq, "--key", k3, *args,
                                   env={**env, "KWORKERS_REDRIVE_CRASH_AFTER": "1"}))
    assert code == CRASH_EXIT_CODE, (out, err)
    # the console, with a token per operator: bob redrives
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{CONSOLE_ALICE}\nbob:{CONSOLE_BOB}\n")
    console_args = [*args, "--token-file", str(tokens)]
    with console(console_args, env) as url:
        job = _console_redrive(url, d.dlq, k6, "bob", CONSOLE_BOB)
        assert "redriven=1 skipped_already=0 selected=1" in job, job[-2000:]
        # another operator's name with bob's token is refused
        assert httpx.get(f"{url}/dlq/{d.dlq}/history", auth=("alice", CONSOLE_BOB),
                         timeout=60).status_code == 401

    # read back through the plaintext listener: three runs, who, what and how each ended
    runs = {r.selection: r for r in read_audit(cluster.plain, d.dlq)}
    me = Actor.of_process("cli").who
    assert (runs[f"key={k0}"].who, runs[f"key={k0}"].via) == (me, "cli")
    assert runs[f"key={k0}"].result == "redriven=1 skipped_already=0 selected=1"
    assert runs[f"key={k3}"].ended is None  # killed: the start is there, no end
    bob = next(r for s, r in runs.items() if cast(str, s).startswith(f"key={k6}"))
    assert (bob.who, bob.via, bob.result) == ("bob", "console",
                                              "redriven=1 skipped_already=0 selected=1")
    # the ledger's readers still see only dead letters: a rerun skips what was replayed
    code, out, err = done(kworkers("dlq", "redrive", "--dlq", d.dlq, "--key", k0, *args,
                                   env=env))
    assert code == 0 and out.strip().endswith("redriven=0 skipped_already=1 selected=1"), err

    # a console started afresh (no jobs in its memory) shows every run from the audit topic
    with console(console_args, env) as url:
        page = httpx.get(f"{url}/dlq/{d.dlq}/history", auth=("alice", CONSOLE_ALICE),
                         timeout=60)
    assert page.status_code == 200, page.text[-2000:]
    assert "Redrives started in this console" not in page.text  # the canary: not from memory
    start = page.text.index('id="audit"')
    table = page.text[start:page.text.index("</table>", start)]
    for key in (k0, k3, k6):
        assert f"<td>key={key}" in table, key
    assert '<td class="who">bob</td><td>console</td>' in table
    assert f'<td class="who">{html.escape(me)}</td><td>cli</td>' in table
    assert "did not finish" in table
    no_secret(page.text)


# --- the demo, on a secured cluster ----------------------------------------------------------


def test_the_demo_runs_against_a_tls_listener_with_a_properties_file(
        cluster: Cluster, tmp_path: Path) -> None:
    args, _env = way(cluster, "SCRAM", "file")
    work = tmp_path / "demo"
    p = subprocess.run([sys.executable, str(Path(ROOT) / "examples" / "demo" / "demo.py"),
                        *args, "--orders", "12", "--processes", "1", "--kills", "0",
                        "--fail-rate", "0.3", "--timeout", "120", "--workdir", str(work)],
                       capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    no_secret(p.stdout + p.stderr + "".join(
        log.read_text("utf-8", "replace") for log in work.glob("worker-*.log")))
    # judged from the charges table the workers wrote: each order charged exactly once
    conn = sqlite3.connect(work / "demo.db")
    try:
        rows = [str(k) for (k,) in conn.execute("SELECT order_key FROM charges")]
    finally:
        conn.close()
    assert sorted(rows) == sorted(f"order-{i}/charge" for i in range(12))
