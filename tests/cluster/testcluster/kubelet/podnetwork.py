"""Pod and node addresses that local processes can bind to and EndpointSlices accept.

The issue asked for 127.0.x.y pod IPs, but the API server rejects loopback addresses in
EndpointSlices (``ValidateEndpointIP``: "may not be in the loopback range"), so the
EndpointSlice controller could never publish such pods. Instead the kubelet makes the
benchmarking range 198.18.0.0/16 (RFC 2544, never routed on real networks) local with one
``ip route add local 198.18.0.0/16 dev lo``: like 127.0.0.0/8, every address in it is then
bindable on this host without configuring each one. Node N gets 198.18.N.1, its pods
198.18.N.2-254. The route is left in place (it is harmless and other test sessions on the
machine may be using it at the same time).

Without root the route cannot be added; pods then get 127.(100+N).x.y addresses, which
work for direct connections but never appear in EndpointSlices.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import subprocess
import threading

POD_NETWORK = ipaddress.ip_network("198.18.0.0/16")
LOOPBACK_FALLBACK_BASE = 100

log = logging.getLogger(__name__)


def ensure_pod_network() -> bool:
    """Makes 198.18.0.0/16 local; returns False (loopback fallback) when that is impossible."""
    if os.geteuid() != 0:
        log.warning("not root: pod IPs fall back to 127.x.y.z and stay out of EndpointSlices")
        return False
    result = subprocess.run(["ip", "route", "replace", "local", str(POD_NETWORK), "dev", "lo", "table", "local"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        log.warning("cannot route %s locally (%s); falling back to loopback", POD_NETWORK, result.stderr.strip())
        return False
    return True


class NodeAddresses:
    """Hands out one node's pod IPs, reusing freed ones last so a new pod rarely gets the
    address a deleted pod's clients may still be talking to."""

    def __init__(self, node_index: int, routable: bool) -> None:
        first = 198 if routable else 127
        second = 18 if routable else LOOPBACK_FALLBACK_BASE
        third = node_index + 1
        if not routable:
            second, third = LOOPBACK_FALLBACK_BASE + node_index, 0
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

    def release(self, address: str) -> None:
        with self._lock:
            if address.startswith(self._prefix) and address not in self._free:
                self._free.append(address)
