"""Where the kworkers side's time goes: ``python -m benchmarks throughput --profile``.

The kworkers side runs once more in its own process, which attaches py-spy to itself just before
the clock starts and stops it at the N-th record, so the profile holds the measured window only
(no imports, no shutdown; the main thread's samples from before the start are dropped). py-spy
samples every Python thread, idle ones included (``--idle``), without pausing the process
(``--nonblocking``: pausing 13 threads 250 times a second slowed the run 3x and changed where
the time went), so a thread's samples are its wall time: where it computes *and* where it
waits. A leaf that is a Python function calling into C (``poll_batch`` -> ``consume()``,
``commit``) counts the C call's time, work and waiting alike. Beside it, the CPU per thread
from /proc says how much of that wall time was on a core.

py-spy is not a dependency: ``.venv/bin/pip install py-spy`` (run by hand; attaching needs
ptrace rights, e.g. root or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from benchmarks.common import console, fmt, table
from benchmarks.method import Comparison, Side, run_child
from kworkers.testing.workload import unique

RATE = 100  # samples per second per thread (py-spy takes CPU from the same 2 cores)


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("--profile needs py-spy (not a dependency): .venv/bin/pip install py-spy")
    return found


class SelfProfiler:
    """Runs inside the side's process: py-spy attached to this very process for the window."""

    def __init__(self, out: str) -> None:
        self.out = out
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [py_spy(), "record", "--pid", str(os.getpid()), "--format", "raw", "--threads",
             "--idle", "--nonblocking", "--rate", str(RATE), "--output", self.out],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # let py-spy attach before the clock starts

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        _, err = self._proc.communicate(timeout=60)
        if not Path(self.out).exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode()[-500:]}")


def thread_group(head: str) -> str:
    """``thread (123): kworkers-handler-3`` -> ``kworkers-handler``."""
    name = head.split(":", 1)[1].strip() if ":" in head else head
    return name.rstrip("0123456789").rstrip("-_") or name


def frame_name(frame: str) -> str:
    """``dispatch (kworkers/consumer/loop.py:120)`` -> ``dispatch (kworkers/consumer/loop.py)``."""
    return frame.rsplit(":", 1)[0] + ")" if frame.endswith(")") and ":" in frame else frame


def read_raw(path: str) -> dict[str, tuple[int, Counter[str], Counter[str]]]:
    """Per thread group: samples, leaf (self) frames with their line, and kworkers frames
    (inclusive, per function)."""
    total: dict[str, int] = defaultdict(int)
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            group, n = thread_group(frames[0]), int(count)
            if group == "bench-stopper" or any("SelfProfiler" in fr for fr in frames):
                continue  # the harness itself, or the main thread before the clock started
            total[group] += n
            names = [frame_name(fr) for fr in frames[1:]]
            # The leaf keeps its line: poll_batch's consume() call and its conversion loop
            # are different lines of one function.
            leaves[group][frames[-1] if len(frames) > 1 else "(no Python frame)"] += n
            for fn in set(names):
                if "kworkers/" in fn:
                    inclusive[group][fn] += n
    return {g: (total[g], leaves[g], inclusive[g]) for g in total}


def profile_side(cmp: Comparison, side: Side, top: int = 8) -> None:
    """Runs ``side`` (a kworkers side built by ``sides_kworkers.run_worker``) once under
    py-spy and prints where each thread's time went."""
    py_spy()
    with tempfile.TemporaryDirectory(prefix="kw-bench-prof-") as tmp:
        out = os.path.join(tmp, "kworkers.pyspy.txt")
        profiled = Side(side.name, side.label, options={**side.options, "profile_to": out})
        reading = run_child(sys.executable, cmp.spec(profiled, unique("bench-prof"), cmp.n),
                            cmp.timeout)
        groups = read_raw(out)
    secs, cpu = reading["seconds"], reading["cpu_s"]
    console.print(f"{side.label} under py-spy ({RATE} samples/s per thread): "
                  f"{cmp.n:,} records in {secs:.2f}s = {cmp.n / secs:,.0f}/s, process CPU "
                  f"{cpu:.2f}s = {cpu / cmp.n * 1e6:.1f} us per record (py-spy's pauses slow "
                  "it down; the shares are what count)")
    threads = reading["extra"].get("threads", {})
    table("CPU per thread over the window (/proc), against the window's wall time",
          ["thread", "CPU s", "busy (CPU / wall)"],
          [[g, fmt(v, 2), f"{v / secs:.0%}"]
           for g, v in sorted(threads.items(), key=lambda kv: -kv[1])])
    for group, (n, leaves, inclusive) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        if n < 0.05 * max(v[0] for v in groups.values()):
            continue
        table(f"{group}: {n} samples (wall time, waiting included); where they end (self)",
              ["leaf frame", "share"],
              [[fr, f"{c / n:.0%}"] for fr, c in leaves.most_common(top)])
        if inclusive:
            table(f"{group}: kworkers functions on the stack (inclusive)", ["frame", "share"],
                  [[fr, f"{c / n:.0%}"] for fr, c in inclusive.most_common(top)])
