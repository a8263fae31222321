"""KEDA's own Kafka scaler, driven from the tests (``deploy/keda/scaler-probe``), and KEDA's CRDs.

The probe is a small Go program built against ``github.com/kedacore/keda/v2`` (v2.18.0): one
``scalers.NewKafkaScaler`` per Kafka trigger, made once and kept across polls as KEDA's operator
keeps it (``excludePersistentLag`` compares a poll's committed offsets with the previous one's),
and each ``poll`` answered with ``GetMetricsAndActivity``: the metric KEDA hands the HPA and
whether the trigger is active. ``scripts/lib.sh``'s ``ensure_keda_probe`` builds it once per
machine into ``~/.cache/kworkers/keda-probe-<hash>`` (never in the clone) beside a copy of KEDA's
``ScaledObject`` and ``TriggerAuthentication`` CRDs from the same module.

``probe_path()`` and ``crds_dir()`` find them (``KWORKERS_KEDA_PROBE``/``KWORKERS_KEDA_CRDS``, or
the cache directory of the current source's hash) and skip the test when absent: under CI a skip
is a failure (``kworkers.testing.pytest_plugin``), so a machine that cannot build the probe
fails those tests rather than passing them silently.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "deploy" / "keda" / "scaler-probe"
CRD_FILES = ("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml")
#: metadata the test broker cannot honour (plaintext, no credentials): dropped from a trigger
_SECURITY_KEYS = ("tls", "sasl", "unsafeSsl", "saslTokenProvider", "awsRegion")


def cache_dir() -> Path:
    """Where ``ensure_keda_probe`` builds the current source (scripts/lib.sh's same hash)."""
    digest = hashlib.sha256(b"".join(
        (SOURCE / name).read_bytes() for name in ("go.mod", "go.sum", "main.go"))).hexdigest()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kworkers" / f"keda-probe-{digest[:16]}"


def _missing(what: str) -> None:
    import pytest

    pytest.skip(f"{what} is not built: run `bash -c 'source scripts/lib.sh; "
                "ensure_keda_probe'` (Go >= 1.24.7 and the Go module proxy)")


def probe_path() -> Path:
    """The probe's binary; the calling test skips (fails under CI) when it is not built."""
    env = os.environ.get("KWORKERS_KEDA_PROBE")
    path = Path(env) if env else cache_dir() / "keda-scaler-probe"
    if not os.access(path, os.X_OK):
        _missing(f"KEDA's Kafka scaler probe ({path})")
    return path


def crds_dir() -> Path:
    """The directory holding KEDA's CRDs; skips (fails under CI) when absent."""
    env = os.environ.get("KWORKERS_KEDA_CRDS")
    path = Path(env) if env else cache_dir() / "crds"
    if not all((path / f).is_file() for f in CRD_FILES):
        _missing(f"KEDA's CRDs ({path})")
    return path


def kafka_triggers(scaledobject: Mapping[str, Any], bootstrap: str,
                   names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The rendered ScaledObject's Kafka triggers as the probe takes them: the metadata as
    rendered but for the broker's address and the security settings a plaintext test broker
    cannot honour."""
    out = []
    wanted = None if names is None else set(names)
    for i, trig in enumerate(scaledobject["spec"]["triggers"]):
        if trig["type"] != "kafka":
            continue
        name = trig.get("name") or f"kafka-{i}"
        if wanted is not None and name not in wanted:
            continue
        meta = {k: str(v) for k, v in trig["metadata"].items() if k not in _SECURITY_KEYS}
        meta["bootstrapServers"] = bootstrap
        out.append({"name": name, "metadata": meta})
    return out


@dataclass(frozen=True)
class Reading:
    """One trigger's answer to a poll: KEDA's metric (what the HPA divides by ``target``) and
    whether KEDA judges it active (activation 0 <-> 1); or the scaler's ``error`` (then the
    value is NaN: a judge comparing values cannot take an error for a reading of 0)."""

    name: str
    value: float
    active: bool
    target: float
    error: str | None = None


class KedaScaler:
    """The probe process: its scalers live until ``close``."""

    def __init__(self, triggers: list[dict[str, Any]], probe: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(probe or probe_path())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        made = self._ask(json.dumps({"triggers": triggers}))
        self.targets = {t["name"]: float(t.get("target", 0.0)) for t in made["triggers"]}
        self.metrics = {t["name"]: t["metric"] for t in made["triggers"]}

    def _ask(self, line: str) -> dict[str, Any]:
        stdin: IO[str] | None = self.proc.stdin
        stdout: IO[str] | None = self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(line + "\n")
        stdin.flush()
        answer = stdout.readline()
        if not answer:
            raise RuntimeError(f"the KEDA scaler probe exited ({self.proc.wait(10)})")
        reply: dict[str, Any] = json.loads(answer)
        if reply.get("error"):
            raise RuntimeError(f"KEDA's Kafka scaler: {reply['error']}")
        return reply

    def poll(self) -> dict[str, Reading]:
        """Every trigger polled once, as KEDA's operator does each pollingInterval. A trigger
        the scaler fails to read is a ``Reading`` with its ``error``, as KEDA's operator
        gets it (and goes on: ``scaling_loop``), not an exception that ends the caller."""
        out = {}
        for t in self._ask("poll")["triggers"]:
            name = t["name"]
            if t.get("error"):
                out[name] = Reading(name, math.nan, False, self.targets[name], str(t["error"]))
                continue
            out[name] = Reading(name, float(t["value"]), bool(t["active"]), self.targets[name])
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> KedaScaler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
