"""A share group's state read back from the broker: each partition's start offset (every record
below it acknowledged or archived: KIP-932's share-partition start offset) and its lag (records
neither acknowledged nor archived).

confluent-kafka 2.16.1 has no share-group admin API (``kworkers/share/backlog.py``), and the
locally built broker image carries no ``kafka-share-groups.sh`` (it holds the broker's jars
only), so this runs Kafka's own Java ``Admin.listShareGroupOffsets``
(``tests/faults/share_offsets/ShareOffsets.java``, compiled once per machine with ``javac``)
against the ``kafka-clients`` jar of the Kafka distribution the broker fixture caches
(``$KWORKERS_CACHE/kafka-*/libs``), or, without that cache, the one in the broker image.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from kworkers.testing.broker import default_image

SOURCE = Path(__file__).resolve().parent / "share_offsets" / "ShareOffsets.java"
JARS = ("kafka-clients-", "slf4j-api-")


def _cache() -> Path:
    return Path(os.environ.get("KWORKERS_CACHE", Path.home() / ".cache" / "kworkers"))


def _jars() -> list[Path]:
    """kafka-clients and slf4j-api: from the cached distribution, else out of the image."""
    for libs in sorted(_cache().glob("kafka-*/libs"), reverse=True):
        found = [j for prefix in JARS for j in sorted(libs.glob(f"{prefix}*.jar"))[:1]]
        if len(found) == len(JARS):
            return found
    out = _cache() / "share-offsets-jars"
    out.mkdir(parents=True, exist_ok=True)
    image = os.environ.get("KWORKERS_KAFKA_IMAGE") or default_image()
    listing = subprocess.run(["docker", "run", "--rm", "--entrypoint", "ls", image,
                              "/opt/kafka/libs"], capture_output=True, text=True, timeout=120,
                             check=True).stdout.split()
    found = []
    for prefix in JARS:
        name = next(n for n in listing if n.startswith(prefix) and n.endswith(".jar"))
        target = out / name
        if not target.exists():
            with target.open("wb") as f:
                subprocess.run(["docker", "run", "--rm", "--entrypoint", "cat", image,
                                f"/opt/kafka/libs/{name}"], stdout=f, timeout=120, check=True)
        found.append(target)
    return found


def _classpath() -> str:
    """The jars and the compiled helper (compiled again only when its source changes)."""
    jars = _jars()
    digest = hashlib.sha256(SOURCE.read_bytes() + str(jars).encode()).hexdigest()[:12]
    classes = _cache() / f"share-offsets-{digest}"
    if not (classes / "ShareOffsets.class").exists():
        javac = shutil.which("javac")
        assert javac is not None, "javac is needed to read a share group's state back"
        tmp = classes.with_name(classes.name + f".tmp{os.getpid()}")
        subprocess.run([javac, "-cp", os.pathsep.join(map(str, jars)), "-d", str(tmp),
                        str(SOURCE)], check=True, capture_output=True, timeout=300)
        try:
            tmp.rename(classes)
        except OSError:  # another process compiled it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return os.pathsep.join([*map(str, jars), str(classes)])


def share_offsets(bs: str, group: str, timeout: float = 120.0) -> dict[tuple[str, int],
                                                                       tuple[int, int | None]]:
    """(topic, partition) -> (start offset, lag or None), read from the broker; asked again
    (bounded) while the broker or its share coordinator is not ready."""
    cp = _classpath()
    deadline = time.monotonic() + timeout
    while True:
        run = subprocess.run(["java", "-cp", cp, "ShareOffsets", bs, group],
                             capture_output=True, text=True, timeout=120)
        lines = run.stdout.split("\n")
        if run.returncode == 0 and "ok" in lines:
            out: dict[tuple[str, int], tuple[int, int | None]] = {}
            for line in lines:
                parts = line.split()
                if len(parts) == 4:
                    out[(parts[0], int(parts[1]))] = (
                        int(parts[2]), None if parts[3] == "-" else int(parts[3]))
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"cannot read share group {group}'s state: "
                                 f"{run.stderr[-2000:]}")
        time.sleep(1.0)


def start_offsets(bs: str, group: str, topic: str) -> dict[int, int]:
    """partition -> the share group's start offset on ``topic``: the floor below which
    every record was acknowledged (or archived), so none may be delivered again."""
    return {p: start for (t, p), (start, _lag) in share_offsets(bs, group).items()
            if t == topic}


def not_acknowledged(bs: str, group: str, topic: str, ends: dict[int, int]) -> list[str]:
    """Partitions of ``topic`` (those with records: ``ends``) where the group's lag read back is
    not 0: records neither acknowledged nor archived. The lag, not the start offset: the broker
    moves the start offset it reports in steps (measured on Kafka 4.3.1: 3,000 records all
    acknowledged, lag 0, start offset 1,856 for as long as it was read; 20 records, start
    offset 0), so only the lag says that everything was acknowledged. A partition the group
    has no state for, or no lag for, counts."""
    got = {p: v for (t, p), v in share_offsets(bs, group).items() if t == topic}
    out = []
    for p, end in sorted(ends.items()):
        start, lag = got.get(p, (None, None))
        if end > 0 and lag != 0:
            out.append(f"{topic}/{p}: lag {lag} (start offset {start}, log end {end})")
    return out
