"""SASL/PLAIN: the right credentials work; wrong ones fail with one clear error; no secret leaks.

The broker is this module's own, always (a SASL listener and an authorizer cannot be added to
a broker somebody else runs), so these tests run even when ``KWORKERS_BOOTSTRAP`` names one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kworkers import Message, Worker
from kworkers.testing.broker import Broker, ContainerBroker, ProcessBroker, default_image
from kworkers.testing.workload import make_topic, produce_numbered, unique
from tests.integration.conftest import running, wait_for

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


def own_broker() -> Broker:
    """A broker of this module's own, whatever KWORKERS_BOOTSTRAP says."""
    users = {"alice": SECRET, "bob": BOB_SECRET}
    if os.environ.get("KWORKERS_BROKER", "container") == "process":
        return ProcessBroker(extra_env=AUTHORIZER, sasl_users=users)
    image = os.environ.get("KWORKERS_KAFKA_IMAGE") or default_image()
    return ContainerBroker(image, extra_env=AUTHORIZER, sasl_users=users)


@pytest.fixture(scope="module")
def sasl_cluster() -> Iterator[SaslCluster]:
    broker = own_broker()
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
