"""Carries out a pass's actions (actions.py) against the API server, in the order they come (the
planners put them in ``actions.ORDER``), and writes the API's answers into the pass's snapshot.
One ``match`` over one list; no decisions here beyond what each action says.

Consecutive actions of one kind that are independent requests go out at once (together.py):
the daemons' DaemonSets, the gates, the creations of engine pods."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime
from functools import partial

from weightcache_contract.seeding import CREDENTIAL_MIN_BYTES

from weightcache_operator.act.applying import apply_if_different
from weightcache_operator.act.report import Reporter
from weightcache_operator.act.routing import sync_pool
from weightcache_operator.kubeapi import STRATEGIC_MERGE, ApiError, KubeApi
from weightcache_operator.objects import Object, PodView
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.actions import (
    Action,
    ApplyClaimTemplate,
    ApplyDaemonSet,
    ApplySeedPeers,
    ApplyService,
    Create,
    CreateSeedingSecret,
    Delete,
    DeleteDaemonSet,
    Failover,
    RecountBudget,
    ReplaceDaemon,
    SetGate,
    SetRole,
    SyncRouting,
)
from weightcache_operator.plan.gates import DAEMON_UID_ANNOTATION
from weightcache_operator.plan.status_reports import RoutingReport
from weightcache_operator.render.budget import engine_budget
from weightcache_operator.render.gpu_holder import stale_holder, uses_gpu_holder
from weightcache_operator.render.seeding import seeding_secret
from weightcache_operator.render.service import engine_service
from weightcache_operator.spec import FailoverStatus, WeightCache
from weightcache_operator.together import all_at_once
from weightcache_operator.vocabulary import ROLE_LABEL, SERVING_ANNOTATION

log = logging.getLogger("weightcache_operator.act.executor")


@dataclass
class Outcome:
    """What carrying out a pass's actions says for its status, as typed parts of it."""

    failover: FailoverStatus | None = None
    """``status.lastFailover`` of the last failover carried out; None without one."""
    routing: RoutingReport = RoutingReport()
    """``status.inferencePool`` and the InferencePoolReady condition (``SyncRouting``); empty
    without routing."""


def execute(
    api: KubeApi,
    reporter: Reporter,
    cache: WeightCache,
    snapshot: Snapshot,
    actions: list[Action],
    noticed: datetime,
    pool: Executor | None = None,
) -> Outcome:
    """Carries out ``actions``. ``noticed``: when the pass started, after reading the cluster
    (what detection is measured to and promotion from). Independent requests of one action, and
    consecutive actions sent at once (``_batches``), go out together on ``pool``."""
    namespace = snapshot.namespace
    pods = f"/api/v1/namespaces/{namespace}/pods"
    daemonsets = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"
    outcome = Outcome()
    for batch in _batches(actions):
        match batch[0]:
            case CreateSeedingSecret(name):
                _create_seeding_secret(api, cache, namespace, name)
            case ApplySeedPeers(configmap, live):
                path = f"/api/v1/namespaces/{namespace}/configmaps/{configmap['metadata']['name']}"
                snapshot.seed_peers_applied(apply_if_different(api, path, configmap, live))
            case ApplyClaimTemplate(template):
                templates = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
                api.apply(f"{templates}/{template['metadata']['name']}", template)
            case ApplyDaemonSet():
                sets = [a for a in batch if isinstance(a, ApplyDaemonSet)]
                applied = all_at_once(
                    pool,
                    **{
                        str(k): partial(
                            apply_if_different,
                            api,
                            f"{daemonsets}/{a.daemonset['metadata']['name']}",
                            a.daemonset,
                            a.live,
                        )
                        for k, a in enumerate(sets)
                    },
                )
                for k in range(len(sets)):
                    snapshot.daemonset_applied(applied[str(k)])
            case SetGate():
                gates = [a for a in batch if isinstance(a, SetGate)]
                patches: dict[str, Callable[[], list[Object]]] = {
                    a.pod: partial(_set_gate, api, f"{pods}/{a.pod}", a) for a in gates
                }
                for patched in all_at_once(pool, **patches).values():
                    for pod_now in patched:
                        snapshot.pod_changed(pod_now)
            case SetRole(name, role):
                changed = api.patch(f"{pods}/{name}", {"metadata": {"labels": {ROLE_LABEL: role}}})
                snapshot.pod_changed(changed)
                log.info("relabelled engine", extra={"pod": name, "role": role})
            case Failover(promotion):
                outcome.failover = reporter.failover(snapshot.body, promotion, noticed) or outcome.failover
            case ApplyService(serve):
                _apply_service(api, cache, snapshot, serve, pool)
            case SyncRouting():
                # The generation the Service selects as this pass left it: a managed pool switches with it.
                outcome.routing = sync_pool(
                    api, cache, snapshot.serving, reporter.clock(), snapshot.previous.conditions
                )
            case Delete(name, why):
                api.delete(f"{pods}/{name}")
                snapshot.pod_deleted(name, reporter.clock())
                log.info("deleted engine", extra={"pod": name, "reason": why})
            case Create():
                # Consecutive creations are new engine pods of their own (a group's followers
                # come in a later pass, once its leader has an address): sent at once.
                creations = [a for a in batch if isinstance(a, Create)]
                created = all_at_once(
                    pool, **{str(k): partial(api.create, pods, c.pod) for k, c in enumerate(creations)}
                )
                for k, wanted in enumerate(creations):
                    snapshot.pod_changed(created[str(k)])
                    log.info(
                        "created engine",
                        extra={"pod": PodView(created[str(k)]).name, "role": PodView(wanted.pod).role},
                    )
            case ReplaceDaemon(pod):
                _replace_stale_holder(api, cache, snapshot, pod, reporter.clock())
                api.delete(f"{pods}/{pod}")
                snapshot.pod_deleted(pod, reporter.clock())
                log.info("replacing daemon", extra={"pod": pod, "reason": "generation change"})
            case DeleteDaemonSet(name, why):
                # Background: the garbage collector deletes its pods (keepers and arenas with them).
                api.delete(f"{daemonsets}/{name}", propagation="Background")
                snapshot.daemonset_deleted(name)
                log.info("deleted daemonset", extra={"daemonset": name, "reason": why})
            case RecountBudget(demoted):
                if demoted or _budget_overcounts(snapshot):
                    _recount_budget(api, snapshot, reporter.clock())
    return outcome


def _create_seeding_secret(api: KubeApi, cache: WeightCache, namespace: str, name: str) -> None:
    """Creates the credential Secret with fresh random bytes unless it exists (409: kept as it is,
    never read: the operator may create Secrets, not read them). The bytes are neither logged nor
    returned."""
    try:
        api.create(
            f"/api/v1/namespaces/{namespace}/secrets", seeding_secret(cache, secrets.token_bytes(CREDENTIAL_MIN_BYTES))
        )
    except ApiError as error:
        if error.status != 409:
            raise
        return
    log.info("created seeding secret", extra={"secret": name})


def _batches(actions: list[Action]) -> Iterator[list[Action]]:
    """``actions`` in order, consecutive ones that go out at once together: the daemons'
    DaemonSets (not the GPU holder's, which they wait for), the gates, the creations."""
    batch: list[Action] = []
    for action in actions:
        if batch and not (_together(action) and type(action) is type(batch[0])):
            yield batch
            batch = []
        batch.append(action)
    if batch:
        yield batch


def _together(action: Action) -> bool:
    return isinstance(action, SetGate | Create) or (isinstance(action, ApplyDaemonSet) and not action.holder)


def _apply_service(api: KubeApi, cache: WeightCache, snapshot: Snapshot, serve: str, pool: Executor | None) -> None:
    service = engine_service(cache, serve)
    # The budget follows the Service: it protects exactly what the Service sends traffic to.
    # Independent objects: applied at once.
    budget = engine_budget(cache, serve)
    namespace = snapshot.namespace
    applied = all_at_once(
        pool,
        service=partial(
            apply_if_different,
            api,
            f"/api/v1/namespaces/{namespace}/services/{service['metadata']['name']}",
            service,
            snapshot.service,
        ),
        budget=partial(
            apply_if_different,
            api,
            f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{budget['metadata']['name']}",
            budget,
            snapshot.budget,
        ),
    )
    snapshot.service_applied(applied["service"])
    snapshot.budget_applied(applied["budget"])


def _set_gate(api: KubeApi, path: str, action: SetGate) -> list[Object]:
    """One engine pod's patches, in order: the daemon it relies on, then its gate. Returns the
    pod as each patch left it; none once the pod is gone."""
    patched: list[Object] = []
    try:
        if action.daemon_uid:
            # Before the gate: a gate is never True without the daemon pod it relies on named.
            patched.append(api.patch(path, {"metadata": {"annotations": {DAEMON_UID_ANNOTATION: action.daemon_uid}}}))
        if action.gate is not None:
            gate = action.gate
            patched.append(api.patch(f"{path}/status", {"status": {"conditions": [gate]}}, STRATEGIC_MERGE))
            log.info(
                "readiness gate",
                extra={"pod": action.pod, "node": action.node, "status": gate["status"], "reason": gate["reason"]},
            )
    except ApiError as error:
        if error.status != 404:
            raise
    return patched


def _budget_overcounts(snapshot: Snapshot) -> bool:
    """Whether the budget's status counts more healthy pods than it selects in the pass's view:
    what a recount after an earlier demotion missed (the controller's pod cache behind its own
    budget event) leaves. Counting fewer is safe (evictions wait) and the next pod event fixes it."""
    if snapshot.budget is None:
        return False
    selector = ((snapshot.budget.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    healthy = (snapshot.budget.get("status") or {}).get("currentHealthy")
    matching = [p for p in snapshot.engine_pods if selector and selector.items() <= PodView(p).labels.items()]
    return isinstance(healthy, int) and healthy > len(matching)


def _recount_budget(api: KubeApi, snapshot: Snapshot, now: datetime) -> None:
    """Makes the disruption controller count the budget's pods again. It recounts a budget when a
    pod that matches it changes, judged by the pod's new labels only, so a pod relabelled out of
    the budget (an active demoted after its successor's promotion, both active for a moment) leaves
    its count stale: it would go on counting two healthy actives and allow evicting the one that
    serves. Any change to the budget makes it recount: the annotation names the actives the pass
    left serving (not those it deleted), and when."""
    if snapshot.budget is None:
        return
    engines = (PodView(p) for p in snapshot.engine_pods)
    actives = ",".join(sorted(p.name for p in engines if p.role == "active" and not p.deleting))
    # The time makes each value new (an active promoted and demoted again between two recounts
    # would leave the names as they were, and the budget unchanged).
    value = f"{actives} ({now.isoformat(timespec='milliseconds')})"
    path = f"/apis/policy/v1/namespaces/{snapshot.namespace}/poddisruptionbudgets/{snapshot.budget['metadata']['name']}"
    try:
        snapshot.budget_applied(api.patch(path, {"metadata": {"annotations": {SERVING_ANNOTATION: value}}}))
    except ApiError as error:
        if error.status != 404:
            raise


def _replace_stale_holder(api: KubeApi, cache: WeightCache, snapshot: Snapshot, daemon_pod: str, now: datetime) -> None:
    """Node by node with a new GPU count: deletes the GPU holder pod of the node whose daemon is
    being replaced, if it books another number of GPUs (its DaemonSet is OnDelete), so the new
    daemon waits for a holder with the new count. Only here: the node's engines are drained and
    its daemon is going, so nothing uses the GPUs it un-books for a moment."""
    if not uses_gpu_holder(cache):
        return
    node = next((PodView(p).node for p in snapshot.daemon_pods if PodView(p).name == daemon_pod), None)
    for pod in snapshot.holder_pods:
        if node and PodView(pod).node == node and stale_holder(cache, pod):
            api.delete(f"/api/v1/namespaces/{snapshot.namespace}/pods/{PodView(pod).name}")
            snapshot.pod_deleted(PodView(pod).name, now)
            log.info("replacing gpu holder", extra={"pod": PodView(pod).name, "reason": "GPUs per node changed"})
