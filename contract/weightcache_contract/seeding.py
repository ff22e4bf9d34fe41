"""Seeding: a starting daemon copies a Ready peer's finished rank arena instead of loading it.

What crosses the boundary between the operator and the daemons, defined once:

- the **peers file**, which the operator writes into a ConfigMap mounted by every daemon pod of a
  cache: the Ready daemon pods of the current generation on Ready nodes, each with the weights
  digest (``Fingerprint.weights_digest``) of every rank it holds, in the order a daemon should try
  them (those on cordoned nodes last);
- the **credential**, a Secret of the cache's own mounted as one file: only a daemon that holds it
  can fetch, and only a daemon that holds it can serve (both prove it, see the data plane's
  ``weightcache.seeding``);
- the **seed outcome** a rank reports on ``GET /status``: where its bytes came from, and why a
  seed fell back to the disk.

Standard library and pydantic only: the operator imports this without torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SEED_PORT = 9410
"""Local rank i of a daemon pod serves seeds on ``SEED_PORT + i`` of the pod's IP."""
SEED_PORT_NAME = "seed"

PEERS_FILE = "peers.json"
"""The peers file's name inside its mounted ConfigMap (the ConfigMap's one key)."""
CREDENTIAL_KEY = "credential"
"""The credential's key inside the cache's seeding Secret (and its file name where mounted)."""
CREDENTIAL_MIN_BYTES = 32


class _Seeding(BaseModel):
    # Unknown fields are ignored: a newer operator may add some during a rolling upgrade.
    model_config = ConfigDict(extra="ignore", frozen=True)


class SeedPeer(_Seeding):
    """One Ready daemon pod a starting daemon may copy ranks from."""

    node: str
    address: str
    """The pod's IP."""
    port: int = Field(default=SEED_PORT, ge=1, le=65535)
    """Where its local rank 0 serves; local rank i serves on ``port + i``."""
    ranks: dict[int, str]
    """Global rank → the weights digest of what that rank holds."""
    local_index: dict[int, int] = {}
    """Global rank → its local index in the pod (default: the order of ``ranks``)."""

    def rank_port(self, rank: int) -> int:
        index = self.local_index.get(rank)
        if index is None:
            index = sorted(self.ranks).index(rank)
        return self.port + index


class SeedPeers(_Seeding):
    """The peers file. ``peers`` in the order to try; the operator spreads new nodes over seeds by
    ordering each node's list (``assignments``: node → peer nodes it should try first)."""

    peers: list[SeedPeer] = []
    assignments: dict[str, list[str]] = {}

    def candidates(self, rank: int, weights_digest: str, own_node: str | None) -> list[SeedPeer]:
        """The peers that hold ``rank`` with these weights, not on ``own_node``: the ones assigned to
        ``own_node`` first (in the assignment's order), then the rest in file order."""
        holding = [p for p in self.peers if p.ranks.get(rank) == weights_digest and p.node != own_node]
        preferred = self.assignments.get(own_node or "", [])
        first = [p for name in preferred for p in holding if p.node == name]
        return first + [p for p in holding if p not in first]


SeedSource = Literal["disk", "keeper", "peer"]


class SeedReport(_Seeding):
    """How a rank got its bytes this life, when it asked peers first."""

    peer: str | None = None
    """The node whose daemon served the bytes; null when they came from the disk."""
    bytes: int = Field(default=0, ge=0)
    """Bytes received from the peer (verified)."""
    seconds: float = Field(default=0.0, ge=0)
    fallback: str | None = None
    """Why the rank loaded from the disk after all (every peer's refusal or failure, for people);
    null when a peer served it, or when no peer held the rank (nothing to fall back from)."""
    attempts: list[str] = []
    """One line per peer tried and what came of it."""
