"""`kworkers demo flaky` with small numbers on the session broker: it must verify and exit 0."""

from __future__ import annotations

import re

import pytest

from kworkers.testing import Broker
from tests.integration.test_cli_support import cli

pytestmark = pytest.mark.integration


def _row(out: str, name: str) -> str:
    m = re.search(rf"│ {re.escape(name)}\s*│ ([^│]*?)\s*│", out)
    assert m is not None, f"no {name!r} row in:\n{out}"
    return m.group(1)


def test_demo_flaky_small_verifies(kafka_broker: Broker) -> None:
    p = cli("demo", "flaky", "--activities", "40", "--kills", "1", "--processes", "2",
            "--bootstrap", kafka_broker.bootstrap_servers, "--timeout", "240", timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    out = p.stdout
    assert "verified: 40 activities, 40 effects, each exactly once" in out
    assert _row(out, "activities") == "40"
    assert _row(out, "effects applied").startswith("40 (40 distinct keys")
    assert _row(out, "duplicate effects") == "0"
    assert _row(out, "lost") == "0"
    assert _row(out, "SIGKILLs") == "1"
    assert "SIGKILL worker" in out
    dead = int(_row(out, "dead letters").split()[0])
    assert int(_row(out, "redriven")) == dead  # every dead letter replayed, once
    deliveries = int(_row(out, "deliveries").split()[0])
    assert deliveries >= 40
    assert re.search(r"redrive: redriven=\d+ skipped_already=0 selected=\d+", out)
