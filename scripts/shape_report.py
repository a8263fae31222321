"""The code's shape in the figures issue #48 asks for, measured the same way before and after.

    .venv/bin/python scripts/shape_report.py [--pylint]

Prints, for ``kworkers/``:

- **the failure path**: the kworkers modules a run enters while one record fails (a retryable
  error, handed off to its tier, its offset committed), against a run whose one record
  succeeds, counted with a ``sys.setprofile`` / ``threading.setprofile`` tracer on every
  thread from the moment the record is polled to its commit (a scripted consumer and a
  recording sender: no broker, so the path is the code's, not the network's);
- **files over 450 lines**;
- **two-way ties**: pairs of top-level units (a folder, or a module directly under
  ``kworkers/``) each importing the other anywhere in its files (``TYPE_CHECKING`` imports
  count: they tie the code as much);
- with ``--pylint``: the repeated blocks ``pylint --disable=all --enable=duplicate-code``
  reports (pylint is not a dependency: ``pip install pylint`` by hand first).

By hand, not in CI: the figures describe the code, they are not a property to hold.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "kworkers"
LONG = 450


def long_files() -> list[tuple[int, str]]:
    out = []
    for f in sorted(PKG.rglob("*.py")):
        n = sum(1 for _ in f.open(encoding="utf-8"))
        if n > LONG:
            out.append((n, str(f.relative_to(ROOT))))
    return sorted(out, reverse=True)


def _unit(module: str) -> str | None:
    """``kworkers.consumer.runner`` -> ``consumer``; ``kworkers.activity`` -> ``activity``."""
    parts = module.split(".")
    if parts[0] != "kworkers" or len(parts) < 2:
        return None
    return parts[1]


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = _module_of(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def two_way_ties() -> list[tuple[str, str]]:
    edges: dict[str, set[str]] = {}
    for f in PKG.rglob("*.py"):
        src = _unit(_module_of(f))
        if src is None:
            continue
        for mod in _imports(f):
            dst = _unit(mod)
            if dst is not None and dst != src and (
                    (PKG / dst).is_dir() or (PKG / f"{dst}.py").exists()):
                edges.setdefault(src, set()).add(dst)
    ties = {(min(a, b), max(a, b)) for a, bs in edges.items() for b in bs
            if a in edges.get(b, set())}
    return sorted(ties)


def _traced(run: Callable[[Callable[[], None], Callable[[], None]], None]) -> set[str]:
    """Modules of kworkers entered on any thread between ``start`` and ``stop``."""
    seen: set[str] = set()
    on = threading.Event()

    def prof(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and on.is_set():
            name = frame.f_globals.get("__name__", "")
            if isinstance(name, str) and name.startswith("kworkers"):
                seen.add(name)

    threading.setprofile(prof)  # type: ignore[arg-type]
    sys.setprofile(prof)  # type: ignore[arg-type]
    try:
        run(on.set, on.clear)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return seen


def _one_record(fail: bool) -> Callable[[Callable[[], None], Callable[[], None]], None]:
    sys.path.insert(0, str(ROOT))
    from kworkers import Worker
    from kworkers.errors import RetryableError
    from kworkers.message import Message
    from tests.unit.test_loop_with_fake_consumer import (
        RecordingSender,
        ScriptedConsumer,
        _idle,
    )

    def run(start: Callable[[], None], stop: Callable[[], None]) -> None:
        consumer = ScriptedConsumer([Message("t", 0, 0, b"k", b"v")], [], "g")
        sender = RecordingSender()
        worker = Worker(topics=["t"], group_id="g", sender=sender,
                        consumer=lambda group: consumer if group == "g" else _idle(group))

        @worker.handler
        def handle(msg: Message) -> None:
            if fail:
                raise RetryableError("Flaky", "fails once, on purpose")

        t = threading.Thread(target=worker.run, args=(False,), daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while not worker.loops and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.2)  # the loops settle: what they do idle is neither path
        start()
        consumer.go.set()
        while time.monotonic() < deadline and not any(
                pos.get(("t", 0)) == 1 for pos, _ in consumer.commits):
            time.sleep(0.001)
        stop()
        worker.stop()
        t.join(30)
        if fail and not sender.sent:
            raise AssertionError("the failed record was never handed off: nothing measured")

    return run


def failure_path() -> tuple[set[str], set[str]]:
    return _traced(_one_record(True)), _traced(_one_record(False))


def pylint_duplicates() -> int | str:
    try:
        got = subprocess.run([sys.executable, "-m", "pylint", "--disable=all",
                              "--enable=duplicate-code", "kworkers"], cwd=ROOT,
                             capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"pylint did not run: {exc}"
    if "No module named pylint" in got.stderr:
        return "pylint is not installed (pip install pylint, by hand)"
    return len(re.findall(r"R0801", got.stdout))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pylint", action="store_true", help="count pylint's repeated blocks too")
    args = ap.parse_args()
    failed, ok = failure_path()
    only = sorted(failed - ok)
    print(f"failure path: {len(failed)} kworkers modules entered while one record fails and "
          f"is handed off ({len(ok)} while one succeeds; {len(only)} only on the failure):")
    for m in only:
        print(f"  {m}")
    files = long_files()
    print(f"files over {LONG} lines: {len(files)}")
    for n, f in files:
        print(f"  {n:5d} {f}")
    ties = two_way_ties()
    print(f"two-way ties between top-level units: {len(ties)}")
    for a, b in ties:
        print(f"  {a} <-> {b}")
    if args.pylint:
        print(f"pylint duplicate-code blocks: {pylint_duplicates()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
