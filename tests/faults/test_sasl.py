"""SASL/PLAIN: the right credentials work; wrong ones fail with one clear error; no secret leaks.

The broker is this module's own, always (a SASL listener and an authorizer cannot be added to
a broker somebody else runs), so these tests run even when ``KWORKERS_BOOTSTRAP`` names one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from kworkers import ConfigError, Message, RetryPolicy, TierLadder, Worker, WorkerConfig
from kworkers.deploy import render
from kworkers.errors import WorkerFailed
from kworkers.kafka.admin import admin_client, create_topics, existing_topics
from kworkers.kafka.settings import ClientSettings
from kworkers.testing.broker import broker_from_env, free_port
from kworkers.testing.checker import committed
from kworkers.testing.workload import (
    make_topic,
    produce_numbered,
    read_all,
    unique,
)
from kworkers.topic_plan import TopicSpec
from tests.faults.test_security import committed_total_now
from tests.integration.conftest import run_to_end, running, wait_for
from tests.integration.test_cli_support import DeadLetters, make_dead_letters

pytestmark = [pytest.mark.integration, pytest.mark.faults]

ROOT = str(Path(__file__).resolve().parents[2])
SECRET = "alice-s3cret-value"
WRONG = "definitely-wrong-pass"
BOB_SECRET = "bob-0ther-s3cret"
#: alice may do anything; bob only what a test grants him (the plain listener is ANONYMOUS,
#: a super user too, so the tests set things up through it)
AUTHORIZER = {
    "KAFKA_AUTHORIZER_CLASS_NAME": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "KAFKA_SUPER_USERS": "User:ANONYMOUS;User:alice",
}


@dataclass(frozen=True)
class SaslCluster:
    plain: str  # PLAINTEXT listener, super user: set-up and read-back
    sasl: str  # SASL_PLAINTEXT listener: what the code under test uses


def sasl(password: str, user: str = "alice") -> dict[str, str | int | float | bool]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": password}


@pytest.fixture(scope="module")
def sasl_cluster() -> Iterator[SaslCluster]:
    # a broker of this module's own, whatever KWORKERS_BOOTSTRAP says
    broker = broker_from_env(AUTHORIZER, {"alice": SECRET, "bob": BOB_SECRET}, own=True)
    broker.start()
    try:
        bs = getattr(broker, "sasl_bootstrap", None)
        assert bs
        yield SaslCluster(broker.bootstrap_servers, bs)
    finally:
        broker.close()


def test_right_credentials_work(sasl_cluster: SaslCluster) -> None:
    plain, bs = sasl_cluster.plain, sasl_cluster.sasl
    topic = make_topic(plain, unique("sasl"), 2)
    produce_numbered(plain, topic, 20)
    w = Worker(topics=[topic], group_id=unique("g"), bootstrap_servers=bs,
               client_config=sasl(SECRET))
    w.create_topics()
    seen: set[bytes] = set()

    @w.handler
    def handle(msg: Message) -> None:
        seen.add(msg.value or b"")

    with running(w):
        wait_for(lambda: len(seen) == 20, 60, "20 records over SASL")


def test_wrong_credentials_fail_with_one_clear_error(sasl_cluster: SaslCluster) -> None:
    plain, bs = sasl_cluster.plain, sasl_cluster.sasl
    topic = make_topic(plain, unique("sasl"), 1)
    script = textwrap.dedent(f"""
        import logging, sys
        logging.basicConfig(level=logging.INFO)
        from kworkers import Worker, ConfigError
        w = Worker(topics=[{topic!r}], group_id="g", bootstrap_servers={bs!r},
                   client_config={sasl(WRONG)!r})
        w.handler(lambda m: None)
        try:
            w.run(install_signals=False)
        except ConfigError as exc:
            print(f"error: {{exc}}", file=sys.stderr)
            sys.exit(2)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "cannot reach Kafka at" in errors[0], out.stderr[-2000:]
    assert "authentication failed" in errors[0], errors
    assert WRONG not in out.stdout + out.stderr
    assert SECRET not in out.stdout + out.stderr


# --- every operator command, over SASL -------------------------------------------------------


def _kworkers(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``kworkers ARGS`` through its real entry point, started (run several at once)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KWORKERS_")}
    return subprocess.Popen([sys.executable, "-m", "kworkers.cli", *args], cwd=ROOT, text=True,
                            env={**base, "PYTHONPATH": ROOT, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _done(p: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=180)  # bounds a hang only
    return p.returncode, out, err


def _props(tmp: Path, password: str) -> Path:
    """A client properties file as Kafka's tools take it (--command-config), JAAS and all."""
    path = tmp / f"client-{len(list(tmp.iterdir()))}.properties"
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="alice" password="{password}";\n')
    return path


def _ways(bs: str, password: str, tmp: Path) -> list[tuple[list[str], dict[str, str]]]:
    """The three ways to give credentials: a --config file, -X flags, KWORKERS_* variables."""
    x = [a for k, v in sasl(password).items() for a in ("-X", f"{k}={v}")]
    return [
        (["-b", bs, "--config", str(_props(tmp, password))], {}),
        (["-b", bs, *x], {}),
        ([], {"KWORKERS_BOOTSTRAP_SERVERS": bs, "KWORKERS_SASL_USERNAME": "alice",
              "KWORKERS_SASL_PASSWORD": password}),
    ]


def _commands(d: DeadLetters, group: str) -> list[list[str]]:
    return [
        ["topics", "plan", "--topic", d.topic, "--tiers", "250ms"],
        ["topics", "create", "--topic", d.topic, "--tiers", "250ms"],
        ["dlq", "list", "--dlq", d.dlq],
        ["dlq", "show", "--dlq", d.dlq, "-p", "0", "-o", "0"],
        ["dlq", "redrive", "--dlq", d.dlq, "--dry-run"],
        ["lag", "--group", group, "--topic", d.topic],
    ]


def test_every_operator_command_with_the_right_credentials_every_way(
        sasl_cluster: SaslCluster, tmp_path: Path) -> None:
    d = make_dead_letters(sasl_cluster.plain, n=6, partitions=1)
    for args, env in _ways(sasl_cluster.sasl, SECRET, tmp_path):
        runs = [(cmd, _kworkers(*cmd, *args, env=env)) for cmd in _commands(d, d.group)]
        for cmd, p in runs:
            code, out, err = _done(p)
            assert code == 0, (cmd, args, env, err)
            assert SECRET not in out + err
    code, out, err = _done(_kworkers("dlq", "redrive", "--dlq", d.dlq,
                                     *_ways(sasl_cluster.sasl, SECRET, tmp_path)[0][0]))
    assert code == 0 and out.strip().endswith(f"redriven={len(d.poison)} skipped_already=0 "
                                              f"selected={len(d.poison)}"), err
    # read back through the plain listener: the replays are there, once each
    replays = [h for _k, _v, h in read_all(sasl_cluster.plain, d.topic, 5)
               if "kw-redrive-of" in h]
    assert len(replays) == len(d.poison)


def test_every_operator_command_refuses_wrong_credentials_in_one_line(
        sasl_cluster: SaslCluster, tmp_path: Path) -> None:
    d = make_dead_letters(sasl_cluster.plain, n=3, partitions=1)
    runs = [(cmd, args, _kworkers(*cmd, *args, env=env))
            for args, env in _ways(sasl_cluster.sasl, WRONG, tmp_path)
            for cmd in [*_commands(d, d.group), ["dlq", "redrive", "--dlq", d.dlq]]]
    for cmd, args, p in runs:
        code, out, err = _done(p)
        assert code == 2, (cmd, args, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"kworkers: error: cannot reach Kafka at {sasl_cluster.sasl} (authentication "
            "failed"), (cmd, args, err)
        assert WRONG not in out + err and SECRET not in out + err


# --- a worker started the way the rendered Deployment starts it ------------------------------


def _pod(files: dict[str, str], secret: dict[str, str] | None
         ) -> tuple[list[str], dict[str, str]]:
    """The container's command line and environment as the kubelet builds them from the
    rendered Deployment, its ConfigMap (``envFrom``) and the Secret (``secretKeyRef``;
    ``None``: the Secret's variables are missing)."""
    dep = yaml.safe_load(files["k8s/deployment.yaml"])
    cm = yaml.safe_load(files["k8s/configmap.yaml"])
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for src in c["envFrom"]:
        assert src["configMapRef"]["name"] == cm["metadata"]["name"]
        env.update(cm["data"])
    for var in c.get("env", []):
        if secret is not None:
            env[var["name"]] = secret[var["valueFrom"]["secretKeyRef"]["key"]]
    return [*c["command"], *c["args"]], env


def _start_pod(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """The image's entry point is the installed ``kworkers`` script; here the package under
    test stands in for the image's installed one (PYTHONPATH), and nothing else is set."""
    bin_dir = str(Path(sys.executable).parent)
    assert (Path(bin_dir) / command[0]).exists(), f"no {command[0]} script in {bin_dir}"
    return subprocess.Popen(command, cwd="/", text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={
                                "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": ROOT, **env})


def test_the_rendered_deployment_reaches_a_sasl_cluster(sasl_cluster: SaslCluster) -> None:
    plain = sasl_cluster.plain
    topic = make_topic(plain, unique("deploy"), 2)
    config = WorkerConfig(topics=(topic,), group_id=unique("pods"),
                          bootstrap_servers=sasl_cluster.sasl, tiers=TierLadder((0.5,)),
                          drain_timeout=5, revoke_timeout=5)
    for name in (*config.tier_topics(), *config.dlq_topics()):
        make_topic(plain, name, 2)
    produce_numbered(plain, topic, 20)
    # SASL over plaintext is this listener's whole point: asked for explicitly, as render
    # refuses it otherwise; the pod runs on this machine, so its loopback address is the broker
    files = render(config, image="kworkers/worker:test", app="orders", partitions=2,
                   module="kworkers.deploy.example:worker", metrics_port=free_port(),
                   sasl_secret="orders-kafka-sasl", plaintext_sasl=True, allow_loopback=True)
    command, env = _pod(files, {"username": "alice", "password": SECRET})
    assert command[:2] == ["kworkers", "run"] and "KWORKERS_SASL_PASSWORD" in env

    pod = _start_pod(command, env)
    try:
        wait_for(lambda: pod.poll() is not None
                 or committed_total_now(plain, config.group_id, topic, 2) == 20, 120,
                 "the pod to consume and commit all 20 records")
        assert pod.poll() is None, pod.communicate()[1][-3000:]
    finally:
        if pod.poll() is None:
            pod.send_signal(signal.SIGTERM)
        _out, err = pod.communicate(timeout=120)  # bounds a hang only
    assert pod.returncode == 0, err[-3000:]
    assert SECRET not in _out + err
    # read back through the plain listener: every record committed by the pod's group
    assert committed_total_now(plain, config.group_id, topic, 2) == 20

    # canaries: the same pod without the Secret's variables, or with a wrong password, fails
    # in one line and never starts consuming
    for secret, why in ((None, "sasl.username and sasl.password must be set"),
                        ({"username": "alice", "password": WRONG}, "authentication failed")):
        command, env = _pod(files, secret)
        out, err = _start_pod(command, env).communicate(timeout=120)
        errors = [line for line in err.splitlines() if line.startswith("kworkers: error:")]
        assert len(errors) == 1 and why in errors[0], err[-3000:]
        assert WRONG not in out + err


# --- a worker creates its missing tier and DLQ topics, where the cluster lets it -------------


def _grant(plain: str, prefix: str, *ops: AclOperation) -> None:
    """bob may do ``ops`` on every topic and group whose name starts with ``prefix``."""
    bindings = [AclBinding(kind, prefix, ResourcePatternType.PREFIXED, "User:bob", "*", op,
                           AclPermissionType.ALLOW)
                for kind, kind_ops in ((ResourceType.TOPIC, ops),
                                       (ResourceType.GROUP, (AclOperation.READ,)))
                for op in kind_ops]
    admin = admin_client(plain)  # held until the futures resolve
    for fut in admin.create_acls(bindings).values():
        fut.result(30)


def _derived(config: WorkerConfig) -> set[str]:
    return {*config.tier_topics(), *config.dlq_topics()}


def test_a_worker_creates_its_missing_topics_sized_like_the_source(
        sasl_cluster: SaslCluster) -> None:
    plain = sasl_cluster.plain
    topic = make_topic(plain, unique("auto"), 3)
    produce_numbered(plain, topic, 10)
    w = Worker(topics=[topic], group_id=unique("g"), bootstrap_servers=sasl_cluster.sasl,
               client_config=sasl(SECRET), tiers=TierLadder((0.5, 2.0)))
    assert not _derived(w.config) & set(existing_topics(admin_client(plain)))
    seen: set[bytes] = set()
    w.handler(lambda msg: seen.add(msg.value or b""))
    with running(w):
        wait_for(lambda: len(seen) == 10, 60, "10 records")
    have = existing_topics(admin_client(plain))  # read back through the plain listener
    assert {t: have.get(t) for t in _derived(w.config)} == dict.fromkeys(_derived(w.config), 3)

    # switched off, a missing tier is today's error, and nothing is created
    off = Worker(topics=[make_topic(plain, unique("off"), 2)], group_id=unique("g"),
                 bootstrap_servers=sasl_cluster.sasl, client_config=sasl(SECRET),
                 auto_create_topics=False)
    off.handler(lambda msg: None)
    with pytest.raises(ConfigError, match=r"^topics missing on .*kworkers topics create"):
        off.run(install_signals=False)
    assert not _derived(off.config) & set(existing_topics(admin_client(plain)))


def test_where_acls_refuse_creation_the_error_stays_clear(sasl_cluster: SaslCluster) -> None:
    plain, prefix = sasl_cluster.plain, unique("acl")
    topic = make_topic(plain, f"{prefix}-src", 2)
    _grant(plain, prefix, AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE)
    # the grant takes effect a moment later: until bob may describe the source, it reads as
    # missing too and the error names only it (ci90: "source topic missing on ...")
    bob = admin_client(ClientSettings(sasl_cluster.sasl, security=sasl(BOB_SECRET, "bob")))
    wait_for(lambda: topic in existing_topics(bob), 30, "bob sees the source topic")
    w = Worker(topics=[topic], group_id=f"{prefix}-g", bootstrap_servers=sasl_cluster.sasl,
               client_config=sasl(BOB_SECRET, "bob"), tiers=TierLadder((1.0,)))
    w.handler(lambda msg: None)
    with pytest.raises(ConfigError) as refused:
        w.run(install_signals=False)
    assert str(refused.value).startswith(f"topics missing on {sasl_cluster.sasl}: ")
    assert "creating them was refused" in str(refused.value)
    assert BOB_SECRET not in str(refused.value)
    assert not _derived(w.config) & set(existing_topics(admin_client(plain)))

    # canary: the same worker, once bob may create topics, creates them (so it was the ACL)
    _grant(plain, prefix, AclOperation.CREATE)
    made: list[str] = []

    def creates() -> bool:
        try:
            made.extend(w.prepare_topics())
        except ConfigError:  # ACLs reach the authorizer through the metadata log
            return False
        return True

    wait_for(creates, 30, "bob to be allowed to create topics")
    assert set(made) == _derived(w.config)


# --- hand-offs the ACLs refuse (issue 15: no record blocks a partition) ----------------------


def _deny_write(plain: str, topic: str) -> None:
    binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:bob",
                         "*", AclOperation.WRITE, AclPermissionType.DENY)
    admin = admin_client(plain)  # held until the futures resolve
    for fut in admin.create_acls([binding]).values():
        fut.result(30)


def _bob_may_write(bs: str, topic: str) -> bool:
    outcome: list[KafkaError | None] = []
    p = Producer({"bootstrap.servers": bs, "log_level": 0, "message.timeout.ms": 10_000,
                  **sasl(BOB_SECRET, "bob")})
    p.produce(topic, b"probe", on_delivery=lambda err, _m: outcome.append(err))
    p.flush(15)
    return bool(outcome) and outcome[0] is None


@dataclass
class _Denied:
    """A source whose tier bob may not write to (its DLQ he may), and bob's worker on it."""

    cluster: SaslCluster
    topic: str
    tier: str
    dlq: str
    group: str
    runs: list[bytes]

    def worker(self) -> Worker:
        ladder = TierLadder((0.2,))
        w = Worker(topics=[self.topic], group_id=self.group,
                   bootstrap_servers=self.cluster.sasl, client_config=sasl(BOB_SECRET, "bob"),
                   tiers=ladder, retry=RetryPolicy(initial=0.1, max_attempts=3),
                   auto_create_topics=False,
                   drain_timeout=2)  # a stop waits for a hand-off the DLQ refuses: bounded

        @w.handler
        def fail(msg: Message) -> None:
            self.runs.append(msg.value or b"")
            raise ConnectionError("downstream down")  # retryable: to the tier, denied

        return w


def _denied_tier(sasl_cluster: SaslCluster) -> _Denied:
    plain, prefix = sasl_cluster.plain, unique("deny")
    ladder = TierLadder((0.2,))
    topic = make_topic(plain, f"{prefix}-src", 1)
    tier, dlq = ladder.tiers(topic)[0].topic, ladder.dlq_topic(topic)
    create_topics(admin_client(plain), [TopicSpec(t, 1) for t in ladder.all_topics(topic)])
    _grant(plain, prefix, AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE)
    _deny_write(plain, tier)
    wait_for(lambda: _bob_may_write(sasl_cluster.sasl, dlq)
             and not _bob_may_write(sasl_cluster.sasl, tier), 60, "the ACLs to apply")
    return _Denied(sasl_cluster, topic, tier, dlq, f"{prefix}-g", [])


def test_a_hand_off_the_acls_refuse_goes_to_the_own_dlq_with_the_reason(
        sasl_cluster: SaslCluster) -> None:
    d = _denied_tier(sasl_cluster)
    plain, topic, tier, dlq, group, runs = (sasl_cluster.plain, d.topic, d.tier, d.dlq,
                                            d.group, d.runs)
    produce_numbered(plain, topic, 1)
    w = d.worker()
    with running(w):
        wait_for(lambda: bool(read_all(plain, dlq, 3)), 60, "the dead letter")
        wait_for(lambda: committed(plain, group, topic)[0] == 1, 30, "the commit past it")
        assert w.fault is None, w.fault  # healthy: the record went where it could
    dead = [h for _k, _v, h in read_all(plain, dlq, 5) if "kw-error-type" in h]
    assert len(dead) == 1 and dead[0]["kw-error-type"] == b"HandOffError", dead
    assert b"TOPIC_AUTHORIZATION_FAILED" in dead[0]["kw-error-message"], dead
    assert runs == [b"0"]  # run once; never retried where it could not go
    assert not read_all(plain, tier, 3)


# in CI since issue #44 (a few seconds); the same logic is tests/unit/test_handoff_step.py's,
# its canary (a refusal taken for an acknowledgement commits past the record) is in
# test_hostile_records.py (test_canary_a_dlq_refusal_taken_for_an_acknowledgement_...)
def test_where_the_dlq_is_refused_too_the_worker_turns_unhealthy_and_keeps_the_record(
        sasl_cluster: SaslCluster) -> None:
    d = _denied_tier(sasl_cluster)
    plain, topic, dlq, group = sasl_cluster.plain, d.topic, d.dlq, d.group
    _deny_write(plain, dlq)
    wait_for(lambda: not _bob_may_write(sasl_cluster.sasl, dlq), 60, "the DLQ ACL to apply")
    produce_numbered(plain, topic, 1)
    w = d.worker()
    failed = run_to_end(w, 90)
    assert isinstance(failed, WorkerFailed), failed
    assert w.fault is not None and w.fault.component == "dead-letter queue", w.fault
    assert dlq in w.fault.reason and "AUTHORIZATION" in w.fault.reason, w.fault
    assert committed(plain, group, topic).get(0, -1) <= 0  # never past the record it kept
