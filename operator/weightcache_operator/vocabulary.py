"""The operator's shared vocabulary: the labels and annotations it puts on what it creates and reads
back, the paths every node and pod share, the status port, and a cache's identity (``CacheRef``).
Every room uses these; renderers (render/) build objects with them, observers select by them.

Rank → node mapping (deterministic, documented in docs/operator.md): ranks are numbered
``pp_rank * tensor + tp_rank``; with ``nodes = 1`` every selected node runs a daemon for all ranks
``0 .. ranks-1`` and holds a full copy, so an engine can start on any selected node and maps from
the daemon of its own node. With ``nodes > 1`` node slot ``i`` (``topology.assign_slots``) holds
ranks ``i*ranks_per_node .. (i+1)*ranks_per_node - 1`` (``local_ranks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from weightcache_operator.spec import API_VERSION, KIND, WeightCache

CACHE_LABEL = "weightcache.io/cache"

COMPONENT_LABEL = "weightcache.io/component"

REPLICA_LABEL = "weightcache.io/replica"

ROLE_LABEL = "weightcache.io/role"

SPEC_HASH_ANNOTATION = "weightcache.io/daemon-spec-hash"

SPEC_HASH_LABEL = "weightcache.io/daemon-spec-hash"
"""On daemon pods and on engine pods (the generation whose weights an engine maps); the Service
selects one value of it, so it never sends traffic to two generations at once."""

ENGINE_HASH_LABEL = "weightcache.io/engine-hash"
"""On engine pods: a digest of the rendered engine pod, so a rollout can tell versions apart."""

READY_GATE = "weightcache.io/daemon-ready"

STRATEGY_ANNOTATION = "weightcache.io/generation-change"
"""On a daemon DaemonSet: BlueGreen or NodeByNode, how the change to its generation was decided."""

STRATEGY_REASON_ANNOTATION = "weightcache.io/generation-change-reason"

SLOT_LABEL = "weightcache.io/slot"
"""On daemon pods with ``nodes > 1``: the node slot whose ranks the pod holds."""

GROUP_LABEL = "weightcache.io/engine-group"
"""On engine pods with ``nodes > 1``: the pods that together run one engine share it."""

NODE_RANK_LABEL = "weightcache.io/node-rank"
"""On engine pods with ``nodes > 1``: which slot's ranks the pod runs; 0 is the group's leader."""

SERVING_ANNOTATION = "weightcache.io/serving-engines"
"""On the disruption budget: the active engine pods after the last demotion, and when (executor.py
says why)."""

CLAIM_ANNOTATION = "weightcache.io/resource-claim"
"""On engine pods with ``gpuAccess: dra``: the daemon's ResourceClaim the engine shares."""

MANAGED_BY = {"app.kubernetes.io/managed-by": "weightcache-operator"}

CLI = ["python", "-m", "weightcache"]
"""The daemon image puts its venv's python first on PATH; ``python -m`` works there and in the
e2e cluster, whose process kubelet runs commands from the test environment."""

SOCKET_HOST_ROOT = "/run/weightcache"
"""Host directory under which each cache gets ``<namespace>-<name>/<daemon spec hash>``, shared by
a generation's daemon and the engines mapping it; one directory per generation, so two
generations' daemons (a blue/green change) can run on one node side by side. The per-cache
directory itself holds the GPU holder's grant (``gpus.json``, ``gpus.lock``), which every
generation's daemons read."""

SOCKET_MOUNT = "/run/weightcache"

ARTIFACT_HOST_ROOT = "/var/lib/weightcache/artifacts"

ARTIFACT_MOUNT = "/weightcache/artifacts"
"""Where daemon and engines see the cache's compile-artifact directory (render/artifacts.py)."""

STATUS_PORT = 9400

STATUS_PORT_NAME = "status"
"""The daemon pod's status endpoint (GET /status, GET /metrics), bound to the pod IP; the
operator finds it through the container port of this name."""

SEED_PEERS_MOUNT = "/weightcache/seed-peers"
"""Where a daemon sees the cache's peers ConfigMap (its one file: ``seeding.PEERS_FILE``)."""

SEED_CREDENTIAL_MOUNT = "/weightcache/seed-credential"
"""Where a daemon sees the cache's seeding Secret (its one file: ``seeding.CREDENTIAL_KEY``)."""

MODEL_MOUNT = "/weightcache/model"
"""Where daemon and engines see the checkpoint: the same path on both sides, because the resolved
model path is part of the weights' fingerprint."""


CacheKey = tuple[str, str]
"""A cache as (namespace, name): what every per-cache index, memory and pass is keyed by."""


@dataclass(frozen=True)
class CacheRef:
    """Identity of the WeightCache object being rendered (from its metadata)."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, cache: WeightCache) -> CacheRef:
        meta = cache.metadata
        return cls(name=meta["name"], namespace=meta.get("namespace", "default"), uid=meta.get("uid", ""))

    @property
    def cache_host_dir(self) -> str:
        """The host directory of this cache on every node: the generations' socket directories
        and the GPU holder's grant."""
        return f"{SOCKET_HOST_ROOT}/{self.namespace}-{self.name}"

    @property
    def artifact_host_dir(self) -> str:
        """The host directory of this cache's compile artifacts on every node (render/artifacts.py):
        one per cache, not per generation, since each entry's key names the weights; on disk, not
        under /run, so a node's reboot keeps it."""
        return f"{ARTIFACT_HOST_ROOT}/{self.namespace}-{self.name}"

    def socket_host_dir(self, daemon_hash: str) -> str:
        return f"{self.cache_host_dir}/{daemon_hash}"

    @property
    def daemon_name(self) -> str:
        return f"{self.name}-daemon"

    @property
    def seeding_secret_name(self) -> str:
        """The Secret holding the cache's seeding credential (render/seeding.py)."""
        return f"{self.name}-seeding"

    @property
    def seed_peers_name(self) -> str:
        """The ConfigMap holding the cache's peers file (render/seeding.py)."""
        return f"{self.name}-seed-peers"

    def owner_reference(self) -> dict[str, Any]:
        """Makes the garbage collector delete what we render when the WeightCache goes."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def labels(self, component: str) -> dict[str, str]:
        return {CACHE_LABEL: self.name, COMPONENT_LABEL: component, **MANAGED_BY}


def local_ranks(cache: WeightCache, slot: int = 0) -> list[int]:
    """The global ranks held by node slot ``slot`` (see the module docstring)."""
    per_node = cache.spec.parallelism.ranks_per_node
    return list(range(slot * per_node, (slot + 1) * per_node))


SERVED_MODEL_ANNOTATION = "weightcache.io/served-model-name"
"""On the Service: the model name its engines answer to, for routers and clients that discover
Services (annotations take any name an engine allows; labels would not)."""


def served_model_name(cache: WeightCache) -> str:
    """The model's name in the engines' API: the spec's, else the WeightCache's own name, which is
    what ``kubectl get wc`` shows and so what a client can know without looking inside a pod."""
    return cache.spec.engine.served_model_name or CacheRef.of(cache).name
