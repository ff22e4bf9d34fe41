"""Engine pods: the user's template plus what lets the engine map the node's cache.

Engines are Pods the operator owns directly (not a Deployment) because each carries a role
(active or standby) that the operator flips; the Service selects ``role=active``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.launch import EngineArgs

from weightcache_operator import profiles
from weightcache_operator.render.artifacts import engine_artifact_volumes
from weightcache_operator.render.dra import CLAIM_NAME, container_claims, engine_claim_fields, uses_dra
from weightcache_operator.render.layout import (
    daemon_spec_hash,
    explain_exits,
    model_volume,
    pin_to_nodes,
    placement_fields,
    socket_volume,
)
from weightcache_operator.render.security import container_security, with_defaults
from weightcache_operator.render.warm import warm_container
from weightcache_operator.spec import PRE_STOP_SLEEP_DEFAULT_S, STOP_GRACE_S, WeightCache
from weightcache_operator.vocabulary import (
    CLAIM_ANNOTATION,
    ENGINE_HASH_LABEL,
    GROUP_LABEL,
    MODEL_MOUNT,
    NODE_RANK_LABEL,
    READY_GATE,
    REPLICA_LABEL,
    ROLE_LABEL,
    SOCKET_MOUNT,
    SPEC_HASH_ANNOTATION,
    SPEC_HASH_LABEL,
    CacheRef,
    served_model_name,
)

Role = Literal["active", "standby"]


def engine_template_hash(cache: WeightCache) -> str:
    """The engine version, for rollouts: a digest of everything an engine pod is rendered from
    except what differs between pods of one version (replica, role, nodes, claim, group) and
    what only says how to roll or fail over (replicas, standbys, rollout and failover settings). It covers the daemon spec
    hash too (engines map those weights), so a generation change is also a new version."""
    # The served name enters as what the engines serve (the default follows the cache's name).
    excluded = {"replicas", "standbys_per_replica", "rollout", "failover", "served_model_name"}
    if cache.spec.engine.pre_stop_sleep_seconds == PRE_STOP_SLEEP_DEFAULT_S:
        # Likewise: an operator upgrade must not roll every engine; engines get the sleep with
        # their next version.
        excluded.add("pre_stop_sleep_seconds")
    # Likewise for the profiles' blocks and their optional parts (profiles.engine_hash_exclude).
    exclude: dict[str, Any] = {**dict.fromkeys(excluded, True), **profiles.engine_hash_exclude(cache)}
    engine = cache.spec.engine.model_dump(by_alias=True, mode="json", exclude=exclude)
    canonical = json.dumps(
        {"engine": engine, "generation": daemon_spec_hash(cache), "servedModelName": served_model_name(cache)},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


DIST_PORT = 29500
"""The first port a multi-node engine's leader hosts the rendezvous of its ranks on. Each group of
a cache gets its own (``Member.port``): torch's rendezvous store listens on every address, so two
leaders sharing a network namespace (host network, the test kubelet) would collide on one port."""
DIST_PORT_ANNOTATION = "weightcache.io/dist-port"


@dataclass(frozen=True)
class Member:
    """One pod of an engine spanning ``parallelism.nodes`` nodes: which group, which node slot
    (``node_rank``; 0 is the leader, which serves HTTP) and, for the others, the leader's pod IP."""

    group: str
    node_rank: int
    leader_ip: str | None = None
    port: int = DIST_PORT


def engine_pod(
    cache: WeightCache,
    replica: int,
    role: Role,
    nodes: list[str] | None = None,
    *,
    claim: str | None = None,
    member: Member | None = None,
) -> dict[str, Any]:
    """One engine pod for ``replica`` in ``role``; named by the API server (generateName), so a
    replacement can be created while its predecessor is still terminating.

    ``nodes``: the nodes whose daemons are ready now; the pod is pinned to them so it never
    starts (and, with fallback disk, silently loads from disk) where no daemon holds the weights.
    ``claim`` (``gpuAccess: dra``): the ResourceClaim of the daemon the engine shares devices with.
    ``member`` (``parallelism.nodes > 1``): the pod's place in its engine group.

    Labelled with ``engine_template_hash`` (its version, for rollouts) and the daemon spec hash
    (its generation, which the Service selects)."""
    if uses_dra(cache) and claim is None:
        raise ValueError("gpuAccess dra: an engine pod needs its daemon's ResourceClaim (claim=...)")
    if (cache.spec.parallelism.nodes > 1) != (member is not None):
        raise ValueError("an engine pod needs member=... exactly when parallelism.nodes > 1")
    if member is not None and member.node_rank > 0 and not member.leader_ip:
        raise ValueError("a follower engine pod needs its leader's pod IP")
    ref = CacheRef.of(cache)
    spec = cache.spec
    profile = profiles.profile_of(cache)
    template = spec.engine.template
    meta = copy.deepcopy(template.metadata or {})
    pod_spec = copy.deepcopy(template.spec.model_dump(by_alias=True, exclude_none=True))

    labels = {
        **(meta.get("labels") or {}),
        **ref.labels("engine"),
        REPLICA_LABEL: str(replica),
        ROLE_LABEL: role,
        SPEC_HASH_LABEL: daemon_spec_hash(cache),
        ENGINE_HASH_LABEL: engine_template_hash(cache),
    }
    annotations = {**(meta.get("annotations") or {}), SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}
    if claim is not None:
        annotations[CLAIM_ANNOTATION] = claim
    if member is not None:
        labels[GROUP_LABEL] = member.group
        labels[NODE_RANK_LABEL] = str(member.node_rank)
        annotations[DIST_PORT_ANNOTATION] = str(member.port)

    model_vol, model_mount = model_volume(cache)
    sock_vol, sock_mount = socket_volume(ref, daemon_spec_hash(cache))
    env = _engine_env(cache, member) + profile.engine_env(cache)
    for container in pod_spec["containers"]:
        names = {e.get("name") for e in container.get("env", [])}
        container["env"] = [*(copy.deepcopy(e) for e in env if e["name"] not in names), *container.get("env", [])]
        mounts = [m for m in container.get("volumeMounts", []) if m.get("name") not in ("model", sock_mount["name"])]
        container["volumeMounts"] = [*mounts, dict(model_mount), dict(sock_mount)]
        explain_exits(container)
        if claim is not None:
            resources = container.setdefault("resources", {})
            resources["claims"] = [
                *(c for c in resources.get("claims", []) if c.get("name") != CLAIM_NAME),
                *container_claims(),
            ]
    # The daemon's uid, which its sockets admit. The root filesystem stays writable unless the
    # template says otherwise: engine programs and torch.compile write caches under the home
    # directory and /tmp.
    defaults = container_security(read_only_root=False)
    for container in [*pod_spec["containers"], *pod_spec.get("initContainers", [])]:
        container["securityContext"] = with_defaults(
            container.get("securityContext"), pod_spec.get("securityContext"), defaults
        )
    main = pod_spec["containers"][0]
    _stop_gracefully(main, pod_spec, spec.engine.pre_stop_sleep_seconds)
    command = profile.engine_command(cache)
    if command is not None:
        main["command"] = command
    if member is None or member.node_rank == 0:
        for probe, value in profile.engine_probes(cache).items():
            main.setdefault(probe, value)
        main.setdefault("ports", [{"name": "http", "containerPort": spec.engine.port}])
        warm = warm_container(cache, main, pod_spec["containers"])
        if warm is not None:
            warm["securityContext"] = with_defaults(None, pod_spec.get("securityContext"), container_security(True))
            pod_spec["containers"].append(warm)
    else:
        # A follower serves no HTTP: its ranks mirror the leader's steps. The group is Ready when
        # the leader is, whose readiness waits for every rank (remote ones included) to load and warm up.
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            main.pop(probe, None)

    volumes = [v for v in pod_spec.get("volumes", []) if v.get("name") not in ("model", sock_vol["name"])]
    pod_spec["volumes"] = [*volumes, model_vol, sock_vol]
    if profile.uses_artifacts(cache):
        for volume, mount in engine_artifact_volumes(cache):
            main["volumeMounts"].append(mount)
            pod_spec["volumes"].append(volume)
    gates = [g for g in pod_spec.get("readinessGates", []) if g.get("conditionType") != READY_GATE]
    pod_spec["readinessGates"] = [*gates, {"conditionType": READY_GATE}]
    for key, value in placement_fields(cache).items():
        pod_spec.setdefault(key, copy.deepcopy(value))
    if nodes is not None:
        pin_to_nodes(pod_spec, nodes)
    if claim is not None:
        pod_spec["resourceClaims"] = [
            *(c for c in pod_spec.get("resourceClaims", []) if c.get("name") != CLAIM_NAME),
            *engine_claim_fields(claim),
        ]
    pod_spec.setdefault("restartPolicy", "Always")

    naming = (
        {"name": f"{ref.name}-{replica}-{member.group}-{member.node_rank}"}
        if member is not None
        else {"generateName": f"{ref.name}-{replica}-"}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **naming,
            "namespace": ref.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": pod_spec,
    }


def _stop_gracefully(main: dict[str, Any], pod_spec: dict[str, Any], sleep_s: int) -> None:
    """A deleted engine leaves the Service's endpoints at once, but every node's proxy learns of
    it a moment later: the engine container sleeps that long before its SIGTERM (then drains), so
    no request sent in that moment meets a closed port. Every member of a group sleeps, so that
    the followers stay while their leader serves. The template's own hook and grace period win
    (validation refuses a grace period the sleep would not fit in)."""
    if sleep_s > 0 and "preStop" not in (main.get("lifecycle") or {}):
        main["lifecycle"] = {**(main.get("lifecycle") or {}), "preStop": {"sleep": {"seconds": sleep_s}}}
    pod_spec.setdefault("terminationGracePeriodSeconds", sleep_s + STOP_GRACE_S)


def engine_env(cache: WeightCache, member: Member | None = None) -> EngineArgs:
    """What the weightcache client in every engine reads (``EngineArgs.to_env``); ``member``: the pod's place in a multi-node engine group (node rank, node
    count, and the leader's rendezvous: the leader binds its own pod IP, the others dial it)."""
    spec = cache.spec
    model = spec.model
    parallelism = spec.parallelism
    block = model.quantization.weight_block_size
    group: dict[str, Any] = {}
    if member is not None:
        addr = f"$(POD_IP):{member.port}" if member.node_rank == 0 else f"{member.leader_ip}:{member.port}"
        group = {"nnodes": parallelism.nodes, "node_rank": member.node_rank, "dist_addr": addr}
    return EngineArgs(
        socket_dir=SOCKET_MOUNT,
        name=CacheRef.of(cache).name,
        model=MODEL_MOUNT,
        tp_size=parallelism.tensor,
        dtype=model.dtype,
        quantization=model.quantization.method,
        weight_cache_mode="client",
        weight_cache_fallback=spec.engine.weight_fallback,
        backend=spec.daemon.backend,
        port=spec.engine.port,
        served_model_name=served_model_name(cache),
        # Engines of one node share the host's network in some runtimes: bind the pod's own IP.
        host="$(POD_IP)",
        # Like every value at the engine's default, absent at 1: other caches' pods do not change.
        ep_size=parallelism.expert,
        revision=model.revision or "",
        weight_block_size=(block[0], block[1]) if model.quantization.method == "fp8" else None,
        **group,
    )


def _engine_env(cache: WeightCache, member: Member | None) -> list[dict[str, Any]]:
    """``engine_env`` as container env, after the ``POD_IP`` its values expand. A variable the
    template sets itself wins, so users can override any of it."""
    env: list[dict[str, Any]] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    env += [{"name": k, "value": v} for k, v in engine_env(cache, member).to_env().items()]
    if cache.spec.daemon.backend in GPU_BACKENDS and not uses_dra(cache):
        # Engines request no GPUs; they see all of the node's devices and find the daemon's by UUID
        # (the fetch reply names it), whatever ordinal numbering their runtime gives them.
        env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    return env
