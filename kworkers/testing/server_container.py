"""A server a test runs in a container on the host network (the broker, the schema registry)
and can stop, kill, pause and resume: the container twin of ``server_process.ServerProcess``.

testcontainers without its reaper (``TESTCONTAINERS_RYUK_DISABLED``: no image registry here),
so ``close`` removes the container itself. Stopping or killing a paused container first
unpauses it: Docker refuses to stop a paused one, and a test that froze the broker must still
be able to bounce it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class ServerContainer:
    def __init__(self, image: str, env: Mapping[str, str],
                 entrypoint: Sequence[str] | None = None,
                 volumes: Sequence[tuple[str, str]] = ()) -> None:
        os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
        self.image = image
        self.env = dict(env)
        self.entrypoint = list(entrypoint) if entrypoint is not None else None
        #: (host path, container path), mounted read-only
        self.volumes = list(volumes)
        self._tc: Any = None

    def _container(self) -> Any:
        return self._tc.get_wrapped_container()

    def start(self, wait_ready: Callable[[Callable[[], bool]], None]) -> None:
        """Creates and starts the container (or starts it again after ``stop``/``kill``) and
        blocks in ``wait_ready``, given whether the container still runs."""
        if self._tc is None:
            from testcontainers.core.container import DockerContainer

            extra: dict[str, Any] = ({} if self.entrypoint is None
                                     else {"entrypoint": self.entrypoint})
            tc = DockerContainer(self.image, network_mode="host", **extra)
            for k, v in self.env.items():
                tc.with_env(k, v)
            for host, inside in self.volumes:
                tc.with_volume_mapping(host, inside, "ro")
            self._tc = tc.start()
        else:
            self._container().start()
        wait_ready(self._running)

    def _running(self) -> bool:
        c = self._container()
        c.reload()
        return bool(c.status in ("running", "created", "restarting"))

    def _unpause(self) -> None:
        c = self._container()
        c.reload()
        if c.status == "paused":
            c.unpause()

    def stop(self) -> None:
        self._unpause()
        self._container().stop(timeout=30)

    def kill(self) -> None:
        self._unpause()
        self._container().kill(signal="SIGKILL")
        self._container().wait(timeout=30)

    def pause(self) -> None:
        self._container().pause()

    def resume(self) -> None:
        self._container().unpause()

    def close(self) -> None:
        if self._tc is not None:
            with contextlib.suppress(Exception):
                self._container().remove(force=True, v=True)
            self._tc = None

    def logs(self) -> str:
        if self._tc is None:
            return ""
        out = self._container().logs()
        return out.decode("utf-8", "replace") if isinstance(out, bytes) else str(out)
