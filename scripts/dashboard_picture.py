"""Draws the kworkers dashboard (docs/dashboard.png) from a real run's data, read through the
Prometheus HTTP API: CI runs no Grafana, so this is how the dashboard is seen in the docs.

Each panel of ``kworkers.observability.panels.ROWS`` becomes one plot, each of its queries one
line per series (``/api/v1/query_range``, the variables filled in as Grafana would fill them).

    python scripts/dashboard_picture.py --prometheus http://127.0.0.1:9090 \\
        --start EPOCH --end EPOCH [--group REGEX] [--namespace REGEX] --out docs/dashboard.png

The picture committed in docs/ comes from tests/integration/test_prometheus_scrape.py's run:

    pip install matplotlib   # by hand: not a dependency of kworkers, nor of its tests
    KWORKERS_DASHBOARD_PNG=docs/dashboard.png bash scripts/test \\
        tests/integration/test_prometheus_scrape.py
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kworkers.observability.panels import ROWS, Panel, concrete  # noqa: E402

COLUMNS = 3
#: lines named in a plot's legend (the rest drawn, unnamed)
MAX_LEGEND = 6


def query_range(url: str, expr: str, start: float, end: float, step: float
                ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                "step": f"{step:g}"})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus: {body}")
    return [(dict(s["metric"]), [(float(t), float(v)) for t, v in s["values"]])
            for s in body["data"]["result"]]


def legend(template: str, labels: dict[str, str]) -> str:
    out = template
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def draw(url: str, start: float, end: float, out: Path, group: str = ".*",
         namespace: str = ".*", rate_interval: str = "15s") -> int:
    """Draws every panel; returns how many lines were drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, Panel]] = [(r.title, p) for r in ROWS for p in r.panels]
    rows = math.ceil(len(panels) / COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(6 * COLUMNS, 3.2 * rows), squeeze=False)
    step = max(1.0, (end - start) / 240)
    lines = 0
    for i, (row, panel) in enumerate(panels):
        ax: Any = axes[i // COLUMNS][i % COLUMNS]
        zeros = 0
        for q in panel.queries:
            expr = concrete(q.expr, namespace=namespace, group=group,
                            rate_interval=rate_interval)
            for labels, values in query_range(url, expr, start, end, step):
                finite = [(t - start, v) for t, v in values if math.isfinite(v)]
                if not finite:
                    continue
                if not any(v for _, v in finite):  # a series at 0 throughout: counted, not drawn
                    zeros += 1
                    continue
                ax.plot([t for t, _ in finite], [v for _, v in finite], linewidth=1,
                        label=legend(q.legend, labels)[:40])
                lines += 1
        if zeros:
            ax.text(0.99, 0.02, f"+{zeros} series at 0", ha="right", va="bottom",
                    transform=ax.transAxes, fontsize=7, color="grey")
        ax.set_xlim(0, end - start)
        ax.set_title(f"{row}: {panel.title} ({panel.unit})", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("seconds", fontsize=7)
        handles, names = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles[:MAX_LEGEND], names[:MAX_LEGEND], fontsize=6, loc="upper right")
        else:
            ax.text(0.5, 0.5, "0 throughout this run" if zeros else "no data in this run",
                    ha="center", va="center", transform=ax.transAxes, fontsize=8,
                    color="grey")
    for j in range(len(panels), rows * COLUMNS):
        axes[j // COLUMNS][j % COLUMNS].axis("off")
    fig.suptitle("kworkers dashboard (deploy/grafana/kworkers.json), drawn from a real run's "
                 "Prometheus data", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return lines


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--start", type=float, required=True)
    ap.add_argument("--end", type=float, required=True)
    ap.add_argument("--group", default=".*")
    ap.add_argument("--namespace", default=".*")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = ap.parse_args(argv)
    n = draw(args.prometheus, args.start, args.end, args.out, args.group, args.namespace)
    print(f"{args.out}: {n} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
