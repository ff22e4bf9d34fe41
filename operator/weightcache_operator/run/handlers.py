"""kopf registrations: *when* a reconciliation pass runs. *What* a pass does is in reconcile.py.

- create / update / resume of a WeightCache, and a periodic resync timer: a full pass
  (server-side apply of the DaemonSet and Service, engines, readiness gates, status);
- any event of a pod labelled ``weightcache.io/cache``: a pass without the applies, which
  recreates deleted engines, promotes standbys and flips readiness gates within one watch event
  (its arrival, and a node event's, is the operator's first sight of a failure: sightings.py);
- a node's Ready condition changing: a pass (without the applies) for every cache with an engine
  on it, so a node that goes NotReady fails its active engines over at once, before the node
  lifecycle controller gets round to marking their pods not ready; and a node's cordon (set or
  lifted: ``spec.unschedulable``), so the actives of a node being drained hand over first;
- deletion: the finalizer kopf adds for the delete handler stays until every pod is gone.

Two replicas: kopf peering says which one acts (a kopf daemon per cache, ``acting``, lives only
there), and a lease on the peering object (handover.py) makes sure the other has stopped writing
before it starts: every pass, alarm, probe wake-up and finalization runs only for a cache this
replica acts for and only while it holds the lease.

Besides these, a pass that keeps an engine's readiness gate through a daemon outage asks for one
more pass when the grace ends (``Reconciler.alarms``, a timer per cache): nothing else would
announce that moment, and polling for it is what the watches are there to avoid. The operator's
own engine probes (``Reconciler.responsiveness``) wake a pass the same way. Both run outside
kopf, so a kopf daemon per cache (``acting``) tells the reconciler while this replica acts for
the cache: kopf stops daemons when peering pauses the operator, and a paused replica's timers and
probes must not run passes next to the replica that took over.

Invalid specs never raise: they become a ``Degraded``/``InvalidSpec`` condition, so kopf does not
retry them in a loop. Transient API errors raise ``kopf.TemporaryError`` and are retried later.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import zlib
from typing import Any

import kopf
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.readonly_http import ReadOnlyServer

from weightcache_operator.act.metrics import metrics_server
from weightcache_operator.kubeapi import ApiError, KubeApi
from weightcache_operator.objects import conditions_ready
from weightcache_operator.observe.watch_index import WatchIndex
from weightcache_operator.render import CACHE_LABEL
from weightcache_operator.run.reconcile import Reconciler, StillTerminating
from weightcache_operator.settings import current
from weightcache_operator.spec import GROUP, PLURAL, VERSION

SETTINGS = current()
"""Read when kopf imports the handlers (the resync timer's interval is part of its registration);
``python -m weightcache_operator`` has checked them already and exits on a bad one."""

_state: dict[str, Reconciler] = {}
_servers: dict[str, ReadOnlyServer] = {}


def reconciler() -> Reconciler:
    if "r" not in _state:
        _state["r"] = Reconciler(KubeApi.load())
    return _state["r"]


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Peering: replicas see each other through a ClusterKopfPeering object (its CRD: crds/kopf-peering.yaml;
    # the object: the chart's templates/peering.yaml, one per release; cluster-scoped in either install scope)
    # and only the highest priority one handles events, so two replicas never fight.
    settings.peering.name = SETTINGS.peering
    settings.peering.mandatory = True
    settings.peering.clusterwide = True
    settings.peering.priority = _priority(SETTINGS.priority)
    settings.peering.lifetime = SETTINGS.peering_lifetime
    identity = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
    reconciler().hand_over(SETTINGS.peering, identity, float(SETTINGS.peering_lifetime))
    # kopf's own bookkeeping goes to annotations: the CRD's status schema is closed, so a
    # status.kopf field would be pruned by the API server.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="weightcache.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="weightcache.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "weightcache.io/cleanup"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    settings.batching.error_delays = [1, 2, 5, 10, 30]
    # Passes run in kopf's handler threads. Its default pool (Python's: host CPUs + 4, up to 32)
    # would size the operator's concurrency by whatever node it lands on; with 500 nodes and an
    # API server on two cores, 20 threads instead of 6 made a quarter of the passes take over a
    # second (docs/benchmarks.md, scale).
    settings.execution.max_workers = SETTINGS.pass_threads
    # Every replica serves /metrics (a paused one shows no passes), bound before any pass runs.
    if "metrics" not in _servers:
        try:
            _servers["metrics"] = metrics_server(reconciler().metrics, SETTINGS.metrics)
        except WeightCacheError as error:  # a bad address or a taken port: retrying will not help
            raise kopf.PermanentError(str(error)) from error
        _servers["metrics"].start()


@kopf.on.cleanup()
def shut_down(**_: Any) -> None:
    handover = reconciler().handover
    if handover is not None:
        handover.stop()  # the next replica need not wait out the lease
    reconciler().events.close(timeout=5)  # what the last passes told still reaches the API server
    server = _servers.pop("metrics", None)
    if server is not None:
        server.stop()


def _priority(text: str) -> int:
    """Replicas must have distinct priorities (equal ones all pause, as a conflict): an integer
    as given, any other text (the pod's uid) hashed, nothing → random."""
    if text.strip().isdigit():
        return int(text)
    return zlib.crc32(text.encode()) % 1_000_000 + 1 if text else random.randint(1, 1_000_000)


def _ns(namespace: str | None) -> str:
    """WeightCaches and pods are namespaced: kopf always names the namespace of their events."""
    if namespace is None:
        raise kopf.PermanentError("a namespaced object came without its namespace")
    return namespace


def _run(namespace: str | None, name: str, apply: bool) -> None:
    try:
        reconciler().reconcile(_ns(namespace), name, apply=apply)
    except ApiError as error:
        raise kopf.TemporaryError(f"API error: {error}", delay=2) from error


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def on_change(namespace: str | None, name: str, **_: Any) -> None:
    _run(namespace, name, apply=True)


@kopf.timer(GROUP, VERSION, PLURAL, interval=SETTINGS.resync_seconds, initial_delay=SETTINGS.resync_seconds)
def resync(namespace: str | None, name: str, meta: kopf.Meta, **_: Any) -> None:
    if not meta.get("deletionTimestamp"):
        _run(namespace, name, apply=True)


def _fed(index: WatchIndex, body: kopf.Body, type: str | None) -> None:
    """One watch event into ``index`` (watch_index.py). kopf calls no index handler for a
    deletion, so the event handlers remove deleted objects."""
    if type == "DELETED":
        index.remove(dict(body))
    elif type is None:
        index.relisted()  # a watch (re)started: deletions from its gap are unknown


@kopf.index("", "v1", "pods", labels={CACHE_LABEL: kopf.PRESENT})
def pod_index(body: kopf.Body, **_: Any) -> None:
    """Feeds the reconciler's pod index (watch_index.py) from the pod watch, from the initial
    listing on, as ``node_index`` does for nodes; ``on_pod`` removes deleted pods."""
    reconciler().watches.pods.put(dict(body))


@kopf.on.event("", "v1", "pods", labels={CACHE_LABEL: kopf.PRESENT})
def on_pod(namespace: str | None, labels: kopf.Labels, body: kopf.Body, type: str | None, **_: Any) -> None:
    _fed(reconciler().watches.pods, body, type)  # a deletion before the pass it triggers
    # The event's arrival, before any wait for a running pass: what failover detection is timed from.
    reconciler().sightings.pod_event((_ns(namespace), labels[CACHE_LABEL]), dict(body), reconciler().clock())
    try:
        reconciler().reconcile(_ns(namespace), labels[CACHE_LABEL], apply=False)
    except ApiError as error:
        # Event handlers are not retried by kopf; the next pod event or the resync timer will be.
        logging.getLogger(__name__).warning("pass after pod event failed", extra={"error": str(error)})


# The cache's DaemonSets, Services and budget: only fed into their indexes (no pass follows
# their events; passes that write them fold their writes in, watch_index.py).


@kopf.index("apps", "v1", "daemonsets", labels={CACHE_LABEL: kopf.PRESENT})
def daemonset_index(body: kopf.Body, **_: Any) -> None:
    reconciler().watches.daemonsets.put(dict(body))


@kopf.on.event("apps", "v1", "daemonsets", labels={CACHE_LABEL: kopf.PRESENT})
def on_daemonset(body: kopf.Body, type: str | None, **_: Any) -> None:
    _fed(reconciler().watches.daemonsets, body, type)


@kopf.index("", "v1", "services", labels={CACHE_LABEL: kopf.PRESENT})
def service_index(body: kopf.Body, **_: Any) -> None:
    reconciler().watches.services.put(dict(body))


@kopf.on.event("", "v1", "services", labels={CACHE_LABEL: kopf.PRESENT})
def on_service(body: kopf.Body, type: str | None, **_: Any) -> None:
    _fed(reconciler().watches.services, body, type)


@kopf.index("policy", "v1", "poddisruptionbudgets", labels={CACHE_LABEL: kopf.PRESENT})
def budget_index(body: kopf.Body, **_: Any) -> None:
    reconciler().watches.budgets.put(dict(body))


@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels={CACHE_LABEL: kopf.PRESENT})
def on_budget(body: kopf.Body, type: str | None, **_: Any) -> None:
    _fed(reconciler().watches.budgets, body, type)


@kopf.index("", "v1", "nodes")
def node_index(body: kopf.Body, **_: Any) -> None:
    """Feeds the reconciler's node index (node_index.py) from the node watch. Being a kopf index,
    it is filled from the initial node listing before kopf runs any handler, so no pass sees a
    partial fleet. Returns nothing: kopf's own index stays empty, the reconciler's is read."""
    reconciler().nodes.put(dict(body))


_node_state: dict[str, tuple[bool, bool]] = {}
"""Node name → (Ready, cordoned) as last seen."""


@kopf.on.event("", "v1", "nodes")
def on_node(name: str, status: kopf.Status, spec: kopf.Spec, type: str | None, **_: Any) -> None:
    """Acts only when Ready or ``spec.unschedulable`` flips (or a node is first seen not Ready or
    cordoned, as after an operator restart): nodes post status every few seconds, and those
    heartbeats change nothing here. A cordon is how ``kubectl drain`` starts: the actives there
    hand over before the drain can evict them."""
    arrived = reconciler().clock()
    if type == "DELETED":
        reconciler().nodes.remove(name)
        _node_state.pop(name, None)
        state = (False, False)
    else:
        state = (conditions_ready(status.get("conditions")), bool(spec.get("unschedulable")))
    before = _node_state.get(name)
    _node_state[name] = state
    reconciler().sightings.node_event(name, None if type == "DELETED" else state[0], arrived)
    if before == state or (before is None and state == (True, False)):
        return
    for namespace, cache in reconciler().caches_on_node(name, list(SETTINGS.namespaces)):
        try:
            reconciler().reconcile(namespace, cache, apply=False)
        except ApiError as error:
            logging.getLogger(__name__).warning(
                "pass after node event failed", extra={"node": name, "error": str(error)}
            )


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def acting(namespace: str | None, name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Lives while this replica acts for the cache: until the cache is deleted or peering pauses
    the operator (kopf stops daemons then, and starts them again on resuming). Async, so it holds
    no thread of kopf's executor while it waits."""
    key = (_ns(namespace), name)
    reconciler().acting(key, True)
    try:
        await stopped.wait()
    finally:
        reconciler().acting(key, False)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def on_delete(namespace: str | None, name: str, **_: Any) -> None:
    try:
        reconciler().finalize(_ns(namespace), name)
    except StillTerminating as waiting:
        raise kopf.TemporaryError(str(waiting), delay=1) from waiting
    except ApiError as error:
        raise kopf.TemporaryError(f"API error: {error}", delay=2) from error
