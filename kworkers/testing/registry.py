"""A real Confluent-compatible schema registry for tests: Apicurio Registry.

Apicurio Registry (Apache-2.0) serves the Confluent Schema Registry protocol at
``/apis/ccompat/v7``, which is what ``confluent_kafka.schema_registry.SchemaRegistryClient``
talks to, so the tests exercise the client against a real server, never a stub. Three ways to
get one, behind one interface, chosen by ``registry_from_env`` (the broker's pattern):

- ``KWORKERS_SCHEMA_REGISTRY_URL`` set: a registry somebody else runs (any Confluent-compatible
  one; no faults can be injected into it);
- default: a container from ``KWORKERS_REGISTRY_IMAGE`` (``deploy/images/registry/build`` makes
  ``kworkers/schema-registry:<v>-local`` from Maven Central and PyPI), host networking, free
  ports on 127.0.0.1;
- ``KWORKERS_REGISTRY=process``: the same application and entrypoint as a local process, for
  machines that cannot run a Docker engine.

Configured through Quarkus' environment variables (``QUARKUS_HTTP_PORT``,
``APICURIO_DATASOURCE_URL``, ...), which the official ``apicurio/apicurio-registry`` image reads
too. Storage is an H2 database on disk, so ``stop()`` then ``start()`` (a registry outage) keeps
every schema and id: records produced before the outage decode after it. ``pause()`` freezes
it without closing a socket, so a request is sent and never answered (a timeout for certain).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Protocol

from kworkers.testing.broker import free_port
from kworkers.testing.server_container import ServerContainer
from kworkers.testing.server_process import ServerProcess

REGISTRY_VERSION = "3.3.3"
LOCAL_REGISTRY_IMAGE = f"kworkers/schema-registry:{REGISTRY_VERSION}-local"
#: Where Apicurio serves the Confluent-compatible API; ``url`` includes it.
CCOMPAT_PATH = "/apis/ccompat/v7"
READY_TIMEOUT_S = 120.0
_CONTAINER_DATA = "/tmp/kworkers-registry/registry"


def _env(port: int, management_port: int, datasource: str) -> dict[str, str]:
    return {
        "QUARKUS_HTTP_HOST": "127.0.0.1",
        "QUARKUS_HTTP_PORT": str(port),
        "QUARKUS_MANAGEMENT_HOST": "127.0.0.1",
        "QUARKUS_MANAGEMENT_PORT": str(management_port),
        "APICURIO_DATASOURCE_URL": f"jdbc:h2:file:{datasource}",
        # one log line per request is noise in a test's output
        "QUARKUS_LOG_CATEGORY__APICURIO_REGISTRY_ACCESS__LEVEL": "WARN",
    }


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether the registry at ``url`` (the ccompat base) answers ``GET /subjects``."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/subjects", timeout=timeout) as r:
            json.loads(r.read())
            return int(r.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(url: str, timeout: float = READY_TIMEOUT_S, alive: Any = None) -> None:
    """Block until the registry answers, failing at once when its process or container died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"the schema registry for {url} exited while starting")
        if answers(url):
            return
        time.sleep(0.2)
    raise TimeoutError(f"schema registry at {url} not ready after {timeout:.0f}s")


class SchemaRegistryServer(Protocol):
    """A registry a test can use and, where ``supports_faults``, stop, pause and start again."""

    #: The Confluent-compatible base URL, as ``SchemaRegistryClient({"url": ...})`` takes it.
    url: str
    supports_faults: bool

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def close(self) -> None: ...
    def logs(self) -> str: ...


class ExternalRegistry:
    """A registry somebody else runs (``KWORKERS_SCHEMA_REGISTRY_URL``): used, never touched."""

    supports_faults = False

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def start(self) -> None:
        wait_ready(self.url, timeout=30)

    def stop(self) -> None:
        raise NotImplementedError("cannot stop an external schema registry")

    kill = stop
    pause = stop
    resume = stop

    def close(self) -> None:
        return None

    def logs(self) -> str:
        return ""


class ContainerRegistry:
    """Apicurio Registry in a container with host networking (testcontainers, no reaper)."""

    supports_faults = True

    def __init__(self, image: str = LOCAL_REGISTRY_IMAGE) -> None:
        self.image = image
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"
        self.env = _env(self.port, free_port(), _CONTAINER_DATA)
        self.server = ServerContainer(image, self.env)

    def start(self) -> None:
        self.server.start(lambda alive: wait_ready(self.url, alive=alive))

    def stop(self) -> None:
        self.server.stop()

    def kill(self) -> None:
        self.server.kill()

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def close(self) -> None:
        self.server.close()

    def logs(self) -> str:
        return self.server.logs()


def default_registry_home() -> Path:
    cache = Path(os.environ.get("KWORKERS_CACHE", Path.home() / ".cache" / "kworkers"))
    return Path(os.environ.get("KWORKERS_REGISTRY_HOME",
                               cache / f"schema-registry-{REGISTRY_VERSION}"))


class ProcessRegistry:
    """The same application and entrypoint as the image, as a local process (no Docker)."""

    supports_faults = True

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or default_registry_home()
        self.runner = self.home / "bin" / "registry-run"
        if not self.runner.exists():
            raise FileNotFoundError(
                f"{self.runner} is missing: run deploy/images/registry/build --home-only first")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"
        self.workdir = Path(tempfile.mkdtemp(prefix="kworkers-registry-"))
        self.env = {
            **os.environ,
            **_env(self.port, free_port(), str(self.workdir / "data" / "registry")),
            "KWORKERS_REGISTRY_HOME": str(self.home),
            "KWORKERS_REGISTRY_DATA_DIR": str(self.workdir / "data"),
        }
        self.server = ServerProcess(self.runner, self.env, self.workdir / "registry.log",
                                    "registry")

    def start(self) -> None:
        self.server.start(lambda alive: wait_ready(self.url, alive=alive))

    def stop(self) -> None:
        self.server.stop()

    def kill(self) -> None:
        self.server.kill()

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> str:
        return self.server.logs()


def registry_from_env(*, own: bool = False) -> SchemaRegistryServer:
    """The registry this environment asks for (not started yet).

    ``own``: a registry of the caller's own even when ``KWORKERS_SCHEMA_REGISTRY_URL`` names an
    external one (a test that stops the registry must never stop somebody else's)."""
    url = os.environ.get("KWORKERS_SCHEMA_REGISTRY_URL")
    if url and not own:
        return ExternalRegistry(url)
    if os.environ.get("KWORKERS_REGISTRY", "container") == "process":
        return ProcessRegistry()
    return ContainerRegistry(os.environ.get("KWORKERS_REGISTRY_IMAGE") or LOCAL_REGISTRY_IMAGE)
