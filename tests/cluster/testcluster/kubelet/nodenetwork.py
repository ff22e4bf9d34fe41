"""Each process-kubelet node as a host of its own: a network namespace on a bridge, and faults.

A node's namespace is ``wc-node-K`` for the /24 it claimed (198.18.K.0/24, see ``podnetwork``).
Its end of a veth pair is ``eth0`` with the node's address 198.18.K.1/16, and the whole /24 is
local there (``ip route add local 198.18.K.0/24 dev lo``), so every pod IP of the node is
bindable inside it and nowhere else (each pod's IP is also put on ``eth0``, ``podnetwork``). The host end, ``wc-K``, is a port of the bridge ``wc0``
in the host's namespace, which holds the host's address on that segment, 198.19.0.1/16: the
API server listens there (``kcluster up --address``), and the host reaches every node's pods
through ``198.18.0.0/16 dev wc0``. Nodes reach each other over the bridge, as hosts on one
switch do; nothing is forwarded or routed beyond this machine.

What runs "on" a node runs in its namespace: every container (``entered`` around the process
start, ``testcluster.netns``), the probes, the node's log server, and the kubelet's own traffic for that node (heartbeats, its pod watch, status writes:
a ``Kube`` whose connections are made inside the namespace). Cutting the node's link therefore
cuts what a real node loses: its kubelet's view of the API server, its pods' reachability.

Faults are made with the tools a real host has (``NodeNetwork.cut`` and the rest): iptables rules in the node's
namespace drop everything but loopback (``cut``) or only the API server's traffic
(``cut_from_api``); ``tc`` token buckets limit the link's rate both ways and an iptables
``statistic`` rule drops a share of its packets (``shape``). This machine's kernel has no
``sch_netem`` ("Specified qdisc kind is unknown"), so a fixed added delay is not offered.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BRIDGE = "wc0"
HOST_ADDRESS = "198.19.0.1"
HOST_NETWORK = "198.19.0.0/16"
POD_NETWORK = "198.18.0.0/16"
NAMESPACE_PREFIX = "wc-node-"
FAULT_CHAIN = "WC-FAULT"


class NodeNetworkError(RuntimeError):
    """A node's network could not be set up or changed; the message has the command's error."""


def run_tool(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs ``ip``, ``tc`` or ``iptables``; a failure (with ``check``) raises with its message."""
    result = subprocess.run(list(args), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NodeNetworkError(f"`{' '.join(args)}` failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def namespace_of(octet: int) -> str:
    return f"{NAMESPACE_PREFIX}{octet}"


def available() -> str | None:
    """None when nodes can have networks of their own here; else why not (the fallback is the
    host's network, as before)."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "tc", "iptables"):
        if shutil.which(tool) is None:
            return f"no {tool} command (apt-get install iproute2 iptables)"
    return None


def ensure_bridge(lock_dir: Path) -> None:
    """The bridge and the host's address on it, made once per machine and left in place (like
    a switch: other test sessions may have nodes on it). Also drops the /16 local route older
    checkouts added, which would deliver the nodes' traffic to the host's own loopback."""
    lock_dir.mkdir(exist_ok=True)
    with open(lock_dir / "bridge.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run_tool("ip", "route", "del", "local", POD_NETWORK, "dev", "lo", "table", "local", check=False)
        if run_tool("ip", "link", "show", BRIDGE, check=False).returncode != 0:
            run_tool("ip", "link", "add", BRIDGE, "type", "bridge")
        run_tool("ip", "link", "set", BRIDGE, "up")
        run_tool("ip", "addr", "replace", f"{HOST_ADDRESS}/16", "dev", BRIDGE)
        run_tool("ip", "route", "replace", POD_NETWORK, "dev", BRIDGE, "src", HOST_ADDRESS)


@dataclass(frozen=True)
class NodeNetwork:
    """One node's namespace and link (``create`` makes them, ``remove`` deletes them)."""

    octet: int

    @classmethod
    def of_namespace(cls, namespace: str) -> NodeNetwork:
        if not namespace.startswith(NAMESPACE_PREFIX) or not namespace[len(NAMESPACE_PREFIX) :].isdigit():
            raise NodeNetworkError(f"{namespace!r} is not a node's network namespace ({NAMESPACE_PREFIX}K)")
        return cls(int(namespace[len(NAMESPACE_PREFIX) :]))

    @property
    def namespace(self) -> str:
        return namespace_of(self.octet)

    @property
    def link(self) -> str:
        """The host end of the node's veth, a port of the bridge."""
        return f"wc-{self.octet}"

    @property
    def address(self) -> str:
        return f"198.18.{self.octet}.1"

    def create(self) -> NodeNetwork:
        # The caller holds the /24's lock, so a namespace of that name, or the /24 on the host's
        # loopback (a hollow node's, a host-network node's), is a dead session's: it would keep
        # the host's traffic for these pods on the host.
        self.remove()
        run_tool("ip", "route", "del", "local", f"198.18.{self.octet}.0/24", "dev", "lo", "table", "local", check=False)
        run_tool("ip", "-4", "addr", "flush", "dev", "lo", "to", f"198.18.{self.octet}.0/24", check=False)
        ns = self.namespace
        run_tool("ip", "netns", "add", ns)
        try:
            run_tool("ip", "link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run_tool("ip", "link", "set", self.link, "master", BRIDGE, "up")
            run_tool("ip", "-n", ns, "link", "set", "lo", "up")
            run_tool("ip", "-n", ns, "addr", "add", f"{self.address}/16", "dev", "eth0")
            run_tool("ip", "-n", ns, "link", "set", "eth0", "up")
            run_tool(
                "ip", "-n", ns, "route", "add", "local", f"198.18.{self.octet}.0/24", "dev", "lo", "table", "local"
            )
            run_tool("ip", "-n", ns, "route", "add", HOST_NETWORK, "dev", "eth0", "src", self.address)
            for chain in ("INPUT", "OUTPUT"):
                run_tool("ip", "netns", "exec", ns, "iptables", "-N", f"{FAULT_CHAIN}-{chain}")
                run_tool("ip", "netns", "exec", ns, "iptables", "-A", chain, "-j", f"{FAULT_CHAIN}-{chain}")
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Deletes the namespace; its veth pair, rules and shaping go with it."""
        run_tool("ip", "netns", "del", self.namespace, check=False)
        run_tool("ip", "link", "del", self.link, check=False)

    # -- faults ----------------------------------------------------------------------------------

    def _rule(self, chain: str, *match: str) -> None:
        run_tool(
            "ip", "netns", "exec", self.namespace, "iptables", "-A", f"{FAULT_CHAIN}-{chain}", *match, "-j", "DROP"
        )

    def cut(self) -> None:
        """Drops every packet in and out of the node but its own loopback: to the test client,
        the API server and the other nodes the node is gone, while its processes run on."""
        self._rule("INPUT", "!", "-i", "lo")
        self._rule("OUTPUT", "!", "-o", "lo")

    def cut_from_api(self, port: int) -> None:
        """Drops only the node's traffic with the API server: its kubelet stops being heard,
        its pods can no longer watch or write, and everyone else still reaches it."""
        self._rule("OUTPUT", "-p", "tcp", "-d", HOST_ADDRESS, "--dport", str(port))
        self._rule("INPUT", "-p", "tcp", "-s", HOST_ADDRESS, "--sport", str(port))

    def shape(self, rate_kbit: int | None = None, loss: float = 0.0) -> None:
        """Limits the link to ``rate_kbit`` each way (a token bucket on both veth ends) and drops
        ``loss`` (0..1) of the packets crossing it each way, at random."""
        if not 0 <= loss < 1:
            raise NodeNetworkError(f"loss is the share of packets dropped, at least 0 and below 1; got {loss}")
        if rate_kbit is not None and rate_kbit < 8:
            raise NodeNetworkError(f"the rate is in kbit/s, at least 8; got {rate_kbit}")
        if rate_kbit is not None:
            # A burst of about 10 ms at the rate, and a queue of at most 200 ms: a slow link that
            # queues a little, not one that buffers for seconds.
            burst = max(1600, rate_kbit * 1000 // 8 // 100)
            for ns, device in ((None, self.link), (self.namespace, "eth0")):
                prefix = ["ip", "netns", "exec", ns] if ns else []
                run_tool(*prefix, "tc", "qdisc", "replace", "dev", device, "root", "tbf",
                       "rate", f"{rate_kbit}kbit", "burst", str(burst), "latency", "200ms")  # fmt: skip
        if loss > 0:
            for chain, side in (("INPUT", "-i"), ("OUTPUT", "-o")):
                self._rule(chain, side, "eth0", "-m", "statistic", "--mode", "random", "--probability", f"{loss:.4f}")

    def heal(self) -> None:
        """Removes every fault: the rules and the rate limits."""
        for chain in ("INPUT", "OUTPUT"):
            run_tool("ip", "netns", "exec", self.namespace, "iptables", "-F", f"{FAULT_CHAIN}-{chain}")
        for ns, device in ((None, self.link), (self.namespace, "eth0")):
            prefix = ["ip", "netns", "exec", ns] if ns else []
            run_tool(*prefix, "tc", "qdisc", "del", "dev", device, "root", check=False)

    def faults(self) -> list[str]:
        """The fault rules in place, as iptables prints them, and the qdiscs (for reports)."""
        rules = []
        for chain in ("INPUT", "OUTPUT"):
            listing = run_tool("ip", "netns", "exec", self.namespace, "iptables", "-S", f"{FAULT_CHAIN}-{chain}")
            rules += [line for line in listing.stdout.splitlines() if line.startswith("-A")]
        shaping = run_tool("tc", "qdisc", "show", "dev", self.link).stdout
        rules += [line.strip() for line in shaping.splitlines() if " tbf " in line]
        return rules
