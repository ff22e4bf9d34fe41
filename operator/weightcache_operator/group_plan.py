"""One pass of engine scaling when an engine spans ``parallelism.nodes > 1`` nodes: pods in,
actions (create, delete, relabel) out. Pure, so every rule is unit-tested without an API server;
executor.py carries the actions out (engine_plan.py puts them in ``actions.ORDER``).

An engine group is created leader first: the other node ranks dial the leader's rendezvous at its
pod IP, which exists only once the leader pod is running, so they are created in a later pass
(the leader's pod event triggers it). A group whose leader is gone, or with a failed member, is
deleted whole and replaced: its other ranks cannot serve without it. Roles (active/standby),
promotion and failover work as with single-node engines, on groups instead of pods; a promotion
over a failed active group is reported as a ``Failover`` action, for status.lastFailover, the
Event and the metrics, with the groups' leaders as ``from`` and ``to``.

A new engine version (``engine_template_hash``: the engine template or the daemon generation
changed) rolls through group by group as single-node engines do: a new-version standby group
starts next to the old ones (a surge, not trimmed), is promoted once every member is Ready, and
the old groups are then deleted with their grace period. Until then the old groups keep serving
and remain the failover candidates. ``rollout.plan`` reports that rollout for both kinds of engine
(status.rollout, the Progressing condition, the Service's generation), including the stall of a
new group not Ready within ``readyDeadlineSeconds``: the old groups keep serving, as they would
anyway.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime

from .actions import Action, Create, Delete, Failover, SetRole
from .engine_units import Unit, units
from .failover import Failure, Promotion, failure_of
from .objects import Object, PodView
from .placement import new_engine
from .render.dra import engine_claim_current
from .render.engine import DIST_PORT, DIST_PORT_ANNOTATION, Member, Role, engine_template_hash
from .render.layout import GROUP_LABEL, NODE_RANK_LABEL, daemon_spec_hash
from .spec import WeightCache


def plan_groups(
    cache: WeightCache,
    pods: list[Object],
    ready: dict[int, dict[str, Object]],
    new_group: Callable[[], str],
    unready_nodes: Mapping[str, datetime | None] | None = None,
    serving: str | None = None,
) -> list[Action]:
    """``ready[k]``: node → current Ready daemon pod, for the nodes holding slot ``k``;
    ``unready_nodes``: as failover.unready_nodes (names the failure of a group on a dead node);
    ``serving``: the generation the Service selects after this pass. While it is not the current
    one (a blue/green generation change), a Ready new group is promoted next to the old active,
    which keeps serving until the Service switches (``rollout.plan``) — a pass later."""
    spec = cache.spec.engine
    size = cache.spec.parallelism.nodes
    actions: list[Action] = []
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    load = Counter(p["spec"].get("nodeName") for p in live)
    ports = {_port(p) for p in live}
    kept: dict[str, list[Unit]] = {}
    broken_actives: dict[str, tuple[Unit, str]] = {}
    for unit in units(live, size):
        why = _broken(unit, spec.replicas, ready)
        if why:
            actions += [Delete(p["metadata"]["name"], why) for p in unit.pods]
            if unit.role == "active":
                broken_actives[unit.replica] = (unit, why)
        else:
            kept.setdefault(unit.replica, []).append(unit)

    def create(replica: int, role: str, member: Member) -> None:
        pod = new_engine(cache, replica, _role(role), ready.get(member.node_rank, {}), load, member)
        if pod is not None:
            actions.append(Create(pod))

    def new_member() -> Member:
        """Leader of a new group, on the lowest rendezvous port no live group of the cache uses."""
        port = next(p for p in range(DIST_PORT, DIST_PORT + 10_000) if p not in ports)
        ports.add(port)
        return Member(new_group(), 0, port=port)

    roles: dict[str, str] = {}
    """Pod name → the role this plan gives it (the pods themselves are left as given)."""

    def role_of(unit: Unit) -> str | None:
        return roles.get(unit.name, unit.role)

    def relabel(unit: Unit, role: str) -> None:
        for pod in map(PodView, unit.pods):
            if roles.get(pod.name, pod.role) != role:
                actions.append(SetRole(pod.name, role))
            roles[pod.name] = role

    version = engine_template_hash(cache)

    def current(unit: Unit) -> bool:
        return all(PodView(p).engine_hash == version for p in unit.pods)

    def retire(unit: Unit, why: str) -> None:
        actions.extend(Delete(p["metadata"]["name"], why) for p in unit.pods)

    def add_followers(unit: Unit) -> None:
        leader = unit.leader
        assert leader is not None  # _broken removed leaderless groups
        ip = (leader.get("status") or {}).get("podIP")
        group = (leader["metadata"].get("labels") or {}).get(GROUP_LABEL, "")
        for rank in range(1, size):
            if rank not in unit.members and ip:
                create(int(unit.replica), role_of(unit) or "standby", Member(group, rank, ip, _port(leader)))

    dead = unready_nodes or {}

    def healthy(unit: Unit) -> bool:
        """Ready, and no member on a NotReady node (whose pods the API still shows Ready until
        the node lifecycle controller gets round to them)."""
        return unit.ready and not any(p["spec"].get("nodeName") in dead for p in unit.pods)

    switch_pending = serving is not None and serving != daemon_spec_hash(cache)

    def serves(unit: Unit) -> bool:
        """An active of the generation the Service still selects, while a switch is pending."""
        return switch_pending and _daemon_hash(unit) == serving

    every_slot_ready = all(ready.get(k) for k in range(size))
    for replica in range(spec.replicas):
        # Healthy first (failover), then the current version, then the oldest.
        mine = sorted(kept.get(str(replica), []), key=lambda u: (not healthy(u), not current(u), u.created, u.name))
        for unit in mine:
            relabel(unit, role_of(unit) or "standby")  # members follow their leader's role
        actives = [u for u in mine if role_of(u) == "active"]
        standbys = [u for u in mine if role_of(u) != "active"]
        for extra in actives[1:]:
            if serves(extra) and not serves(actives[0]):
                continue  # behind the Service until it switches to the new active's generation
            relabel(extra, "standby")
            standbys.append(extra)
        actives = actives[:1]
        if not actives and standbys:
            promoted = standbys.pop(0)
            relabel(promoted, "active")
            actives = [promoted]
            failed, why = broken_actives.get(str(replica), (None, f"replica {replica} has no active engine group"))
            failure = _group_failure(failed, pods, dead) if failed else None
            actions.append(
                Failover(
                    Promotion(
                        replica,
                        promoted.head,
                        failed.head if failed else None,
                        failure or Failure("PodGone", None, why, True),
                    )
                )
            )
        elif actives and not healthy(actives[0]) and standbys and healthy(standbys[0]):
            promoted, demoted = standbys.pop(0), actives[0]
            relabel(promoted, "active")
            actives = [promoted]
            failure = _group_failure(demoted, pods, dead)
            if failure is not None and failure.final:
                retire(demoted, f"failed ({failure.signal}): {failure.detail}")  # on a dead node: gone for good
            else:
                relabel(demoted, "standby")
                standbys.append(demoted)
            if failure is not None:  # else it never got Ready: a swap, not a failover
                actions.append(Failover(Promotion(replica, promoted.head, demoted.head, failure)))
        fresh = [u for u in standbys if current(u)]
        if actives and not current(actives[0]):
            if not (fresh and fresh[0].ready):
                # Rolling: the old version serves until a new-version group is whole and Ready.
                for unit in [*actives, *standbys]:
                    add_followers(unit)
                if not fresh and every_slot_ready:
                    create(replica, "standby", new_member())
                continue
            promoted, old = fresh[0], actives[0]
            relabel(promoted, "active")
            if serves(old):
                # The Service still selects the old generation: the old group serves on, and the
                # next pass switches the Service (the new group is labelled active by then).
                for unit in [old, *standbys]:
                    add_followers(unit)
                continue
            retire(old, f"rolled out: {promoted.name} of the new version took over")
            actives, standbys = [promoted], [u for u in standbys if u is not promoted]
        for unit in standbys:
            if not current(unit):
                retire(unit, "rolled out: an old-version standby")
        standbys = [u for u in standbys if current(u)]
        for extra in standbys[spec.standbys_per_replica :][::-1]:
            retire(extra, "too many standbys")
        for unit in [*actives, *standbys[: spec.standbys_per_replica]]:
            add_followers(unit)
        if not every_slot_ready:
            continue  # a new group starts only when every slot has a Ready daemon
        if not actives:
            create(replica, "active", new_member())
        for _ in range(spec.standbys_per_replica - len(standbys)):
            create(replica, "standby", new_member())
    return actions


def _broken(unit: Unit, replicas: int, ready: dict[int, dict[str, Object]]) -> str | None:
    """Why a group must go whole, or None."""
    if unit.key.startswith("pod/"):
        return "not a member of an engine group"
    if not unit.replica.isdigit() or int(unit.replica) >= replicas:
        return "scaled down"
    if any((p.get("status") or {}).get("phase") in ("Failed", "Succeeded") for p in unit.pods):
        return "a member pod of the group exited"
    if unit.leader is None:
        return "the group's leader is gone"
    for slot, pod in unit.members.items():
        node = pod["spec"].get("nodeName")
        daemon = ready.get(slot, {}).get(node) if node else None
        if daemon is not None and not engine_claim_current(pod, daemon):
            return "its node's daemon was replaced: the engine's ResourceClaim is stale"
    return None


def _group_failure(unit: Unit, pods: list[Object], unready_nodes: Mapping[str, datetime | None]) -> Failure | None:
    """The first failure among the group's pods, leader first, terminating ones included (a
    deleted member is the failure that names itself)."""
    group = (unit.head["metadata"].get("labels") or {}).get(GROUP_LABEL)
    members = [p for p in pods if group and (p["metadata"].get("labels") or {}).get(GROUP_LABEL) == group] or unit.pods
    members.sort(key=lambda p: (p["metadata"].get("labels") or {}).get(NODE_RANK_LABEL, ""))
    return next((f for p in members if (f := failure_of(p, unready_nodes)) is not None), None)


def _daemon_hash(unit: Unit) -> str | None:
    return PodView(unit.head).spec_hash


def _port(pod: Object) -> int:
    text = (pod["metadata"].get("annotations") or {}).get(DIST_PORT_ANNOTATION, "")
    return int(text) if text.isdigit() else DIST_PORT


def _role(role: str) -> Role:
    return "active" if role == "active" else "standby"
