"""A small, deterministic YAML writer for manifests (block style, keys in insertion order).

Why not PyYAML: it is a test dependency, not a runtime one, and the worker image (which imports
``kworkers.deploy.example``) must not need it. Manifests only hold mappings, lists, strings,
ints and bools, so a writer for exactly those is short, and a unit test reads every rendered
file back with PyYAML to prove the two agree.

Strings are written plain only when YAML 1.1 and 1.2 both read them back as the same string;
anything that could turn into a bool, a number, null or a syntax token is double-quoted
(JSON escaping, which is valid YAML).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

Node = Mapping[str, "Node"] | Sequence["Node"] | str | int | bool | None

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./:@-]*")
# Words YAML 1.1 resolvers (PyYAML, Kubernetes' go-yaml v2 in places) read as bools or null.
_RESERVED = frozenset({
    "y", "yes", "n", "no", "true", "false", "on", "off", "null", "~",
})


def scalar(value: str | int | bool | None) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if (_PLAIN.fullmatch(value) and value.lower() not in _RESERVED
            and not value.endswith(":") and ": " not in value):
        return value
    return json.dumps(value, ensure_ascii=False)


def _emit(node: Node, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(node, Mapping):
        for key, value in node.items():
            k = scalar(str(key))
            if isinstance(value, str) or not isinstance(value, Mapping | Sequence):
                out.append(f"{pad}{k}: {scalar(value)}")
            elif not value:
                out.append(f"{pad}{k}: {{}}" if isinstance(value, Mapping) else f"{pad}{k}: []")
            else:
                out.append(f"{pad}{k}:")
                _emit(value, indent + (2 if isinstance(value, Mapping) else 0), out)
    elif isinstance(node, str) or not isinstance(node, Sequence):
        out.append(f"{pad}{scalar(node)}")
    else:
        for item in node:
            if isinstance(item, Mapping) and item:
                lines: list[str] = []
                _emit(item, indent + 2, lines)
                lines[0] = f"{pad}- {lines[0][indent + 2:]}"
                out.extend(lines)
            elif isinstance(item, str) or not isinstance(item, Mapping | Sequence):
                out.append(f"{pad}- {scalar(item)}")
            else:
                raise ValueError("nested lists and empty mappings are not used in manifests")


def dump(node: Mapping[str, Node], comment: str = "") -> str:
    """One YAML document; ``comment`` lines go on top as ``#`` comments."""
    out = [f"# {line}".rstrip() for line in comment.strip("\n").splitlines()] if comment else []
    _emit(node, 0, out)
    return "\n".join(out) + "\n"


def wrap_words(text: str, width: int) -> list[str]:
    """``text``'s words in lines of at most ``width`` characters (a longer word stands alone):
    the comments kworkers writes into YAML (manifests, alert rules)."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines
