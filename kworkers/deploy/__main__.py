"""``python -m kworkers.deploy [DEPLOY_DIR]``: rewrite the committed example manifests."""

from __future__ import annotations

import sys
from pathlib import Path

from kworkers.deploy.samples import write_examples


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[2] / "deploy"
    for path in write_examples(root):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
