"""A network namespace on a veth pair: a process whose link to the broker a test can cut and heal.

Needs root and ``ip`` (iproute2). The namespace sees the host only through its veth pair, with
addresses of its own (``10.213.<n>.1`` on the host side, ``.2`` inside, a /30): nothing else is
routed, so a process in it can reach exactly the listeners bound to the host-side address. A
broker reaches it through a listener on that address (``ContainerBroker(listeners=...)``),
which must exist before the broker starts.

``cut()`` takes the host side of the link down: packets stop in both directions and no reset
is ever sent, which is what a real partition looks like to a client (requests time out, the
group coordinator stops hearing heartbeats). ``heal()`` brings it back.

    with NetnsLink() as link:
        broker = broker_from_env(own=True, listeners={"NETNS": f"{link.host_ip}:{port}"})
        subprocess.Popen(link.command([sys.executable, "-m", "app", f"{link.host_ip}:{port}"]))
        link.cut(); ...; link.heal()
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from types import TracebackType

__all__ = ["NetnsLink", "netns_available"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def netns_available() -> str | None:
    """None when namespaces can be made here, else why not (no ``ip``, not root...)."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    name = f"kwprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def _free_subnet() -> int:
    used = _ip("-4", "-o", "addr", "show").stdout
    choices = [n for n in range(1, 255) if f"10.213.{n}." not in used]
    if not choices:
        raise RuntimeError("no free 10.213.<n>.0/30 subnet for a test namespace")
    return random.choice(choices)


class NetnsLink:
    """A namespace and the veth pair that is its only link to the host."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.name = f"kwns{tag}"
        self.host_dev = f"kwh{tag}"
        self.ns_dev = f"kwn{tag}"
        self.subnet = _free_subnet()
        self.host_ip = f"10.213.{self.subnet}.1"
        self.ns_ip = f"10.213.{self.subnet}.2"
        self._made = False

    def create(self) -> NetnsLink:
        self._made = True
        steps: list[Sequence[str]] = [
            ("netns", "add", self.name),
            ("link", "add", self.host_dev, "type", "veth", "peer", "name", self.ns_dev),
            ("link", "set", self.ns_dev, "netns", self.name),
            ("addr", "add", f"{self.host_ip}/30", "dev", self.host_dev),
            ("link", "set", self.host_dev, "up"),
            ("netns", "exec", self.name, "ip", "addr", "add", f"{self.ns_ip}/30", "dev",
             self.ns_dev),
            ("netns", "exec", self.name, "ip", "link", "set", self.ns_dev, "up"),
            ("netns", "exec", self.name, "ip", "link", "set", "lo", "up"),
        ]
        try:
            for step in steps:
                _ip(*step)
        except subprocess.CalledProcessError as exc:
            self.close()
            raise RuntimeError(f"ip {' '.join(exc.cmd[1:])}: {exc.stderr.strip()}") from None
        return self

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        _ip("link", "set", self.host_dev, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_dev, "up")

    def close(self) -> None:
        """Removes the namespace and both ends of the link (idempotent)."""
        if not self._made:
            return
        with contextlib.suppress(Exception):
            _ip("link", "del", self.host_dev, check=False)
        with contextlib.suppress(Exception):
            _ip("netns", "del", self.name, check=False)
        self._made = False

    def __enter__(self) -> NetnsLink:
        return self.create()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
