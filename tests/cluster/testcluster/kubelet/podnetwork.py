"""Pod and node addresses that local processes can bind to and EndpointSlices accept.

The issue asked for 127.0.x.y pod IPs, but the API server rejects loopback addresses in
EndpointSlices (``ValidateEndpointIP``: "may not be in the loopback range"), so the
EndpointSlice controller could never publish such pods. Instead the kubelet makes the
benchmarking range 198.18.0.0/16 (RFC 2544, never routed on real networks) local with one
``ip route add local 198.18.0.0/16 dev lo``: like 127.0.0.0/8, every address in it is then
bindable on this host without configuring each one. Each node claims a free /24 in it
(198.18.K.0/24, K from 1) by holding an flock on ``/tmp/weightcache-podnet/K.lock`` for the
kubelet's lifetime, so two test sessions on one machine never hand out the same pod IP. The
node itself is 198.18.K.1, its pods 198.18.K.2-254. The route is left in place: it is
harmless, and other test sessions on the machine may be using it at the same time.

Without root the route cannot be added; pods then get 127.100.K.x addresses, which
work for direct connections but never appear in EndpointSlices.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import subprocess
import threading
from pathlib import Path

POD_NETWORK = ipaddress.ip_network("198.18.0.0/16")
LOOPBACK_FALLBACK_BASE = 100
FALLBACK = "pod IPs fall back to 127.100.K.x and stay out of EndpointSlices"

log = logging.getLogger(__name__)


def ensure_pod_network() -> bool:
    """Makes 198.18.0.0/16 local; returns False (loopback fallback) when that is impossible."""
    if os.geteuid() != 0:
        log.warning("not root: %s", FALLBACK)
        return False
    try:
        result = subprocess.run(
            ["ip", "route", "replace", "local", str(POD_NETWORK), "dev", "lo", "table", "local"],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        log.warning("no ip command (iproute2): %s", FALLBACK)
        return False
    if result.returncode != 0:
        log.warning("cannot route %s locally (%s): %s", POD_NETWORK, result.stderr.strip(), FALLBACK)
        return False
    return True


LOCK_DIR = Path("/tmp/weightcache-podnet")


def claim_subnet(routable: bool) -> tuple[int, int]:
    """Returns (third octet, lock fd) of a /24 no other live kubelet on this machine uses."""
    LOCK_DIR.mkdir(exist_ok=True)
    for octet in range(1, 255):
        descriptor = os.open(LOCK_DIR / f"{'r' if routable else 'l'}{octet}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return octet, descriptor
        except BlockingIOError:
            os.close(descriptor)
    raise RuntimeError("all 254 pod subnets are claimed by other kubelets")


class NodeAddresses:
    """Hands out one node's pod IPs, reusing freed ones last so a new pod rarely gets the
    address a deleted pod's clients may still be talking to."""

    def __init__(self, routable: bool) -> None:
        octet, self._lock_fd = claim_subnet(routable)
        first, second = (198, 18) if routable else (127, LOOPBACK_FALLBACK_BASE)
        third = octet
        self.node_ip = f"{first}.{second}.{third}.1"
        self._prefix = f"{first}.{second}.{third}."
        self._free = [f"{self._prefix}{host}" for host in range(2, 255)]
        self._lock = threading.Lock()

    def allocate(self, previous: str | None = None) -> str:
        """A free address; ``previous`` (a pod's podIP from before a node restart) is kept when
        possible, because the API server refuses to change a pod's IPs once set."""
        with self._lock:
            if previous in self._free:
                self._free.remove(previous)
                return previous
            if not self._free:
                raise RuntimeError(f"no pod IPs left on {self._prefix}0/24")
            return self._free.pop(0)

    def close(self) -> None:
        """Gives the subnet back (closing the fd drops the flock)."""
        os.close(self._lock_fd)

    def release(self, address: str) -> None:
        with self._lock:
            if address.startswith(self._prefix) and address not in self._free:
                self._free.append(address)
