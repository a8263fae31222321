"""`kworkers deploy render` through its real entry point (no broker needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
ARGS = [sys.executable, "-m", "kworkers.cli", "deploy", "render",
        "kworkers.deploy.example:worker", "--image", "img:1", "--app", "orders",
        "--partitions", "6"]


def test_render_prints_every_manifest() -> None:
    out = subprocess.run(ARGS, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name in ("k8s/configmap.yaml", "k8s/deployment.yaml", "keda/scaledobject.yaml"):
        assert f"# --- {name}" in out.stdout
    assert "kind: ScaledObject" in out.stdout


def test_render_writes_files(tmp_path: Path) -> None:
    out = subprocess.run([*ARGS, "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "maxReplicaCount: 6" in (tmp_path / "keda" / "scaledobject.yaml").read_text()


def test_more_replicas_than_partitions_is_one_clear_error() -> None:
    out = subprocess.run([*ARGS, "--max-replicas", "9"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "partition" in lines[0], out.stderr


def _render(*extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KWORKERS_")}
    return subprocess.run([*ARGS, *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**clean, **(env or {})})


def test_render_takes_the_client_settings_kworkers_run_takes(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("bootstrap.servers=file:9093\nsasl.mechanism=SCRAM-SHA-256\n")
    out = _render("--config", str(props), "-X", "security.protocol=SASL_SSL",
                  "--sasl-secret", "kafka-creds",
                  env={"KWORKERS_SSL_CA_LOCATION": "/ca.pem", "KWORKERS_CONCURRENCY": "3"})
    assert out.returncode == 0, out.stderr
    for line in ("KWORKERS_BOOTSTRAP_SERVERS: file:9093", "KWORKERS_SECURITY_PROTOCOL: SASL_SSL",
                 "KWORKERS_SASL_MECHANISM: SCRAM-SHA-256", "KWORKERS_SSL_CA_LOCATION: /ca.pem",
                 'KWORKERS_CONCURRENCY: "3"', "sasl: scram_sha256", "tls: enable"):
        assert line in out.stdout, line


@pytest.mark.parametrize(("extra", "env", "needle"), [
    ([], {"KWORKERS_SASL_USERNAME": "u", "KWORKERS_SASL_PASSWORD": "s3cret-pw"},
     "pass sasl_secret"),
    (["-X", "client.id=w1"], {}, "client_config: client.id cannot travel"),
])
def test_render_refuses_what_would_not_reach_the_pods(extra: list[str], env: dict[str, str],
                                                      needle: str) -> None:
    out = _render(*extra, env=env)
    assert out.returncode == 2, out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "s3cret-pw" not in out.stdout + out.stderr
