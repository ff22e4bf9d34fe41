"""Names, labels, paths and the rank → node mapping shared by every renderer.

Rank → node mapping (deterministic, documented in docs/operator.md): ranks are numbered
``pp_rank * tensor + tp_rank``; with ``nodes = 1`` every selected node runs a daemon for all ranks
``0 .. ranks-1`` and holds a full copy, so an engine can start on any selected node and maps from
the daemon of its own node. With ``nodes > 1`` node slot ``i`` (``topology.assign_slots``) holds
ranks ``i*ranks_per_node .. (i+1)*ranks_per_node - 1`` (``local_ranks``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from weightcache_contract.termination import ENV as TERMINATION_ENV

from .. import profiles
from ..spec import API_VERSION, KIND, WeightCache

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
TERMINATION_LOG = "/dev/termination-log"
"""Where rendered containers leave their termination message (Kubernetes' default path)."""


def explain_exits(container: dict[str, Any]) -> dict[str, Any]:
    """Makes the container's fatal error its termination message, which Kubernetes puts in the
    pod's ``state.terminated.message`` for ``kubectl describe pod`` and the operator's conditions:
    the weightcache CLI writes its error to ``$WEIGHTCACHE_TERMINATION_LOG`` (set here to the
    container's ``terminationMessagePath``); any other process that dies with an error leaves the
    tail of its log (``FallbackToLogsOnError``). Values the container already sets are kept."""
    container.setdefault("terminationMessagePath", TERMINATION_LOG)
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    env = container.setdefault("env", [])
    if not any(e.get("name") == TERMINATION_ENV for e in env):
        env.append({"name": TERMINATION_ENV, "value": container["terminationMessagePath"]})
    return container


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
"""Where daemon and engines see the cache's socket directory (``--socket-dir``)."""
STATUS_PORT = 9400
STATUS_PORT_NAME = "status"
"""The daemon pod's status endpoint (GET /status, GET /metrics), bound to the pod IP; the
operator finds it through the container port of this name."""
MODEL_MOUNT = "/weightcache/model"
"""Where daemon and engines see the checkpoint: the same path on both sides, because the resolved
model path is part of the weights' fingerprint."""


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


def pin_to_nodes(pod_spec: dict[str, Any], nodes: list[str]) -> None:
    """ANDs ``hostname in nodes`` into every required node-affinity term (terms are ORed, the
    expressions of one term ANDed), keeping whatever affinity the template or placement set.
    Copies what it changes, so a spec's affinity object is never mutated."""
    pin = {"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(nodes)}
    affinity = pod_spec["affinity"] = dict(pod_spec.get("affinity") or {})
    node_affinity = affinity["nodeAffinity"] = dict(affinity.get("nodeAffinity") or {})
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    required = node_affinity[key] = dict(node_affinity.get(key) or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or [{}]]
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []), dict(pin, values=list(pin["values"]))]
    required["nodeSelectorTerms"] = terms


SERVED_MODEL_ANNOTATION = "weightcache.io/served-model-name"
"""On the Service: the model name its engines answer to, for routers and clients that discover
Services (annotations take any name an engine allows; labels would not)."""


def served_model_name(cache: WeightCache) -> str:
    """The model's name in the engines' API: the spec's, else the WeightCache's own name, which is
    what ``kubectl get wc`` shows and so what a client can know without looking inside a pod."""
    return cache.spec.engine.served_model_name or CacheRef.of(cache).name


def daemon_spec_hash(cache: WeightCache) -> str:
    """A digest of everything that decides what the daemons hold and how they run. Engines are
    gated on daemons carrying this hash, so an engine never turns Ready against daemons of an
    older spec (model, dtype, quantization, layout, image, backend, args) or of a checkpoint
    reloaded since (``status.checkpointReload``)."""
    spec = cache.spec
    relevant: dict[str, Any] = {
        # onChange says what to do about a change, not what the daemons hold.
        "model": spec.model.model_dump(by_alias=True, mode="json", exclude={"on_change"}),
        # expert=1 left out: caches that predate the field keep their hash, so an operator upgrade
        # does not start a generation change for every one of them.
        "parallelism": spec.parallelism.model_dump(
            by_alias=True, mode="json", exclude={"expert"} if spec.parallelism.expert == 1 else None
        ),
        "placement": spec.placement.model_dump(by_alias=True, mode="json"),
        # How a change rolls out is not what the daemons hold: changing it must not start one.
        "daemon": spec.daemon.model_dump(by_alias=True, mode="json", exclude={"generation_change"}),
    }
    # What the engine's profile loads by beyond the above (nothing for most: their hash stays).
    relevant |= profiles.profile_of(cache).daemon_hash_fields(cache)
    reload = cache.status.checkpoint_reload if cache.status is not None else None
    if reload is not None:
        # A checkpoint change under spec.model.onChange: Reload (checkpoint_watch.py): the same spec,
        # other bytes on disk, so another generation. Absent otherwise: no cache's hash moves.
        relevant["checkpointReload"] = reload.identity
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def model_volume(cache: WeightCache) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint as a read-only volume and its mount at MODEL_MOUNT."""
    source = cache.spec.model.source
    mount: dict[str, Any] = {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
    if source.host_path is not None:
        volume = {"name": "model", "hostPath": {"path": source.host_path.path, "type": "Directory"}}
    else:
        assert source.pvc is not None
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True}}
        if source.pvc.sub_path:
            mount["subPath"] = source.pvc.sub_path
    return volume, mount


def socket_volume(ref: CacheRef, daemon_hash: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The host directory of the cache's daemons of spec hash ``daemon_hash``, holding
    ``<name>/rank-N.sock|.ready`` and ``keeper.sock``."""
    volume = {
        "name": "weightcache-sockets",
        "hostPath": {"path": ref.socket_host_dir(daemon_hash), "type": "DirectoryOrCreate"},
    }
    return volume, {"name": "weightcache-sockets", "mountPath": SOCKET_MOUNT}


def placement_fields(cache: WeightCache) -> dict[str, Any]:
    """nodeSelector / affinity / tolerations, applied to daemons and engines alike."""
    placement = cache.spec.placement
    fields: dict[str, Any] = {}
    if placement.node_selector:
        fields["nodeSelector"] = dict(placement.node_selector)
    if placement.affinity:
        fields["affinity"] = placement.affinity
    if placement.tolerations:
        fields["tolerations"] = list(placement.tolerations)
    return fields


def model_args(cache: WeightCache) -> list[str]:
    """The flags daemon and engine must agree on: they all enter the fingerprint."""
    model = cache.spec.model
    args = ["--model", MODEL_MOUNT, "--dtype", model.dtype, "--quantization", model.quantization.method]
    if model.quantization.method == "fp8":
        args += ["--weight-block-size", ",".join(str(n) for n in model.quantization.weight_block_size)]
    if model.revision:
        args += ["--revision", model.revision]
    return args
