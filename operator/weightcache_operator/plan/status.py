"""Status aggregation: daemon pods + engine pods (as read from the API server) and the daemon
pods' own reports (daemon_status.py) → the typed ``WeightCacheStatus`` a pass starts from
(status_reports.py adds what the other rooms report to it).

Pure: the caller passes the clock, the previous conditions and the fetched reports, so a
condition's ``lastTransitionTime`` changes only when its status does, and tests need no API
server and no daemon. Each part is built with exactly the fields it writes: ``wire()`` writes
the fields that were set, so a field left out here is one the merge patch leaves as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from weightcache_contract.daemon_report import DaemonReport
from weightcache_contract.plan_summary import PLAN_CONTAINER, PlanSummary

from weightcache_operator.objects import Object, PodView, truncated
from weightcache_operator.observe import checkpoint_watch
from weightcache_operator.plan.engine_units import units
from weightcache_operator.plan.reasons import Reason, common_refusal, engine_reasons, grouped, node_reason, statuses
from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.spec import (
    ArtifactStatus,
    CheckpointReloadStatus,
    Condition,
    ConditionStatus,
    EngineStatus,
    NodeStatus,
    Phase,
    PlanStatus,
    RankStatus,
    WeightCache,
    WeightCacheStatus,
)
from weightcache_operator.vocabulary import SLOT_LABEL, local_ranks, served_model_name

__all__ = [
    "ChangeUnderWay",
    "Observed",
    "aggregate",
    "crash_looping",
    "daemon_pod_current",
    "invalid_status",
    "plan_status",
    "status_condition",
]


def daemon_pod_current(pod: Object, spec_hash: str) -> bool:
    """A daemon pod an engine may rely on: Ready and running the expected daemon spec."""
    view = PodView(pod)
    return view.ready and view.spec_hash == spec_hash


def crash_looping(pod: Object) -> str | None:
    """The name of a container in CrashLoopBackOff, if any."""
    for status in statuses(pod):
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff":
            return str(status.get("name"))
    return None


@dataclass(frozen=True)
class ChangeUnderWay:
    """A daemon generation change the rollout reports under way (``rollout.status.change_under_way``):
    from the Service's first new-generation engine to the last replica whole again on the new one."""

    strategy: str
    """``BlueGreen`` or ``NodeByNode`` as recorded on the new generation's DaemonSet; ``Unrecorded``
    when none records one."""
    why: str
    """Why that strategy (the DaemonSet's reason annotation)."""
    step: str
    """The rollout's current step."""
    updated: int
    total: int
    stalled: str | None = None
    """Why the change stalled, when it did."""


@dataclass
class Observed:
    """What the operator saw in one pass."""

    daemon_pods: list[Object] = field(default_factory=list)
    engine_pods: list[Object] = field(default_factory=list)
    desired_nodes: int = 0
    """``DaemonSet.status.desiredNumberScheduled``: the nodes the placement selects."""
    problems: list[str] = field(default_factory=list)
    """Validation messages; non-empty means the spec is not run at all."""
    daemon_reports: dict[str, DaemonReport | str] = field(default_factory=dict)
    """Daemon pod name → its status endpoint's report, or why it could not be read."""
    stranded: list[str] = field(default_factory=list)
    """Replicas whose active engine failed with no Ready standby to take over (failover.py)."""
    holder_pods: list[Object] = field(default_factory=list)
    """The cache's GPU holder pods (GPU backends): a holder that exited is why its node's daemon waits."""
    change: ChangeUnderWay | None = None
    """The daemon generation change under way, if any: while engines serve through it the cache
    is Ready, and ``GenerationChange`` says what changes."""


def status_condition(
    kind: str,
    status: bool | str,
    reason: str,
    message: str,
    now: datetime,
    previous: Sequence[Condition] | None,
    observed_generation: int | None,
) -> Condition:
    """A status condition in the Kubernetes convention (as objects.condition for other objects):
    its ``lastTransitionTime`` kept from the one of its type in ``previous`` (the status the pass
    read) unless its status changed."""
    # A string is checked against ConditionStatus when Condition validates it.
    text = cast(ConditionStatus, status if isinstance(status, str) else "True" if status else "False")
    before = next((c for c in previous or () if c.type == kind), None)
    since = before.last_transition_time if before is not None and before.status == text else None
    return Condition(
        type=kind,
        status=text,
        reason=reason,
        message=message,
        last_transition_time=since or truncated(now),
        observed_generation=observed_generation,
    )


def aggregate(
    cache: WeightCache, observed: Observed, now: datetime, previous: Sequence[Condition] | None = None
) -> WeightCacheStatus:
    """The ``status`` the pass starts from (everything except what kopf keeps under its own key)."""
    observed_generation = cache.metadata.get("generation")
    spec_hash = daemon_spec_hash(cache)

    def condition(kind: str, ok: bool | str, reason: str, message: str) -> Condition:
        return status_condition(kind, ok, reason, message, now, previous, observed_generation)

    base = WeightCacheStatus(
        observed_generation=observed_generation,
        daemon_spec_hash=spec_hash,
        model=_model_line(cache),
        served_model_name=served_model_name(cache),
    )
    if observed.problems:
        return invalid_status(observed_generation, observed.problems, now, previous, base)

    nodes: list[NodeStatus] = []
    ready_nodes = 0
    # One entry per node (the list is keyed by node): while a daemon pod is being replaced its
    # terminating predecessor may still be listed next to it, and during a blue/green change the
    # old generation's daemon runs next to the new one; the live, current one speaks for the node.
    by_node: dict[str, Object] = {}

    def speaks_for_node(pod: Object) -> tuple[bool, bool]:
        view = PodView(pod)
        return not view.deleting, view.spec_hash == spec_hash

    for pod in sorted(observed.daemon_pods, key=speaks_for_node):
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            by_node[node] = pod
    holders = {
        (p.get("spec") or {}).get("nodeName"): p
        for p in observed.holder_pods
        if not p["metadata"].get("deletionTimestamp")
    }
    reasons: dict[str, Reason] = {}
    current_reports: dict[str, DaemonReport | str | None] = {}
    for node, pod in sorted(by_node.items()):
        current = daemon_pod_current(pod, spec_hash)
        ready_nodes += current
        slot = (pod["metadata"].get("labels") or {}).get(SLOT_LABEL, "0")
        ranks = local_ranks(cache, int(slot) if slot.isdigit() else 0)
        report = observed.daemon_reports.get(pod["metadata"]["name"])
        nodes.append(_node_entry(node, pod["metadata"]["name"], ranks, current, report))
        # Only a pod of this generation speaks for this spec (an old one's crash is not this spec's).
        of_spec = PodView(pod).spec_hash == spec_hash
        if of_spec:
            current_reports[node] = report
        if of_spec and not current and (why := node_reason(pod, holders.get(node), report)) is not None:
            reasons[node] = why

    plan = plan_status([p for _, p in sorted(by_node.items()) if PodView(p).spec_hash == spec_hash])
    replicas = cache.spec.engine.replicas
    standbys_per = cache.spec.engine.standbys_per_replica
    engines: list[EngineStatus] = []
    active_ready = standby_ready = 0
    for replica in range(replicas):
        # An engine is a unit: one pod, or with parallelism.nodes > 1 a group named by its leader.
        mine = [u for u in units(observed.engine_pods, cache.spec.parallelism.nodes) if u.replica == str(replica)]
        actives = sorted(u.name for u in mine if u.role == "active" and not u.deleting)
        standbys = sorted(u.name for u in mine if u.role == "standby" and not u.deleting)
        active_ready += min(1, sum(u.ready for u in mine if u.role == "active"))
        standby_ready += min(standbys_per, sum(u.ready for u in mine if u.role == "standby"))
        engines.append(EngineStatus(replica=replica, active=actives[0] if actives else None, standbys=standbys))

    desired = observed.desired_nodes
    daemons_ok = desired > 0 and ready_nodes >= desired
    engines_ok = active_ready == replicas and standby_ready == replicas * standbys_per
    available = replicas > 0 and active_ready == replicas
    looping = [
        f"{p['metadata']['name']}/{c}"
        for p in [*observed.daemon_pods, *observed.engine_pods, *observed.holder_pods]
        if (c := crash_looping(p))
    ]
    # Every node refusing the spec for one reason: waiting will not help. Failed, unless engines
    # (of the previous generation) still serve: then Degraded.
    refused = None if daemons_ok else common_refusal(reasons, desired)
    failing_engines = {} if engines_ok else engine_reasons(observed.engine_pods)

    if desired == 0:
        daemons_reason, daemons_msg = "NoNodesSelected", "no node matches spec.placement"
    elif daemons_ok:
        daemons_reason, daemons_msg = "AllNodesReady", f"{ready_nodes}/{desired} nodes hold every local rank"
    else:
        failing = any(r.exited for r in reasons.values())
        daemons_reason = "Refused" if refused else "DaemonsFailing" if failing else "Loading"
        daemons_msg = f"{ready_nodes}/{desired} nodes ready" + (f"; {grouped(reasons)}" if reasons else "")
    engines_msg = (
        f"{active_ready}/{replicas} active and {standby_ready}/{replicas * standbys_per} standby engines ready"
    )
    engines_reason = "AllEnginesReady" if engines_ok else "EnginesFailing" if failing_engines else "EnginesStarting"
    engines_detail = engines_msg + (f"; {grouped(failing_engines)}" if failing_engines else "")

    # The phase says whether the cache serves: while the Service has a Ready active for every
    # replica it is Ready, whatever else moves (new daemons and engines of a generation change next
    # to the serving ones, a standby replacing one promoted by a failover, an engine rollout's
    # surge): DaemonsReady, EnginesReady and GenerationChange say what. Failures still make it
    # Degraded or Failed below.
    phase: Phase
    if refused and not available:
        phase = "Failed"
    elif refused or looping or observed.stranded:
        phase = "Degraded"
    elif (daemons_ok and engines_ok) or available:
        phase = "Ready"
    elif observed.daemon_pods or observed.engine_pods:
        phase = "Loading"
    else:
        phase = "Pending"

    degraded = _degraded(looping, observed.stranded, refused, {**reasons, **failing_engines}, serving=available)
    recorded = cache.status.checkpoint_reload if cache.status is not None else None
    record_before = recorded.model_dump(by_alias=True, exclude_none=True, mode="json") if recorded else None
    watched = checkpoint_watch.observe(current_reports)
    reload = checkpoint_watch.reload_record(watched, cache.spec.model.on_change, record_before, now)
    changed = checkpoint_watch.condition_fields(watched, cache.spec.model.on_change, reload)
    change_condition = _generation_change(observed, spec_hash, previous)
    return base.model_copy(
        update={
            "phase": phase,
            # One line for `kubectl get wc`: what is wrong, else what the daemons are waiting for.
            "message": degraded[1]
            if degraded[0] != "Healthy"
            else grouped(reasons)
            or (changed[2] if changed[0] == "True" else None)
            or (change_condition[2] if change_condition and change_condition[0] else None),
            "nodes": nodes,
            # Always written: null (a merge patch's delete) until the current generation's plan passed.
            "plan": plan,
            # Kept once written: it is part of the generation (layout.daemon_spec_hash).
            **({"checkpoint_reload": CheckpointReloadStatus.model_validate(reload)} if reload is not None else {}),
            "engines": engines,
            # Always written: null (a merge patch's delete) once no change is under way.
            "generation_change": observed.change.strategy if observed.change is not None else None,
            "ready_nodes": f"{ready_nodes}/{desired}",
            "active_engines": active_ready,
            "standby_engines": standby_ready,
            "conditions": [
                condition("DaemonsReady", daemons_ok, daemons_reason, daemons_msg),
                condition("EnginesReady", engines_ok, engines_reason, engines_detail),
                condition("Available", available, "ActiveEnginesReady" if available else "NoActiveEngine", engines_msg),
                condition(
                    "Progressing",
                    not (daemons_ok and engines_ok),
                    "Reconciling" if not (daemons_ok and engines_ok) else "Converged",
                    f"daemons: {daemons_msg}; engines: {engines_msg}",
                ),
                condition("Degraded", degraded[0] != "Healthy", *degraded),
                condition(checkpoint_watch.CONDITION, *changed),
                *([condition("GenerationChange", *change_condition)] if change_condition else []),
            ],
        }
    )


def _generation_change(
    observed: Observed, spec_hash: str, previous: Sequence[Condition] | None
) -> tuple[bool, str, str] | None:
    """(status, reason, message) of ``GenerationChange``: True with the strategy as reason while a
    change is under way, its message the old → new generations and how far the replicas are;
    False (``Converged``) after one; None before the first (the condition appears with it)."""
    change = observed.change
    if change is None:
        if any(c.type == "GenerationChange" for c in previous or ()):
            return False, "Converged", "every daemon and engine is of the current generation"
        return None
    old = sorted(
        {h for p in [*observed.daemon_pods, *observed.engine_pods] if (h := PodView(p).spec_hash) and h != spec_hash}
    )
    origin = ", ".join(h[:10] for h in old) if old else "the previous generation (gone)"
    message = (
        f"daemon generation {origin} -> {spec_hash[:10]}: {change.updated}/{change.total} replicas whole on the new "
        f"one; {change.step or 'starting'}"
        + (f"; stalled: {change.stalled}" if change.stalled else "")
        + (f" ({change.strategy}: {change.why})" if change.why else "")
    )
    return True, change.strategy, message[:32768]


def plan_status(daemon_pods: list[Object]) -> PlanStatus | None:
    """``status.plan``: the summary the first of ``daemon_pods`` (one generation's, in node order)
    whose ``plan`` init container passed left as its termination message; None before any did."""
    for pod in daemon_pods:
        for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
            ended = (status.get("state") or {}).get("terminated") or {}
            if status.get("name") != PLAN_CONTAINER or ended.get("exitCode") != 0:
                continue
            try:
                summary = PlanSummary.model_validate_json(ended.get("message") or "")
            except ValueError:
                continue  # an older image's plan, or a cut message: the next pod may say it
            optional: dict[str, Any] = {
                "node": (pod.get("spec") or {}).get("nodeName"),
                "node_bytes": summary.node_bytes,
                "limit_bytes": summary.limit_bytes,
                "limit": (summary.limit or "")[:1024] or None,
            }
            # Only what is known is set: an unknown limit is left out, not written as null.
            return PlanStatus(
                ranks=summary.ranks,
                max_rank_bytes=summary.max_rank_bytes,
                total_bytes=summary.total_bytes,
                **{k: v for k, v in optional.items() if v is not None},
            )
    return None


def _degraded(
    looping: list[str], stranded: list[str], refused: str | None, reasons: dict[str, Reason], serving: bool
) -> tuple[str, str]:
    """Reason and message of the Degraded condition: a spec every node refuses first (nothing
    will run until it changes), then a failover that found no Ready standby (what a user of the
    Service notices), then crash loops — with what the crashed processes said."""
    if refused:
        kept = "; the previous generation's engines still serve" if serving else ""
        return "Refused", f"every node refuses this spec: {refused}{kept}"
    if stranded:
        return "NoReadyStandby", "; ".join(stranded)
    if looping:
        said = {node: r for node, r in reasons.items() if r.exited}
        return "CrashLoop", f"crash-looping containers: {', '.join(looping)}" + (f"; {grouped(said)}" if said else "")
    return "Healthy", "no container is crash-looping and every failed active had a standby"


def _node_entry(node: str, pod: str, ranks: list[int], current: bool, report: DaemonReport | str | None) -> NodeStatus:
    """A node's ranks: ready only while the pod is current *and* the daemon says so; bytes, load
    time, GPU and fingerprint from the daemon's report when there is one."""
    reported = {r.rank: r for r in report.ranks} if isinstance(report, DaemonReport) else {}
    entries: list[RankStatus] = []
    for rank in ranks:
        seen = reported.get(rank)
        if seen is None:
            entries.append(RankStatus(rank=rank, ready=current))
            continue
        facts: dict[str, Any] = {
            "bytes": seen.bytes,
            "load_seconds": seen.load_seconds,
            "gpu_uuid": seen.gpu_uuid,
            "source": seen.source,
            "disk_bytes_read": seen.disk_bytes_read,
        }
        if seen.seed is not None:
            # Set when the rank asked peers: served by one, or fallen back to the disk.
            facts |= {"seed_peer": seen.seed.peer, "seed_bytes": seen.seed.bytes, "seed_seconds": seen.seed.seconds}
        entries.append(
            RankStatus(rank=rank, ready=current and seen.ready, **{k: v for k, v in facts.items() if v is not None})
        )
    extra: dict[str, Any] = {}
    if isinstance(report, DaemonReport) and report.fingerprint:
        extra["fingerprint"] = report.fingerprint
    if isinstance(report, DaemonReport) and report.artifacts is not None:
        seen_artifacts = report.artifacts
        extra["artifacts"] = ArtifactStatus(
            hits=seen_artifacts.hits,
            misses=seen_artifacts.misses,
            published=seen_artifacts.published,
            entries=seen_artifacts.entries,
            bytes=seen_artifacts.bytes,
            **({"problem": seen_artifacts.problem[:1024]} if seen_artifacts.problem else {}),
        )
    elif isinstance(report, str):
        extra["report_error"] = report[:1024]
    return NodeStatus(node=node, daemon_pod=pod, ranks=entries, **extra)


def invalid_status(
    observed_generation: int | None,
    problems: list[str],
    now: datetime,
    previous: Sequence[Condition] | None = None,
    base: WeightCacheStatus | None = None,
    reason: str = "InvalidSpec",
) -> WeightCacheStatus:
    """Phase Failed with ``Degraded``/``reason`` saying what to fix. Takes no parsed spec,
    so it also serves objects the models cannot parse at all."""
    message = "; ".join(problems)
    failed = WeightCacheStatus(
        observed_generation=observed_generation,
        phase="Failed",
        message=message,
        conditions=[
            status_condition(kind, status, reason, message, now, previous, observed_generation)
            for kind, status in (
                ("DaemonsReady", False),
                ("EnginesReady", False),
                ("Available", False),
                ("Progressing", False),
                ("Degraded", True),
            )
        ],
        generation_change=None,
        ready_nodes="0/0",
        active_engines=0,
        standby_engines=0,
    )
    return failed if base is None else base.merged(failed)


def _model_line(cache: WeightCache) -> str:
    source = cache.spec.model.source
    where = f"hostPath:{source.host_path.path}" if source.host_path else ""
    if source.pvc is not None:  # the spec allows exactly one of the two
        where = f"pvc:{source.pvc.claim_name}" + (f"/{source.pvc.sub_path}" if source.pvc.sub_path else "")
    return f"{where}@{cache.spec.model.revision}" if cache.spec.model.revision else where
