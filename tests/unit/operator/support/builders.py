"""Kubernetes objects for unit tests, as raw dicts shaped like the API server's answers: what the
operator's views (objects.py) and planners read. One composable builder per kind, keyword
arguments with defaults; a test names only what its scenario is about.

Times are seconds after ``NOW`` (``at``), stamped as the API writes them (to the second). A
builder writes only the fields it is asked for, so an object never carries a signal its test did
not mean: no Ready condition unless ``ready`` is given, no phase unless ``phase`` is.

tests/unit/conftest.py puts this folder on ``sys.path``, so test modules import this one as
``builders`` however pytest is started.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from weightcache_operator.objects import stamp
from weightcache_operator.observe.validation import parse
from weightcache_operator.plan.gates import DAEMON_UID_ANNOTATION
from weightcache_operator.render import READY_GATE, SPEC_HASH_ANNOTATION
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import (
    CACHE_LABEL,
    CLAIM_ANNOTATION,
    ENGINE_HASH_LABEL,
    REPLICA_LABEL,
    ROLE_LABEL,
    SLOT_LABEL,
)

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)

BASE: dict[str, Any] = {
    "apiVersion": "weightcache.io/v1alpha1",
    "kind": "WeightCache",
    "metadata": {"name": "tiny", "namespace": "ns", "uid": "uid-1", "generation": 3},
    "spec": {
        "model": {"source": {"hostPath": {"path": "/models/tiny"}}, "revision": "r1", "dtype": "float32"},
        "parallelism": {"tensor": 2},
        "placement": {"nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]},
        "daemon": {"image": "wc/daemon:1", "backend": "cpu-shm"},
        "engine": {
            "replicas": 1,
            "standbysPerReplica": 1,
            "template": {
                "metadata": {"labels": {"app": "chat"}},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "e:1",
                            "command": ["weightcache", "engine"],
                            "env": [{"name": "WEIGHTCACHE_ENGINE_THREADS", "value": "1"}],
                        }
                    ]
                },
            },
        },
    },
}
"""A valid WeightCache: a two-rank model on CPU shared memory, one replica with one standby."""


def changed(obj: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of the WeightCache body ``obj`` with dotted spec paths set, e.g.
    ``changed(BASE, **{"engine.vllm.args": []})``."""
    body = copy.deepcopy(dict(obj))
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = body["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return body


def cache_of(obj: dict[str, Any]) -> WeightCache:
    """The WeightCache body ``obj`` parsed and validated as the operator parses a cache it reads."""
    cache, problems = parse(obj)
    assert cache is not None and problems == [], problems
    return cache


def make(**changes: Any) -> WeightCache:
    """BASE with dotted-path spec changes, e.g. ``make(**{"daemon.backend": "cuda-ipc"})``, parsed."""
    return cache_of(changed(BASE, **changes))


def after(seconds: float) -> datetime:
    """NOW plus ``seconds``."""
    return NOW + timedelta(seconds=seconds)


def at(seconds: float) -> str:
    """NOW plus ``seconds``, as the API stamps it."""
    return stamp(after(seconds))


def condition(kind: str, status: bool | str, *, since: float | None = None) -> dict[str, Any]:
    """A status condition; ``since``: its lastTransitionTime, seconds after NOW."""
    found: dict[str, Any] = {"type": kind, "status": status if isinstance(status, str) else str(status)}
    if since is not None:
        found["lastTransitionTime"] = at(since)
    return found


def container_status(
    name: str = "engine",
    *,
    started: float | None = None,
    waiting: str | None = None,
    exited: Mapping[str, Any] | None = None,
    last_exit: Mapping[str, Any] | None = None,
    restarts: int | None = None,
) -> dict[str, Any]:
    """A container running (since NOW+``started`` when given), or waiting for the reason
    ``waiting``, or ended in ``exited`` (a ``terminated`` state); ``last_exit``: how its run before
    ended (its lastState), for a container restarted or in back-off."""
    state: dict[str, Any]
    if waiting is not None:
        state = {"waiting": {"reason": waiting}}
    elif exited is not None:
        state = {"terminated": dict(exited)}
    else:
        state = {"running": {"startedAt": at(started)} if started is not None else {}}
    found: dict[str, Any] = {"name": name}
    if restarts is not None:
        found["restartCount"] = restarts
    found["state"] = state
    if last_exit is not None:
        found["lastState"] = {"terminated": dict(last_exit)}
    return found


def terminated(code: int, message: str | None = None) -> dict[str, Any]:
    """A container's end as the kubelet reports it: exit ``code`` (reason Completed for 0, else
    Error) and, when given, its termination ``message``."""
    ended: dict[str, Any] = {"exitCode": code, "reason": "Error" if code else "Completed"}
    if message is not None:
        ended["message"] = message
    return ended


def pod(
    name: str = "pod",
    *,
    namespace: str | None = None,
    uid: str | None = None,
    resource_version: int | str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: str | None = None,
    created: float | None = None,
    deleted: float | None = None,
    grace: int | None = None,
    node: str | None = "node-1",
    phase: str | None = None,
    ip: str | None = None,
    ready: bool | None = None,
    ready_since: float | None = None,
    conditions: Sequence[Mapping[str, Any]] = (),
    containers: Sequence[Mapping[str, Any]] | None = None,
    spec: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod on ``node`` (None: not scheduled) whose uid is ``uid-<name>`` unless ``uid``.
    ``ready``: its Ready condition (since NOW+``ready_since``), then ``conditions``; ``owner``: the
    uid of the DaemonSet that controls it; ``created`` and ``deleted``: its creation and deletion
    timestamps in seconds after NOW (with ``grace``, ``deleted`` is when the deletion was asked
    for: the API stamps deletionTimestamp that many seconds later and records the grace period);
    ``containers``: its container statuses; ``spec`` and ``status``: further fields of each,
    written last."""
    meta: dict[str, Any] = {"name": name, "uid": uid or f"uid-{name}"}
    if namespace is not None:
        meta["namespace"] = namespace
    if resource_version is not None:
        meta["resourceVersion"] = str(resource_version)
    meta["labels"] = dict(labels or {})
    meta["annotations"] = dict(annotations or {})
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "uid": owner}]
    if created is not None:
        meta["creationTimestamp"] = at(created)
    if deleted is not None:
        meta["deletionTimestamp"] = at(deleted + (grace or 0))
    if grace is not None:
        meta["deletionGracePeriodSeconds"] = grace
    found: dict[str, Any] = {}
    if phase is not None:
        found["phase"] = phase
    if ip is not None:
        found["podIP"] = ip
    every = ([condition("Ready", ready, since=ready_since)] if ready is not None else []) + [
        dict(c) for c in conditions
    ]
    if every:
        found["conditions"] = every
    if containers is not None:
        found["containerStatuses"] = [dict(c) for c in containers]
    found.update(status or {})
    return {"metadata": meta, "spec": {**({"nodeName": node} if node else {}), **(spec or {})}, "status": found}


def engine(
    name: str = "tiny-0-a",
    *,
    cache: str | None = None,
    role: str = "active",
    replica: int = 0,
    engine_hash: str | None = None,
    spec_hash: str | None = None,
    gate: str | None = None,
    started: float | None = None,
    containers_ready: bool | None = None,
    mapped_from: str | None = None,
    claim: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    conditions: Sequence[Mapping[str, Any]] = (),
    containers: Sequence[Mapping[str, Any]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """An engine pod of ``replica`` in ``role`` (of the cache named ``cache`` when given) that maps
    the daemon generation ``spec_hash``. When given: ``engine_hash``, the engine template version
    it was rendered from (its label); ``gate``, the status of its daemon-ready gate (stamped as its
    Ready condition is); ``started``, when its container ``engine`` started running, in seconds
    after NOW; ``containers_ready``, its ContainersReady condition; ``mapped_from``, the uid of the
    daemon pod it mapped from; ``claim``, the daemon's ResourceClaim it shares. The rest as ``pod``
    takes it."""
    given = ((SPEC_HASH_ANNOTATION, spec_hash), (DAEMON_UID_ANNOTATION, mapped_from), (CLAIM_ANNOTATION, claim))
    own = [condition("ContainersReady", containers_ready)] if containers_ready is not None else []
    if gate is not None:
        own.append(condition(READY_GATE, gate, since=fields.get("ready_since")))
    return pod(
        name,
        labels={
            **({CACHE_LABEL: cache} if cache is not None else {}),
            REPLICA_LABEL: str(replica),
            ROLE_LABEL: role,
            **({ENGINE_HASH_LABEL: engine_hash} if engine_hash is not None else {}),
            **(labels or {}),
        },
        annotations={**{key: value for key, value in given if value is not None}, **(annotations or {})},
        conditions=[*own, *conditions],
        containers=[container_status("engine", started=started)] if started is not None else containers,
        **fields,
    )


def daemon(
    name: str | None = None,
    *,
    node: str = "node-1",
    spec_hash: str | None = None,
    slot: int | str | None = None,
    claim: str | None = None,
    status_port: int | None = None,
    annotations: Mapping[str, str] | None = None,
    status: Mapping[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A daemon pod on ``node`` (named after it unless ``name``) of the generation ``spec_hash``;
    when given, holding node slot ``slot``, sharing its GPUs through the ResourceClaim ``claim`` and
    serving its status report on ``status_port``. The rest as ``pod`` takes it."""
    annotated = {SPEC_HASH_ANNOTATION: spec_hash} if spec_hash is not None else {}
    claimed = {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": claim}]} if claim is not None else {}
    return pod(
        name or f"tiny-daemon-{node}",
        node=node,
        labels={SLOT_LABEL: str(slot)} if slot is not None else None,
        annotations={**annotated, **(annotations or {})},
        status={**claimed, **(status or {})},
        spec={"containers": [daemon_container(status_port)]} if status_port is not None else None,
        **fields,
    )


def daemon_container(status_port: int) -> dict[str, Any]:
    """The daemon container as its pod's spec lists it: the port the operator reads its report from."""
    return {"name": "daemon", "ports": [{"name": "status", "containerPort": status_port}]}


def scheduled(
    rendered: Mapping[str, Any],
    *,
    node: str,
    name: str | None = None,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    created: float = 0,
    deleted: float | None = None,
    ip: str | None = None,
    ready: bool = False,
) -> dict[str, Any]:
    """A pod the operator rendered (render/engine.py) as the API server returns it once scheduled
    on ``node`` and running, Ready or not: named ``name`` when given (the API's name for a
    ``generateName``), created and deleted at seconds after NOW, with further ``labels``."""
    found = copy.deepcopy(dict(rendered))
    meta = found["metadata"]
    if name is not None:
        meta.pop("generateName", None)
        meta["name"] = name
    if namespace is not None:
        meta["namespace"] = namespace
    meta.setdefault("labels", {}).update(labels or {})
    meta["creationTimestamp"] = at(created)
    if deleted is not None:
        meta["deletionTimestamp"] = at(deleted)
    found["spec"]["nodeName"] = node
    found["status"] = {"phase": "Running", "podIP": ip, "conditions": [condition("Ready", ready)]}
    return found


def daemonset(
    name: str = "tiny-daemon",
    *,
    uid: str = "ds-1",
    labels: Mapping[str, str] | None = None,
    desired: int = 1,
    misscheduled: int = 0,
) -> dict[str, Any]:
    """A DaemonSet whose controller counts ``desired`` nodes, ``misscheduled`` of its pods on nodes it no longer wants."""
    status = {"desiredNumberScheduled": desired, "numberMisscheduled": misscheduled}
    return {"metadata": {"name": name, "uid": uid, "labels": dict(labels or {})}, "status": status}


def node(
    name: str,
    *,
    uid: str | None = None,
    resource_version: int | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] | None = None,
    unschedulable: bool | None = None,
    ready: bool | str | None = None,
    ready_since: float | None = None,
    allocatable: Mapping[str, str] | None = None,
    status: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A node with ``labels``, whose uid is ``uid-<name>`` unless ``uid``; ``taints`` and ``unschedulable`` (cordoned) in its spec when given;
    ``ready``: its Ready condition (since NOW+``ready_since``); ``status``: further status fields."""
    meta: dict[str, Any] = {"name": name, "uid": uid or f"uid-{name}"}
    if resource_version is not None:
        meta["resourceVersion"] = str(resource_version)
    meta["labels"] = dict(labels or {})
    spec: dict[str, Any] = {}
    if taints is not None:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    found: dict[str, Any] = {}
    if ready is not None:
        found["conditions"] = [condition("Ready", ready, since=ready_since)]
    if allocatable is not None:
        found["allocatable"] = dict(allocatable)
    found.update(status or {})
    return {"metadata": meta, "spec": spec, "status": found}
