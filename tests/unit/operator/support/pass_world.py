"""A cache's world on the recording double of the API (recording_kube.py), run through the real
``Reconciler``: the scenes the write-order tests (``test_a_pass_that_*``) start from, and the
moves of the cluster's own controllers between passes (a DaemonSet's pods appear, a pod turns
Ready) that the double does not make by itself.

Requests of a pass that go out at once in the operator (together.py) go out one after another
here, in the order the pass hands them over, so a test can pin one order.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from builders import BASE, after, cache_of, condition, daemon, node
from recording_kube import RecordingKube
from weightcache_contract.daemon_report import HOST_DEVICE, DeviceMemory, RankReport
from weightcache_operator.objects import Object, PodView
from weightcache_operator.observe.daemon_status import DaemonReport, DaemonStatusReader, Fetch
from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.run.reconcile import PassResult, Reconciler
from weightcache_operator.vocabulary import CACHE_LABEL, COMPONENT_LABEL

CLOCK = after(600)
"""The operator's clock in every pass: ten minutes after the builders' NOW."""


class World:
    def __init__(
        self,
        body: Mapping[str, Any] = BASE,
        nodes: tuple[str, ...] = ("node-1", "node-2"),
        *,
        roomy: bool = False,
        fetch: Fetch | None = None,
    ) -> None:
        """``roomy``: the daemons have an address and report room for a second copy of their
        ranks (a generation change may go blue/green); ``fetch``: they have an address and report
        what it answers for their status URL; else they have none and report nothing."""
        self.api = RecordingKube()
        self.api.put("WeightCache", body)
        self.roomy = roomy or fetch is not None
        quiet = DaemonStatusReader(fetch=fetch or (_roomy if roomy else _no_report))
        self.now = CLOCK
        self._daemons: dict[str, int] = {}
        self.reconciler = Reconciler(self.api, clock=lambda: self.now, daemon_status=quiet, requests=None)
        self.last: PassResult | None = None
        for name in nodes:
            self.reconciler.nodes.put(node(name, labels={"pool": "gpu"}, ready=True))

    @property
    def body(self) -> Object:
        return self.api.stored("WeightCache", "tiny")

    def run(self, *, apply: bool = False) -> str | None:
        """One pass: ``apply`` as on a spec change or resync, else as on a pod event. Returns the
        phase it wrote (None: the cache is gone); ``last`` holds all the pass returned."""
        self._watch()
        self.last = self.reconciler.reconcile("ns", "tiny", apply=apply)
        return self.last.status.phase if self.last is not None else None

    def _watch(self) -> None:
        """The watches (handlers.py feeds the indexes so): every pod, DaemonSet, Service and
        budget as stored now, and every one gone since the last pass."""
        watches = self.reconciler.watches
        indexes = {
            "Pod": watches.pods,
            "DaemonSet": watches.daemonsets,
            "Service": watches.services,
            "PodDisruptionBudget": watches.budgets,
        }
        for kind, index in indexes.items():
            for name in self.api.names(kind):
                index.put(copy.deepcopy(self.api.stored(kind, name)))
        for kind, gone in self.api.removed:
            if kind in indexes:
                indexes[kind].remove(gone)
        self.api.removed.clear()

    def change_spec(self, **changes: Any) -> None:
        """The user edits the spec (dotted paths under ``spec``): a new generation."""
        body = copy.deepcopy(self.body)
        body.pop("status", None)
        for path, value in changes.items():
            *parents, leaf = path.split(".")
            here = body["spec"]
            for part in parents:
                here = here.setdefault(part, {})
            here[leaf] = value
        body["metadata"]["generation"] += 1
        body["status"] = self.body.get("status")
        self.api.put("WeightCache", body)

    def daemons_run(self, *, ready: bool = True) -> None:
        """The DaemonSet controller: each of the cache's DaemonSets counts every node and runs a
        daemon pod of its spec on each (an OnDelete DaemonSet keeps a pod that exists), Ready at
        once unless ``ready`` is False (still loading: ``loaded`` turns it Ready); and the garbage
        collector: the pods of a deleted DaemonSet go."""
        cache = cache_of(self.body)
        for name in self.api.names("Pod"):
            owners = self.api.stored("Pod", name)["metadata"].get("ownerReferences") or []
            if any(o["kind"] == "DaemonSet" and o["name"] not in self.api.names("DaemonSet") for o in owners):
                self.api.remove("Pod", name)
        for ds in [self.api.stored("DaemonSet", n) for n in self.api.names("DaemonSet")]:
            nodes = sorted(n["metadata"]["name"] for n in self.reconciler.nodes.nodes())
            ds["status"] = {"desiredNumberScheduled": len(nodes), "numberMisscheduled": 0}
            self.api.put("DaemonSet", ds)
            for name in nodes:
                pod_name = f"{ds['metadata']['name']}-{name}"
                if pod_name in self.api.names("Pod") and not self._deleting(pod_name):
                    continue
                self.api.remove("Pod", pod_name)
                pod = daemon(
                    pod_name,
                    node=name,
                    spec_hash=PodView(ds).spec_hash or daemon_spec_hash(cache),
                    uid=f"uid-{pod_name}-{self._started(pod_name)}",
                    ready=ready,
                    phase="Running",
                    ip=f"10.0.2.{name[-1]}" if self.roomy else None,
                )
                pod["metadata"]["labels"].update({CACHE_LABEL: "tiny", COMPONENT_LABEL: "daemon"})
                owner = {
                    "kind": "DaemonSet",
                    "name": ds["metadata"]["name"],
                    "uid": ds["metadata"]["uid"],
                    "controller": True,
                }
                pod["metadata"]["ownerReferences"] = [owner]
                self.api.put("Pod", pod)

    def _started(self, daemon_pod: str) -> int:
        """How many daemon pods of this name ran, this one included: a replacement's uid is new."""
        self._daemons[daemon_pod] = self._daemons.get(daemon_pod, 0) + 1
        return self._daemons[daemon_pod]

    def scheduled(self, name: str, node_name: str, *, ready: bool = True, ip: str = "10.0.0.1") -> None:
        """The scheduler and the kubelet: pod ``name`` runs on ``node_name``, Ready or not."""
        pod = self.api.stored("Pod", name)
        pod["spec"]["nodeName"] = node_name
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] != "Ready"]
        pod["status"] = {
            **(pod.get("status") or {}),
            "phase": "Running",
            "podIP": ip,
            "conditions": [*conditions, condition("Ready", ready)],
        }
        pod["metadata"].setdefault("creationTimestamp", "2026-11-29T10:00:00Z")
        self.api.put("Pod", pod)

    def later(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def placed(self, *, ready: bool = True) -> None:
        """The scheduler places every engine pod not yet on a node on the first node it is pinned
        to (render/layout.py ``pin_to_nodes``), and the kubelet runs it."""
        for name in self.engines():
            pod = self.api.stored("Pod", name)
            if pod["spec"].get("nodeName"):
                continue
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            pins = [e for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]]
            where = next(e["values"][0] for e in pins if e["key"] == "kubernetes.io/hostname")
            self.scheduled(name, where, ready=ready, ip=f"10.0.1.{name[-1]}")

    def ready(self, name: str, ready: bool = True) -> None:
        pod = self.api.stored("Pod", name)
        kept = [c for c in pod["status"].get("conditions") or [] if c["type"] != "Ready"]
        pod["status"]["conditions"] = [*kept, condition("Ready", ready)]
        self.api.put("Pod", pod)

    def engines(self) -> list[str]:
        """The live engine pods' names."""
        return [
            n
            for n in self.api.names("Pod")
            if self.api.stored("Pod", n)["metadata"]["labels"].get(COMPONENT_LABEL) == "engine"
            and not self._deleting(n)
        ]

    def loaded(self) -> None:
        """Every live pod that is not Ready yet (a daemon loading, an engine starting) turns Ready."""
        for name in self.api.names("Pod"):
            if not self._deleting(name) and not PodView(self.api.stored("Pod", name)).ready:
                self.ready(name)

    def role(self, name: str) -> str | None:
        return PodView(self.api.stored("Pod", name)).role

    def terminated(self) -> None:
        """Every terminating pod finished its grace period."""
        for name in self.api.names("Pod"):
            if self._deleting(name):
                self.api.remove("Pod", name)

    def _deleting(self, name: str) -> bool:
        return bool(self.api.stored("Pod", name)["metadata"].get("deletionTimestamp"))


def serving(world: World) -> World:
    """``world`` moved to a serving cache: daemons Ready on every node, one Ready active engine
    on node-1 and one Ready standby on node-2, gates granted, status written; no write recorded."""
    world.run(apply=True)
    world.daemons_run()
    world.run()
    for name, node_name in zip(sorted(world.engines()), ("node-1", "node-2")):
        world.scheduled(name, node_name, ip=f"10.0.0.{node_name[-1]}")
    world.run()
    world.run()
    world.api.forget_writes()
    return world


def _roomy(url: str, timeout_s: float) -> DaemonReport:
    """Both ranks of BASE's model loaded in host memory, with a terabyte free next to them."""
    return DaemonReport(
        cache="tiny",
        ready=True,
        ranks=[RankReport(rank=r, ready=True, bytes=1 << 20) for r in (0, 1)],
        memory=[DeviceMemory(device=HOST_DEVICE, free_bytes=1 << 40)],
    )


def _no_report(url: str, timeout_s: float) -> DaemonReport:
    raise OSError(f"{url}: no daemon answers in unit tests")
