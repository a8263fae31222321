"""SASL/PLAIN: the right credentials work; wrong ones fail with one clear error; no secret leaks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kworkers import Message, Worker
from kworkers.testing import broker_from_env
from kworkers.testing.broker import ExternalBroker
from kworkers.testing.workload import make_topic, produce_numbered, unique
from tests.integration.conftest import running, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]
ROOT = str(Path(__file__).resolve().parents[2])
SECRET = "alice-s3cret-value"
WRONG = "definitely-wrong-pass"


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[tuple[str, str]]:
    broker = broker_from_env(sasl_users={"alice": SECRET})
    if isinstance(broker, ExternalBroker):
        pytest.skip("KWORKERS_BOOTSTRAP names an external broker; SASL needs a fixture broker")
    broker.start()
    try:
        sasl = getattr(broker, "sasl_bootstrap", None)
        assert sasl
        yield broker.bootstrap_servers, sasl
    finally:
        broker.close()


def _sasl(password: str) -> dict[str, str | int | float | bool]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "alice", "sasl.password": password}


def test_right_credentials_work(sasl_broker: tuple[str, str]) -> None:
    plain, sasl = sasl_broker
    topic = make_topic(plain, unique("sasl"), 2)
    produce_numbered(plain, topic, 20)
    w = Worker(topics=[topic], group_id=unique("g"), bootstrap_servers=sasl,
               consumer_config=_sasl(SECRET))
    w.create_topics()
    seen: set[bytes] = set()

    @w.handler
    def handle(msg: Message) -> None:
        seen.add(msg.value or b"")

    with running(w):
        wait_for(lambda: len(seen) == 20, 60, "20 records over SASL")


def test_wrong_credentials_fail_with_one_clear_error(sasl_broker: tuple[str, str]) -> None:
    plain, sasl = sasl_broker
    topic = make_topic(plain, unique("sasl"), 1)
    script = textwrap.dedent(f"""
        import logging, sys
        logging.basicConfig(level=logging.INFO)
        from kworkers import Worker, ConfigError
        w = Worker(topics=[{topic!r}], group_id="g", bootstrap_servers={sasl!r},
                   consumer_config={_sasl(WRONG)!r})
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
    assert WRONG not in out.stdout + out.stderr
    assert SECRET not in out.stdout + out.stderr
