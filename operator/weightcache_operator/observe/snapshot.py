"""One observation of a cache per pass: what the API server holds for it, read once at the start.

Every decision of a pass reads this snapshot. What the pass itself changes (DaemonSets applied,
gates patched, engines relabelled, created or deleted) is written back into it from the API's
answers, so later steps of the same pass see their effect without listing again.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property, partial
from typing import Any

from weightcache_operator.kubeapi import ApiError, KubeApi
from weightcache_operator.objects import Object, PodView, spec_hash, stamp
from weightcache_operator.observe.engine_nodes import EngineNodes
from weightcache_operator.observe.failures import unready_nodes
from weightcache_operator.observe.node_index import NodeIndex
from weightcache_operator.observe.validation import parse, previous_status
from weightcache_operator.observe.watch_index import Watches, WatchIndex, version
from weightcache_operator.render.budget import budget_name
from weightcache_operator.render.gpu_holder import HOLDER_COMPONENT
from weightcache_operator.spec import GROUP, PLURAL, VERSION, WeightCache, WeightCacheStatus
from weightcache_operator.together import all_at_once
from weightcache_operator.vocabulary import CACHE_LABEL, COMPONENT_LABEL, SLOT_LABEL, SPEC_HASH_LABEL, CacheRef


def cache_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"


@dataclass
class Snapshot:
    body: Object
    """The WeightCache as read, status included."""
    cache: WeightCache | None
    """The parsed spec; None (with ``problems``) when it does not validate."""
    problems: list[str] = field(default_factory=list)
    nodes: list[Object] = field(default_factory=list)
    """Every node, as the operator's node watch last saw it (node_index.py: slim copies)."""
    daemonsets: list[Object] = field(default_factory=list)
    """The cache's DaemonSets: its daemons' and its GPU holder's."""
    daemon_pods: list[Object] = field(default_factory=list)
    engine_pods: list[Object] = field(default_factory=list)
    holder_pods: list[Object] = field(default_factory=list)
    service: Object | None = None
    """The live engine Service; None while there is none."""
    budget: Object | None = None
    """The live disruption budget over the serving engines; None while there is none."""
    seed_peers: Object | None = None
    """The live peers ConfigMap (render/seeding.py); None while there is none."""
    namespace_labels: dict[str, str] | None = None
    """The cache's namespace's labels (its Pod Security level); None when they could not be read."""
    watches: Watches | None = field(default=None, repr=False)
    """Told of every pod, DaemonSet, Service and budget the pass writes (watch_index.py: later
    passes read them from the watches only once these have delivered the writes)."""

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @cached_property
    def previous(self) -> WeightCacheStatus:
        """The status the cache held when the pass read it, typed (validation.previous_status):
        what conditions keep their transition times from, and the rollout goes on from."""
        return previous_status(self.body, self.cache)

    @property
    def daemon_daemonsets(self) -> list[Object]:
        """The daemons' DaemonSets (not the GPU holder's)."""
        return [ds for ds in self.daemonsets if (ds["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == "daemon"]

    @property
    def serving(self) -> str | None:
        """The daemon spec hash the live Service selects; None when there is no Service (yet)."""
        if self.service is None:
            return None
        return ((self.service.get("spec") or {}).get("selector") or {}).get(SPEC_HASH_LABEL)

    def unready_nodes(self) -> dict[str, datetime | None]:
        return unready_nodes(self.nodes)

    def ready_daemons(self, daemon_hash: str) -> dict[str, Object]:
        """Node → its Ready daemon pod holding ``daemon_hash``."""
        found: dict[str, Object] = {}
        for raw in self.daemon_pods:
            pod = PodView(raw)
            if pod.node and pod.ready and pod.spec_hash == daemon_hash:
                found[pod.node] = raw
        return found

    def ready_daemons_by_slot(self, daemon_hash: str, size: int) -> dict[int, dict[str, Object]]:
        """Slot → node → its Ready daemon pod holding ``daemon_hash``: where node rank ``k`` of an
        engine of ``size`` pods may run. With ``size`` 1 (no slot DaemonSets) slot 0 is every node."""
        if size == 1:
            ready = self.ready_daemons(daemon_hash)
            return {0: ready} if ready else {}
        by_slot: dict[int, dict[str, Object]] = {}
        for node, daemon in self.ready_daemons(daemon_hash).items():
            slot = (daemon["metadata"].get("labels") or {}).get(SLOT_LABEL, "")
            if slot.isdigit():
                by_slot.setdefault(int(slot), {})[node] = daemon
        return by_slot

    def daemonsets_of(self, daemon_hash: str) -> list[Object]:
        return [ds for ds in self.daemon_daemonsets if spec_hash(ds) == daemon_hash]

    # --- what the pass changed, as the API answered ----------------------------------------------

    def pod_changed(self, pod: Object) -> None:
        """A pod the pass patched or created, as the API returned it."""
        self._wrote("pods", pod)
        for pods in (self.engine_pods, self.daemon_pods, self.holder_pods):
            for i, old in enumerate(pods):
                if old["metadata"]["name"] == pod["metadata"]["name"]:
                    pods[i] = pod
                    return
        self.engine_pods.append(pod)

    def pod_deleted(self, name: str, now: datetime) -> None:
        """A pod the pass deleted: terminating from now on (its grace period runs)."""
        for pods in (self.engine_pods, self.daemon_pods, self.holder_pods):
            for i, old in enumerate(pods):
                if old["metadata"]["name"] == name:
                    self._wrote("pods", old, deleted=True)
                    if not old["metadata"].get("deletionTimestamp"):
                        pods[i] = {**old, "metadata": {**old["metadata"], "deletionTimestamp": stamp(now)}}

    def daemonset_applied(self, daemonset: Object) -> None:
        self._wrote("daemonsets", daemonset)
        self.daemonsets = [ds for ds in self.daemonsets if ds["metadata"]["name"] != daemonset["metadata"]["name"]]
        self.daemonsets.append(daemonset)

    def daemonset_deleted(self, name: str) -> None:
        for old in self.daemonsets:
            if old["metadata"]["name"] == name:
                self._wrote("daemonsets", old, deleted=True)
        self.daemonsets = [ds for ds in self.daemonsets if ds["metadata"]["name"] != name]

    def service_applied(self, service: Object) -> None:
        self._wrote("services", service)
        self.service = service

    def seed_peers_applied(self, configmap: Object) -> None:
        self.seed_peers = configmap

    def budget_applied(self, budget: Object) -> None:
        self._wrote("budgets", budget)
        self.budget = budget

    def _wrote(self, kind: str, obj: Object, deleted: bool = False) -> None:
        if self.watches is None:
            return
        index: WatchIndex = getattr(self.watches, kind)
        if deleted:
            index.deleting((self.namespace, self.name), obj)
        else:
            index.wrote((self.namespace, self.name), obj)


def observe(
    api: KubeApi,
    namespace: str,
    name: str,
    nodes: NodeIndex,
    engines: EngineNodes | None = None,
    reads: Executor | None = None,
    watches: Watches | None = None,
    watched: bool = False,
    counted: Callable[[str, str], None] | None = None,
) -> Snapshot | None:
    """The cache and everything of it the pass decides on; None when the cache is gone. Reads
    the cache and its namespace's labels from the API; its pods, DaemonSets, Services and
    disruption budget (all by the cache's label) from ``watches`` with ``watched``, each kind
    whose index holds every write of the cache's passes (watch_index.py), else from the API; all
    requests at once on ``reads``; the nodes from ``nodes``, after recording in ``engines`` where
    the cache's engine pods are (engine_nodes.py says why in that order). ``counted`` is told of
    each kind how it was read (kind, ``watch`` or ``list``)."""
    selector = f"{CACHE_LABEL}={name}"
    key = (namespace, name)
    ref = CacheRef(name, namespace, "")
    paths = {
        "pods": f"/api/v1/namespaces/{namespace}/pods",
        "daemonsets": f"/apis/apps/v1/namespaces/{namespace}/daemonsets",
        "services": f"/api/v1/namespaces/{namespace}/services",
        "budgets": f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
    }
    from_watch = {kind: getattr(watches, kind).view(key) if watches is not None and watched else None for kind in paths}

    def listed(path: str) -> tuple[list[Object], int]:
        answer = api.request("GET", path, params={"labelSelector": selector}, verb="LIST")
        return list(answer["items"]), version(answer)

    # Independent of each other, so sent together (together.py). The Services are read by label
    # because the one that serves is named in the spec, which is one of these answers. A cache
    # that is gone or not run wastes the other reads: rare.
    calls: dict[str, Callable[[], Any]] = dict(
        body=lambda: _get_if_exists(api, cache_path(namespace, name)),
        namespace_labels=lambda: _namespace_labels(api, namespace),
        seed_peers=lambda: _get_if_exists(api, f"/api/v1/namespaces/{namespace}/configmaps/{ref.seed_peers_name}"),
    )
    for kind, path in paths.items():
        if from_watch[kind] is None:
            calls[kind] = partial(listed, path)
    answers = all_at_once(reads, **calls)
    body: Object | None = answers["body"]
    if body is None:
        return None
    cache, problems = parse(body)
    snapshot = Snapshot(body, cache, problems, watches=watches)
    if cache is None or problems or body["metadata"].get("deletionTimestamp"):
        return snapshot  # nothing more is used for a spec that is not run
    seen: dict[str, list[Object]] = {}
    for kind in paths:
        held = from_watch[kind]
        if held is None:
            seen[kind], at = answers[kind]
            if watches is not None:
                getattr(watches, kind).listed(key, seen[kind], at)
        else:
            seen[kind] = held
        if counted is not None:
            counted(kind, "list" if held is None else "watch")
    all_pods = seen["pods"]

    def component(pod: Object) -> str | None:
        return (pod["metadata"].get("labels") or {}).get(COMPONENT_LABEL)

    snapshot.engine_pods = [p for p in all_pods if component(p) == "engine"]
    if engines is not None:
        engines.record(key, snapshot.engine_pods)
    snapshot.nodes = nodes.nodes()
    snapshot.namespace_labels = answers["namespace_labels"]
    snapshot.seed_peers = answers["seed_peers"]
    snapshot.daemonsets = seen["daemonsets"]
    snapshot.daemon_pods = [p for p in all_pods if component(p) == "daemon"]
    snapshot.holder_pods = [p for p in all_pods if component(p) == HOLDER_COMPONENT]
    serving_name = cache.spec.service.name or name
    snapshot.service = next((svc for svc in seen["services"] if svc["metadata"]["name"] == serving_name), None)
    budget = budget_name(ref)
    snapshot.budget = next((pdb for pdb in seen["budgets"] if pdb["metadata"]["name"] == budget), None)
    return snapshot


def _get_if_exists(api: KubeApi, path: str) -> Object | None:
    try:
        return api.get(path)
    except ApiError as error:
        if error.status != 404:
            raise
        return None


def _namespace_labels(api: KubeApi, namespace: str) -> dict[str, str] | None:
    """None when the operator may not read its namespace (RBAC of an older install): the Pod
    Security check is skipped then, as for a namespace without the label."""
    try:
        return dict(api.get(f"/api/v1/namespaces/{namespace}")["metadata"].get("labels") or {})
    except ApiError as error:
        if error.status in (403, 404):
            return None
        raise
