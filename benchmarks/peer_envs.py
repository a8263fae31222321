"""The Python peers, each in a venv of its own, installed on first use.

Their pins conflict (quixstreams 3.28 pins confluent-kafka 2.12, the project uses 2.16), so
none of them is a dependency of kworkers or of the project's venv. Each lives in
``$KWORKERS_PEERS_DIR/<name>`` (default ``~/.cache/kworkers/peers/<name>``), made with the
running interpreter's ``venv`` and ``pip`` from PyPI; a stamp file records the requirement, so a
changed pin reinstalls. Versions are pinned so that figures can be compared across dates.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from benchmarks.common import console


@dataclass(frozen=True)
class Peer:
    name: str  # the venv's directory name
    requirement: str  # what pip installs
    label: str  # the side's label in tables and the RESULT line's key prefix


PEERS: tuple[Peer, ...] = (
    Peer("quix", "quixstreams==3.28.1", "quix"),
    Peer("arroyo", "sentry-arroyo==2.48.0", "arroyo"),
    Peer("faststream", "faststream[confluent]==0.7.8", "faststream"),
)
STAMP = ".kworkers-peer"


def peers_dir() -> Path:
    return Path(os.environ.get("KWORKERS_PEERS_DIR")
                or Path.home() / ".cache" / "kworkers" / "peers")


def python_of(peer: Peer) -> Path:
    return peers_dir() / peer.name / "bin" / "python"


def installed(peer: Peer) -> bool:
    stamp = peers_dir() / peer.name / STAMP
    return (python_of(peer).exists() and stamp.exists()
            and stamp.read_text().strip() == peer.requirement)


def ensure(peer: Peer) -> str:
    """The peer's interpreter, installing the venv first if it is missing or stale.
    Raises ``RuntimeError`` (with pip's last lines) when the install fails."""
    if installed(peer):
        return str(python_of(peer))
    where = peers_dir() / peer.name
    console.print(escape(f"installing {peer.requirement} into {where} (first use; PyPI)"))
    shutil.rmtree(where, ignore_errors=True)
    where.parent.mkdir(parents=True, exist_ok=True)
    steps = ([sys.executable, "-m", "venv", str(where)],
             [str(python_of(peer)), "-m", "pip", "install", "--quiet",
              "--disable-pip-version-check", peer.requirement])
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise RuntimeError(f"installing {peer.requirement} failed: " + " | ".join(tail))
    (where / STAMP).write_text(peer.requirement + "\n")
    return str(python_of(peer))
