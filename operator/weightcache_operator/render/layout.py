"""What every renderer shares: the checkpoint and socket volumes, termination messages, pinning
to nodes, the model's arguments and the daemon spec hash (a generation's identity). The names
and labels they use are the operator's vocabulary (vocabulary.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from weightcache_contract.termination import ENV as TERMINATION_ENV

from weightcache_operator import profiles
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import (
    MODEL_MOUNT,
    SOCKET_MOUNT,
    CacheRef,
)

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


"""Where daemon and engines see the cache's socket directory (``--socket-dir``)."""


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
        # How a change rolls out is not what the daemons hold: changing it must not start one. Nor is
        # where a starting daemon copies its ranks from (seeding): its bytes are verified to be the
        # same, and caches that predate the field keep their hash.
        "daemon": spec.daemon.model_dump(by_alias=True, mode="json", exclude={"generation_change", "seeding"}),
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
