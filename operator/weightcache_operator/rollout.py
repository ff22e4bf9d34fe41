"""Rollout decisions: observed pods + the desired versions → what to do next. Pure.

Engines are units (engine_units.py): one pod, or a group of ``parallelism.nodes`` pods — a
single-pod engine is a group of one. The rollout's steps and its report (which replicas are
done, the stall, the phase, the generation the Service selects) are decided over one view per
unit, alike for every size; the steps name units by their head pod and apply to all its pods.

Two kinds of change reach running engines:

- **Engine rollout** (the engine template changed, the daemons did not): up to ``maxSurge``
  replicas roll at once (default 1: one at a time). For each replica whose turn it is, a
  new-version standby is started next to the old pods (a *surge* pod, hidden from the ordinary
  scaling logic so it is not trimmed as an extra standby); once it is Ready it is relabelled
  active and the old active is deleted with its grace period (the engine drains on SIGTERM), then
  the old standbys go and new ones are created. Both versions map the same daemon arena, so
  briefly having two actives behind the Service mixes nothing. A replica is done when no old pod
  is left (terminating ones included) and its new active and standbys are Ready; only then does
  the next replica take its place.
- **Generation change** (what the daemons hold changed: ``daemon_spec_hash``), one of two ways,
  chosen once when the change starts (``generation_strategy``) and visible afterwards in which
  DaemonSets exist:

  - *blue/green*, when every node reports room for a second copy (on GPUs too: a GPU holder
    pod, not the daemon pod, books the node's GPUs, so both generations' daemons can use them): a
    second DaemonSet of the new generation starts next to the serving one (its own socket
    directory per generation), loads on every node, new-generation engines start next to the old ones, the Service switches, the old
    engines drain, and only then is the old generation's DaemonSet deleted (``retire_daemonsets``).
    The Service never loses its Ready engines.
  - *node by node* otherwise: the DaemonSet is updated in place; a node's old-generation engines
    are drained, then its daemon pod is deleted (the DaemonSet is ``OnDelete``, so it is replaced
    only then) and reloads; new-generation engines start next to it.

  Either way the Service selects one generation (a label in its selector) and switches
  atomically once every replica has a Ready new-generation engine, so clients never see two
  fingerprints at once.

A new-version pod that is not Ready within ``readyDeadlineSeconds`` of its creation stalls the
rollout: the old version keeps serving, an engine rollout starts no further replica (those already
under way finish; with ``maxSurge`` 1 there are none), and the status says which pod and why. Changing the spec back makes the old pods current again; the stalled pod is
then the outdated one and is retired like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.daemon_report import HOST_DEVICE, DaemonReport

from .engine_units import Unit, units
from .objects import Object, PodView, condition, stamp

RolloutPhase = Literal["Progressing", "Stalled", "Complete"]
Strategy = Literal["BlueGreen", "NodeByNode"]
HEADROOM = 1.1
"""A second copy must find its arenas' size plus 10 %: allocators round up, and the engines
starting next to it need some memory of their own."""
GPU_CONTEXT_BYTES = 1 << 30
"""On a GPU a second copy also costs the new daemon's CUDA context: about 0.7 GiB per torch process
on an H200 (docs/benchmarks.md: two engines' contexts took 1.42 GiB), more than the 10 % of a
small model's arenas."""


@dataclass(frozen=True)
class Desired:
    """What the spec asks for now."""

    engine_hash: str
    """``engine_template_hash``: what the engines run."""
    daemon_hash: str
    """``daemon_spec_hash``: what the daemons hold."""
    replicas: int
    standbys: int
    ready_deadline_s: float
    max_surge: int = 1
    """``spec.engine.rollout.maxSurge``: replicas an engine rollout works on at once."""


@dataclass(frozen=True)
class EngineView:
    """The facts about one engine pod that decisions use."""

    name: str
    replica: int | None
    role: str | None
    engine_hash: str | None
    daemon_hash: str | None
    node: str | None
    ready: bool
    deleting: bool
    created: datetime | None

    @classmethod
    def of(cls, raw: Object) -> EngineView:
        pod = PodView(raw)
        return cls(
            name=pod.name,
            replica=pod.replica,
            role=pod.role,
            engine_hash=pod.engine_hash,
            daemon_hash=pod.spec_hash,
            node=pod.node,
            ready=pod.ready,
            deleting=pod.deleting,
            created=pod.created,
        )


@dataclass(frozen=True)
class DaemonView:
    name: str
    node: str | None
    daemon_hash: str | None
    ready: bool
    owner: str | None
    """The DaemonSet the pod belongs to (its controller reference)."""

    @classmethod
    def of(cls, raw: Object) -> DaemonView:
        pod = PodView(raw)
        return cls(name=pod.name, node=pod.node, daemon_hash=pod.spec_hash, ready=pod.ready, owner=pod.owner)


@dataclass
class Plan:
    """The rollout's decisions of one pass, which engine_plan.py turns into actions, in this
    order (``actions.ORDER``): ``promote``, then
    point the Service at ``serve_hash``, then ``retire``, ``create``, ``replace_daemon``."""

    serve_hash: str
    switching: bool = False
    """The Service moves to ``serve_hash`` in this pass, or moved less than
    ``SWITCH_SETTLE_SECONDS`` ago: the old generation's engines are not retired yet. The
    EndpointSlice controller and every proxy learn of the switch only after the patch, and an
    engine deleted now closes its listener at once, refusing the requests still routed to it
    meanwhile (seen in the group blue/green e2e)."""
    promote: list[str] = field(default_factory=list)
    """Units (their head pods) to relabel active."""
    retire: list[str] = field(default_factory=list)
    """Old units (their head pods) to delete with their grace period (drain)."""
    create: list[int] = field(default_factory=list)
    """Replicas that get a new-version standby (a surge unit)."""
    held: set[str] = field(default_factory=set)
    """Surge units (their head pods) the ordinary scaling must neither count nor trim."""
    replace_daemon: str | None = None
    """A drained node's old-generation daemon pod to delete (the DaemonSet recreates it)."""
    retire_daemonsets: list[str] = field(default_factory=list)
    """Blue/green: old-generation DaemonSets whose engines are all gone, to delete (their pods,
    keepers and arenas with them)."""
    mode: Literal["Engine", "Generation"] | None = None
    phase: RolloutPhase | None = None
    step: str = ""
    updated: int = 0
    stalled: str | None = None
    """Why the rollout stopped, when it did."""


def plan(
    want: Desired,
    engines: list[Object],
    daemons: list[Object],
    serving: str | None,
    now: datetime,
    previous: dict[str, Any] | None = None,
    desired_nodes: int = 0,
    old_daemonsets: dict[str, str | None] | None = None,
    *,
    size: int = 1,
    settling: bool = False,
) -> Plan:
    """Decides the next actions and reports the rollout. ``serving``: the generation the live
    Service selects (None when there is no Service yet or it selects none); ``previous``: the
    last ``status.rollout``; ``desired_nodes``: how many daemon pods the DaemonSet of the wanted
    generation should run; ``old_daemonsets``: name → generation of DaemonSets kept for another
    generation next to it (a blue/green change's old side); ``size``: pods per engine
    (``parallelism.nodes``); ``settling``: the Service switched generation less than
    ``SWITCH_SETTLE_SECONDS`` ago.

    Engines are units (engine_units.py), each seen as one ``EngineView``: every decision (surge,
    promote, drain, which generation the Service selects, which replicas are whole, the stall) is
    made over those views alike for every size. Only replacing daemon pods node by node is for
    single-pod engines: slot DaemonSets roll their own pods."""
    pods = engine_views(want, engines, size)
    result = Plan(serve_hash=serve_hash(want, pods, serving))
    result.switching = settling or (serving is not None and serving != result.serve_hash)
    result.updated = sum(replica_done(want, pods, r) for r in range(want.replicas))
    nodes = [DaemonView.of(p) for p in daemons]
    _plan_steps(want, pods, nodes, result, now, desired_nodes, old_daemonsets or {}, size)
    undone = next((r for r in range(want.replicas) if not replica_done(want, pods, r)), None)
    settle_phase(result, previous, undone)
    return result


def engine_views(want: Desired, engines: list[Object], size: int) -> list[EngineView]:
    """One view per engine unit, terminating pods included (a draining old engine is not done
    yet). A unit of one is its pod's view, in the order the pods are given (a replica's first
    active among them is the one a single-pod rollout keeps)."""
    if size == 1:
        return [EngineView.of(p) for p in engines]
    return [unit_view(want, u) for u in units(engines, size)]


def unit_view(want: Desired, unit: Unit) -> EngineView:
    """An engine unit as one engine: its head pod's facts, the unit's readiness and deletion, and
    outdated if any of its pods is."""
    hashes = [PodView(p).engine_hash for p in unit.pods]
    return replace(
        EngineView.of(unit.head),
        ready=unit.ready,
        deleting=unit.deleting,
        engine_hash=next((h for h in hashes if h != want.engine_hash), want.engine_hash),
    )


def _plan_steps(
    want: Desired,
    pods: list[EngineView],
    nodes: list[DaemonView],
    result: Plan,
    now: datetime,
    desired_nodes: int,
    old_sets: dict[str, str | None],
    size: int,
) -> None:
    """A generation change (any daemon, engine or kept DaemonSet of another generation) or an
    engine rollout (an engine of another template)."""
    generation_change = (
        bool(old_sets)
        or any(d.daemon_hash != want.daemon_hash for d in nodes)
        or any(p.daemon_hash != want.daemon_hash for p in pods)
    )
    if generation_change:
        result.mode = "Generation"
        _plan_generation(want, pods, nodes, result, now, desired_nodes, old_sets, size)
    elif any(p.engine_hash != want.engine_hash for p in pods):
        result.mode = "Engine"
        _plan_engine(want, pods, result, now, size)


def settle_phase(result: Plan, previous: dict[str, Any] | None, undone: int | None) -> None:
    """``result.phase`` (and, after a rollout, its mode and step): Stalled or Progressing while a
    rollout ``result.mode`` is under way; once nothing outdated is left, Progressing until every
    replica is whole again (``undone``: the first that is not), then Complete, which stays until
    the next rollout."""
    was = (previous or {}).get("phase")
    if result.mode is not None:
        result.phase = "Stalled" if result.stalled else "Progressing"
    elif was in ("Progressing", "Stalled"):
        result.phase = "Progressing" if undone is not None else "Complete"
        result.step = f"replica {undone}: restoring Ready engines" if undone is not None else "every replica updated"
        result.mode = (previous or {}).get("mode")
    elif was == "Complete":
        result.phase, result.mode, result.step = "Complete", (previous or {}).get("mode"), "every replica updated"


SWITCH_SETTLE_SECONDS = 1.0
"""How long after switching the Service the old generation's engines stay, serving what still
reaches them (Plan.switching); the operator asks for a pass when it is over."""


def serve_hash(want: Desired, pods: list[EngineView], serving: str | None) -> str:
    """The generation the Service selects: the old one until the new one has a Ready engine
    already labelled active for every replica, then the new one, in a single switch — earlier
    only if the old one has no Ready active left while the new one has a Ready engine (switching
    gains something). The switch is never taken back: neither generation serving (an overloaded
    node's daemon flapping) is not a reason to move to one that cannot serve either, and an old
    active may recover.

    Why labelled active *before* the switch (``_plan_generation`` promotes the new engines in an
    earlier pass, while the Service still selects the old generation): the EndpointSlice
    controller watches Services and pods separately. A relabel and a selector change sent
    back to back can reach it in the other order, and it then computes the new selector against
    the old labels — no endpoint at all until the relabel arrives (seen in the blue/green e2e)."""
    if serving is None or serving == want.daemon_hash:
        return want.daemon_hash
    ready_new = {p.replica for p in pods if p.daemon_hash == want.daemon_hash and p.ready and not p.deleting}
    active_new = {
        p.replica
        for p in pods
        if p.daemon_hash == want.daemon_hash and p.ready and not p.deleting and p.role == "active"
    }
    new_everywhere = all(r in active_new for r in range(want.replicas))
    old_serves = any(p.daemon_hash == serving and p.role == "active" and p.ready for p in pods)
    return want.daemon_hash if new_everywhere or (not old_serves and ready_new) else serving


def _plan_engine(want: Desired, pods: list[EngineView], result: Plan, now: datetime, size: int) -> None:
    # The first ``max_surge`` replicas that are not whole, for every size: a rollout never holds
    # more than ``max_surge`` extra engines (for groups, ``nodes`` pods' worth of node capacity
    # each), and one that stalls has started at most that many surges of a template that may not
    # work. A slot frees as soon as any of them is whole, not when all are.
    undone = [r for r in range(want.replicas) if not replica_done(want, pods, r)]
    if not undone:
        # Only pods of replicas beyond ``replicas`` are outdated; scaling removes them.
        result.step = "removing pods of scaled-down replicas"
        return
    steps = {r: _roll_replica(want, pods, r, result, now, size) for r in undone[: want.max_surge]}
    if result.stalled:
        # No further surge while a new-version engine is stuck: the template may be what is wrong.
        # The replicas already under way go on, so that no more old and new engines coexist than
        # necessary, and each of them keeps its Ready active until its own surge is Ready.
        for replica in result.create:
            steps[replica] = f"replica {replica}: not started while the rollout is stalled"
        result.create = []
    result.step = "; ".join(steps.values())


def _roll_replica(want: Desired, pods: list[EngineView], replica: int, result: Plan, now: datetime, size: int) -> str:
    """One replica's next step, added to ``result``: surge → wait Ready → promote + drain the
    old active → old standbys out, new ones in (created by the ordinary scaling) → Ready.
    Returns what it is doing, for ``currentStep``."""
    mine = [p for p in pods if p.replica == replica]
    live = [p for p in mine if not p.deleting]
    new = sorted((p for p in live if p.engine_hash == want.engine_hash), key=_preference)
    old_live = [p for p in live if p.engine_hash != want.engine_hash]
    active = next((p for p in live if p.role == "active"), None)
    if active is None:
        return f"replica {replica}: waiting for an active engine"
    if active.engine_hash != want.engine_hash:
        if not new:
            result.create.append(replica)
            return f"replica {replica}: starting a new-version standby"
        surge = new[0]
        result.held.add(surge.name)
        if not surge.ready:
            check_deadline(want, surge, now, result, size > 1)
            return f"replica {replica}: waiting for {surge.name} to turn Ready"
        result.promote.append(surge.name)
        result.held.discard(surge.name)  # active from now on: the scaler must see it
        result.retire += [p.name for p in old_live]
        return f"replica {replica}: promoted {surge.name}, draining {active.name}"
    if old_live:
        result.retire += [p.name for p in old_live]
        return f"replica {replica}: retiring old standbys"
    if any(p.engine_hash != want.engine_hash for p in mine):
        return f"replica {replica}: waiting for old engines to finish draining"
    for pod in new:
        if not pod.ready:
            check_deadline(want, pod, now, result, size > 1)
    return f"replica {replica}: waiting for new standbys to turn Ready"


def _plan_generation(
    want: Desired,
    pods: list[EngineView],
    nodes: list[DaemonView],
    result: Plan,
    now: datetime,
    desired_nodes: int,
    old_sets: dict[str, str | None],
    size: int,
) -> None:
    """New-generation engines next to Ready new-generation daemons; the Service switches once
    every replica has a Ready new-generation engine; then the old engines drain. Node by node
    (old daemon pods of the DaemonSet updated in place): drain a node → replace its daemon.
    Blue/green (``old_sets``): the old DaemonSets go once no engine of their generation is left."""
    new_nodes = sorted(d.node for d in nodes if d.node and d.ready and d.daemon_hash == want.daemon_hash)
    # Retire only once the Service selected the new generation before this pass (result.switching).
    switched = result.serve_hash == want.daemon_hash and not result.switching
    for replica in range(want.replicas):
        live = [p for p in pods if p.replica == replica and not p.deleting]
        new = sorted(
            (p for p in live if p.daemon_hash == want.daemon_hash and p.engine_hash == want.engine_hash),
            key=_preference,
        )
        active = next((p for p in live if p.role == "active" and p.daemon_hash == want.daemon_hash), None)
        if active is not None:
            if switched:
                result.retire += [p.name for p in live if p.daemon_hash != want.daemon_hash]
            else:
                # Promoted ahead of the switch, next to the old active: hidden from the scaler,
                # which would demote one of two actives (serve_hash says why this order).
                result.held.add(active.name)
            continue
        if not new:
            if new_nodes:
                result.create.append(replica)
            continue
        result.held.add(new[0].name)
        if not new[0].ready:
            check_deadline(want, new[0], now, result, size > 1)
            continue
        result.promote.append(new[0].name)
        if switched:  # the old generation serves nothing: no reason to wait a pass
            result.held.discard(new[0].name)
            result.retire += [p.name for p in live if p.daemon_hash != want.daemon_hash]
    if result.stalled:
        # Nothing more moves while stalled, for every size: the old generation's DaemonSets stay
        # the way back if the spec is changed back.
        return
    if old_sets:
        retire_old_daemonsets(want, pods, result, old_sets)
    if size > 1:
        # Slot DaemonSets roll their pods by themselves: every group spans every slot, so no node
        # can be drained while the others serve, and there is no node to pick here.
        if not old_sets:
            result.step = result.step or "the slot DaemonSets replace their daemons; moving engine groups over"
        return
    # What the DaemonSet updated in place still runs of an older generation (none with blue/green).
    in_place = [d for d in nodes if d.owner not in old_sets]
    old = [d for d in in_place if d.daemon_hash != want.daemon_hash]
    settling = [d for d in in_place if not d.ready] or len(in_place) < desired_nodes
    if not old:
        if not old_sets:
            result.step = "new daemons on every node; moving engines over"
        return
    if settling:
        result.step = "waiting for the replaced daemon to load"
        return
    if result.switching:
        result.step = "switching the Service to the new generation; the old engines drain next"
        return  # what still serves the old generation drains once the switch has settled
    # The node whose drain costs the least serving capacity first.
    serving = result.serve_hash

    def serving_actives(node: str | None) -> int:
        return sum(p.node == node and p.role == "active" and p.ready and p.daemon_hash == serving for p in pods)

    target = min(old, key=lambda d: (serving_actives(d.node), d.node or ""))
    if serving_actives(target.node) and new_nodes:
        # New-generation engines are on their way elsewhere; drain this node after the switch.
        result.step = f"waiting for new-generation engines before draining {target.node}"
        return
    on_node = [p for p in pods if p.node == target.node and p.daemon_hash != want.daemon_hash]
    result.retire += [p.name for p in on_node if not p.deleting and p.name not in result.retire]
    if on_node:
        result.step = f"draining engines on {target.node}"
        return
    result.replace_daemon = target.name
    result.step = f"replacing the daemon on {target.node}"


def retire_old_daemonsets(want: Desired, pods: list[EngineView], result: Plan, old_sets: dict[str, str | None]) -> None:
    """Blue/green's last step: an old generation's DaemonSet goes once the Service has switched
    away from it and none of its engines is left (draining ones included: they still map it)."""
    if result.serve_hash != want.daemon_hash:
        ready = sum(
            any(p.replica == r and p.daemon_hash == want.daemon_hash and p.ready for p in pods)
            for r in range(want.replicas)
        )
        result.step = f"blue/green: new-generation engines Ready for {ready}/{want.replicas} replicas; old ones serve"
        return
    for name, old_hash in sorted(old_sets.items()):
        left = [p.name for p in pods if p.daemon_hash == old_hash]
        if left:
            result.step = f"blue/green: draining {len(left)} engines of the old generation"
        else:
            result.retire_daemonsets.append(name)
    if result.retire_daemonsets:
        result.step = f"blue/green: deleting the old generation's DaemonSet {', '.join(result.retire_daemonsets)}"


def replica_done(want: Desired, pods: list[EngineView], replica: int) -> bool:
    """Whether ``replica`` is whole on the new version: nothing outdated left (terminating pods
    included), and a Ready active and ``standbys`` Ready standbys. ``pods``: one view per engine
    (a group's view speaks for all its pods)."""
    mine = [p for p in pods if p.replica == replica]
    if any(p.engine_hash != want.engine_hash for p in mine):
        return False
    live = [p for p in mine if not p.deleting]
    active_ok = any(p.role == "active" and p.ready for p in live)
    return active_ok and sum(p.role != "active" and p.ready for p in live) >= want.standbys


def check_deadline(want: Desired, pod: EngineView, now: datetime, result: Plan, group: bool = False) -> None:
    """Stalls ``result`` when ``pod`` (a group's view with ``group``) of the new version is not
    Ready ``readyDeadlineSeconds`` after its creation, saying which and what to do."""
    if pod.created is None:
        return
    waited = (now - pod.created).total_seconds()
    if waited > want.ready_deadline_s:
        what, logs = (f"engine group {pod.name}", "the group's pods") if group else (pod.name, "the pod")
        result.stalled = (
            f"{what} of the new version was not Ready {waited:.0f}s after its creation"
            f" (engine.rollout.readyDeadlineSeconds is {want.ready_deadline_s:g}); the old version keeps"
            f" serving. Fix the engine template (kubectl logs {logs}) or change it back, and the rollout resumes"
        )


def _preference(pod: EngineView) -> tuple[bool, str, str]:
    """Ready first, then the oldest (it has been warming longest)."""
    return (not pod.ready, pod.created.isoformat() if pod.created else "", pod.name)


# --- status --------------------------------------------------------------------------------------


def rollout_status(
    result: Plan, want: Desired, now: datetime, previous: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``status.rollout``, or None when no rollout has happened yet. ``startedAt`` is kept while
    the target stays the same; ``finishedAt`` is stamped once, when the rollout completes."""
    if result.phase is None:
        return None
    before = previous or {}
    same_target = before.get("engineTemplateHash") == want.engine_hash
    if result.phase == "Complete" and before.get("phase") == "Complete":
        return (
            before
            if same_target
            else {**before, "engineTemplateHash": want.engine_hash, "updated": want.replicas, "total": want.replicas}
        )
    started = before.get("startedAt") if same_target and before.get("startedAt") else stamp(now)
    body: dict[str, Any] = {
        "phase": result.phase,
        "mode": result.mode,
        "engineTemplateHash": want.engine_hash,
        "daemonSpecHash": want.daemon_hash,
        "updated": result.updated,
        "total": want.replicas,
        "currentStep": result.step,
        "startedAt": started,
    }
    if result.stalled:
        body["message"] = result.stalled
    if result.phase == "Complete":
        body["finishedAt"] = stamp(now)
    return {k: v for k, v in body.items() if v is not None}


def rollout_conditions(
    result: Plan,
    strategy: tuple[Strategy, str] | None,
    now: datetime,
    previous: list[dict[str, Any]],
    observed_generation: int | None,
) -> list[dict[str, Any]]:
    """Conditions that replace or join ``aggregate``'s: ``Progressing`` False with reason
    ``RolloutStalled`` (as a Deployment's ``ProgressDeadlineExceeded``) when stalled, True while
    rolling; ``GenerationChange`` saying node by node or blue/green, and why."""

    def make(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return condition(kind, ok, reason, message[:32768], now, previous, observedGeneration=observed_generation)

    out = []
    if result.stalled:
        out.append(make("Progressing", False, "RolloutStalled", result.stalled))
    elif result.phase == "Progressing":
        out.append(make("Progressing", True, f"{result.mode}Rollout", result.step))
    if result.mode == "Generation" and result.phase in ("Progressing", "Stalled") and strategy is not None:
        out.append(make("GenerationChange", True, strategy[0], strategy[1]))
    elif any(c.get("type") == "GenerationChange" for c in previous):
        out.append(make("GenerationChange", False, "Converged", "every daemon holds the current generation"))
    return out


def generation_strategy(
    requested: str,
    backend: str,
    reports: Mapping[str, DaemonReport | str],
    headroom: float = HEADROOM,
    *,
    gpu_access: str = "visibleDevices",
    gpus_shared: str | None = None,
) -> tuple[Strategy, str]:
    """How a generation change should go, and why. Blue/green only when the user allows it
    (``spec.daemon.generationChange: Auto``), a second daemon pod can be placed where the arenas
    live, and every daemon reports, for every device its ranks hold, free memory of at least their
    arenas' size times ``headroom`` (the allocator's slack), plus ``GPU_CONTEXT_BYTES`` on a GPU.
    Otherwise node by node. ``reports``: each daemon pod's status report (or why it could not be
    read), taken when the change starts.

    Where a second daemon pod can go:
    - cpu-shm: anywhere; the arenas are host memory.
    - cuda-vmm: daemon pods request no GPUs; the GPU holder pod books them
      (render/gpu_holder.py), so two generations' daemons see the same GPUs and each finds its
      own by UUID. Each generation has its own socket directory and keeper, and a cuMem fd is
      private to the process it was passed to, so nothing of one generation reaches the other.
    - cuda-ipc: the same holder, so placement is the same. It is sound too: both generations'
      daemons and engines run in the host's PID and IPC namespaces (hostPID/hostIPC, as every
      cuda-ipc pod does), where their pids cannot collide; a legacy CUDA IPC handle names one
      allocation of one exporting process, and an engine opens only the handle its own
      generation's socket hands it. No keeper is involved (it cannot hold these handles), and the
      old daemons go only after the old engines that opened their handles have drained.
    - ``gpuAccess: dra``: node by node. Each daemon pod's GPUs come from a ResourceClaim of its
      own, made from the pod's template, which no pod of another generation shares.
    ``gpus_shared``: why the GPU holder does not book the serving daemons' GPUs for a second
    generation (``gpu_holder.blue_green_blocker``), or None when it does."""
    if requested == "NodeByNode":
        return "NodeByNode", "spec.daemon.generationChange is NodeByNode"
    gpu = backend in GPU_BACKENDS
    if gpu and gpu_access == "dra":
        return "NodeByNode", (
            "gpuAccess dra: each daemon pod's GPUs come from a ResourceClaim of its own, which a"
            " second generation's daemon pod cannot share"
        )
    if gpu and gpus_shared is not None:
        return "NodeByNode", gpus_shared
    if not reports:
        return "NodeByNode", "no daemon has reported its ranks and free memory yet"
    fits: list[str] = []
    for pod, report in sorted(reports.items()):
        if isinstance(report, str):
            return "NodeByNode", f"the free memory of {pod} is unknown ({report})"
        need: dict[str, int] = {}
        for rank in report.ranks:
            if rank.bytes is None:
                return "NodeByNode", f"{pod} does not report the arena size of rank {rank.rank} yet"
            device = rank.gpu_uuid or HOST_DEVICE
            need[device] = need.get(device, 0) + rank.bytes
        memory = {m.device: m for m in report.memory}
        for device, size in sorted(need.items()):
            free = memory.get(device)
            if free is None or free.free_bytes is None:
                why = f": {free.error}" if free is not None and free.error else ""
                return "NodeByNode", f"{pod} reports no free memory for {device}{why}"
            wanted = int(size * headroom) + (GPU_CONTEXT_BYTES if device != HOST_DEVICE else 0)
            if free.free_bytes < wanted:
                return "NodeByNode", (
                    f"{device} of {pod} has {_gib(free.free_bytes)} free; a second copy of its"
                    f" ranks needs {_gib(wanted)}"
                )
            fits.append(device)
    where = " on the GPUs the holder books" if gpu else ""
    return "BlueGreen", (
        f"every daemon has room for a second copy{where} ({len(reports)} daemons, {len(fits)} devices checked)"
    )


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.2f} GiB"
