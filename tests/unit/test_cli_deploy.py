"""`kworkers deploy render` through its real entry point (no broker needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
