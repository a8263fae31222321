"""``python -m benchmarks NAME [--quick | --smoke]``: one benchmark, one broker, one RESULT line."""

from __future__ import annotations

import argparse
import importlib
import sys

from benchmarks.common import Mode

BENCHMARKS = ("peers", "eos", "throughput", "slow_io", "iobound", "rebalance", "retry_timing",
              "commits", "soak", "storm", "leave", "share", "pace", "handoff_cpu", "schedule",
              "hot", "floor", "autoscale", "redrive")
#: the benchmarks whose ``--profile`` runs one kworkers side under py-spy
PROFILED = ("throughput", "storm", "peers", "iobound")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="kworkers benchmarks; each ends with one 'RESULT NAME key=value ...' line.")
    ap.add_argument("name", choices=BENCHMARKS)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="a smaller run (each side still 3 times, alternated)")
    size.add_argument("--smoke", action="store_true",
                      help="a tiny run (seconds of work), for the smoke test only")
    ap.add_argument("--profile", action="store_true",
                    help="throughput, storm, peers and iobound: profile a kworkers side with "
                         "py-spy instead (py-spy is not a dependency: "
                         ".venv/bin/pip install py-spy)")
    args = ap.parse_args(argv)
    mode = Mode.SMOKE if args.smoke else Mode.QUICK if args.quick else Mode.FULL
    if args.profile and args.name not in PROFILED:
        ap.error(f"--profile applies to {', '.join(PROFILED)} only")
    module = importlib.import_module(f"benchmarks.{args.name}")
    if args.name in PROFILED:
        module.main(mode, profile=args.profile)
    else:
        module.main(mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
