"""The definitions an engine knows, by name and version.

Why several versions of one name: a run is advanced only by the definition it started under. To
change a workflow with runs in flight, register the new version beside the old one; new runs
start on the newest (the last registered), old runs finish on theirs, and the old version can go
once ``kworkers workflow list --status running`` shows none of its runs left.
"""

from __future__ import annotations

from collections.abc import Iterable

from kworkers.errors import ConfigError
from kworkers.workflow.definition import Definition, Workflow
from kworkers.workflow.errors import VersionMismatch

__all__ = ["Registry"]


class Registry:
    def __init__(self, workflows: Iterable[Workflow | Definition]) -> None:
        self._by_version: dict[tuple[str, str], Definition] = {}
        self._latest: dict[str, Definition] = {}
        for w in workflows:
            d = w.freeze() if isinstance(w, Workflow) else w
            if (d.name, d.version) in self._by_version:
                raise ConfigError(f"workflow {d.name!r} version {d.version!r} is registered "
                                  "twice")
            self._by_version[(d.name, d.version)] = d
            self._latest[d.name] = d
        if not self._latest:
            raise ConfigError("an engine needs at least one workflow")

    def latest(self, name: str) -> Definition:
        d = self._latest.get(name)
        if d is None:
            raise ConfigError(f"unknown workflow {name!r}; this engine has "
                              f"{', '.join(sorted(self._latest))}")
        return d

    def versions(self, name: str) -> tuple[str, ...]:
        return tuple(v for (n, v) in self._by_version if n == name)

    def resolve(self, workflow_id: str, name: str, version: str) -> Definition:
        """The definition a run started under; ``VersionMismatch`` (to the DLQ) without it."""
        d = self._by_version.get((name, version))
        if d is None:
            raise VersionMismatch(workflow_id, name, version, self.versions(name))
        return d

    def names(self) -> list[str]:
        return sorted(self._latest)
