"""``python -m kworkers.observability dashboard|alerts``: the committed files, printed.

Regenerate them after changing ``panels.py`` or ``alerts.py`` (a unit test fails until then):

    python -m kworkers.observability dashboard > deploy/grafana/kworkers.json
    python -m kworkers.observability alerts > deploy/prometheus/alerts.yml
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if argv == ["dashboard"]:
        from kworkers.observability.dashboard import render

        sys.stdout.write(render())
        return 0
    if argv == ["alerts"]:
        from kworkers.observability.alerts import render_rules

        sys.stdout.write(render_rules())
        return 0
    print("usage: python -m kworkers.observability dashboard|alerts", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
