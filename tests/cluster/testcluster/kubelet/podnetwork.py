"""Pod and node addresses that local processes can bind to and EndpointSlices accept.

The API server rejects loopback addresses in EndpointSlices (``ValidateEndpointIP``: "may not
be in the loopback range"), so pods get addresses from the benchmarking range 198.18.0.0/16
(RFC 2544, never routed on real networks). Each node claims a free /24 in it (198.18.K.0/24,
K from 1) by holding an flock on ``/tmp/weightcache-podnet/K.lock`` for the kubelet's
lifetime, so two test sessions on one machine never hand out the same pod IP. The node itself
is 198.18.K.1, its pods 198.18.K.2-254.

Where the /24 lives: a process-kubelet node whose API server is on the nodes' bridge gets a
network namespace of its own with the /24 local inside it (``nodenetwork``); a hollow node, or
a node of a cluster whose API server is on 127.0.0.1, gets the /24 local on the host's
loopback (``ip route add local 198.18.K.0/24 dev lo``), removed when the node closes.

Without root no route can be added; pods then get 127.100.K.x addresses, which work for
direct connections but never appear in EndpointSlices.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import threading
from pathlib import Path

from . import nodenetwork
from .nodenetwork import namespace_of

POD_NETWORK = ipaddress.ip_network(nodenetwork.POD_NETWORK)
LOOPBACK_FALLBACK_BASE = 100
FALLBACK = "pod IPs fall back to 127.100.K.x and stay out of EndpointSlices"

log = logging.getLogger(__name__)


LOCK_DIR = Path("/tmp/weightcache-podnet")


def ensure_pod_network() -> bool:
    """Makes 198.18.0.0/16 reachable from the host (the nodes' bridge, ``nodenetwork``);
    returns False (loopback fallback) when that is impossible."""
    if os.geteuid() != 0:
        log.warning("not root: %s", FALLBACK)
        return False
    try:
        nodenetwork.ensure_bridge(LOCK_DIR)
    except FileNotFoundError:
        log.warning("no ip command (iproute2): %s", FALLBACK)
        return False
    except nodenetwork.NodeNetworkError as error:
        log.warning("cannot make the pod network (%s): %s", error, FALLBACK)
        return False
    return True


def api_address() -> str:
    """Where a new control plane's API server listens: on the nodes' bridge when nodes can have
    networks of their own (so they reach it over their links), else on 127.0.0.1."""
    if not ensure_pod_network():
        return "127.0.0.1"
    if (why := nodenetwork.available()) is not None:
        log.warning("nodes share the host's network: %s", why)
        return "127.0.0.1"
    return nodenetwork.HOST_ADDRESS


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

    def __init__(self, routable: bool, own_network: bool = False, on_interface: bool = False) -> None:
        """``own_network``: the /24 lives in a network namespace of the node's own
        (``self.network``); else, when ``routable``, on the host's loopback. ``on_interface``:
        each allocated address is also put on an interface (the node's eth0, or the host's lo),
        as a pod's IP is on its eth0: gloo, for one, binds only to an interface's address."""
        octet, self._lock_fd = claim_subnet(routable)
        first, second = (198, 18) if routable else (127, LOOPBACK_FALLBACK_BASE)
        third = octet
        self.network: nodenetwork.NodeNetwork | None = None
        self._local_route: list[str] = []
        self._interface: list[str] = []
        if routable and on_interface:
            self._interface = ["-n", namespace_of(octet), "addr"] if own_network else ["addr"]
        try:
            if routable and own_network:
                self.network = nodenetwork.NodeNetwork(octet).create()
            elif routable:
                self._local_route = ["local", f"198.18.{octet}.0/24", "dev", "lo", "table", "local"]
                nodenetwork.run_tool("ip", "route", "replace", *self._local_route)
        except BaseException:
            os.close(self._lock_fd)
            raise
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
                address = previous
            elif not self._free:
                raise RuntimeError(f"no pod IPs left on {self._prefix}0/24")
            else:
                address = self._free.pop(0)
        self._assign(address)
        return address

    def close(self) -> None:
        """Removes the node's network or route, then gives the subnet back (closing the fd drops
        the flock)."""
        if self.network is not None:
            self.network.remove()
        if self._local_route:
            nodenetwork.run_tool("ip", "route", "del", *self._local_route, check=False)
        if self._interface and self.network is None:
            for host in range(2, 255):
                if f"{self._prefix}{host}" not in self._free:
                    nodenetwork.run_tool("ip", "addr", "del", f"{self._prefix}{host}/32", "dev", "lo", check=False)
        os.close(self._lock_fd)

    def release(self, address: str) -> None:
        with self._lock:
            if not address.startswith(self._prefix) or address in self._free:
                return
            self._free.append(address)
        if self._interface:
            nodenetwork.run_tool("ip", *self._interface, "del", f"{address}/32", "dev", self._device, check=False)

    @property
    def _device(self) -> str:
        return "eth0" if self.network is not None else "lo"

    def _assign(self, address: str) -> None:
        if self._interface:
            nodenetwork.run_tool("ip", *self._interface, "replace", f"{address}/32", "dev", self._device)
