"""parallelism.nodes > 1: engine-template and daemon-generation rollouts of engine groups, a whole
new-version group at a time, and what status.rollout says meanwhile."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from builders import make
from group_builders import READY, TWO, complete_groups, ids, plan_groups, run
from rollout_pods import daemonsets_deleted
from weightcache_operator.plan.actions import ApplyService, Create, Delete, SetRole, in_order
from weightcache_operator.plan.rollout import planner
from weightcache_operator.plan.rollout.status import rollout_status
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.render import daemon_spec_hash, engine_template_hash
from weightcache_operator.render.daemon import daemon_daemonsets, slot_base
from weightcache_operator.spec import RolloutStatus


def test_a_new_engine_version_rolls_through_group_by_group() -> None:
    """The old groups serve until a whole new-version group is Ready; then it takes over and the
    old groups are drained, and a new-version standby group follows."""
    old_cache = make(**TWO)
    new_cache = make(**TWO, **{"engine.template.spec.containers": [{"name": "engine", "image": "engine:2"}]})
    old = complete_groups(old_cache)
    first = plan_groups(new_cache, old, READY, ids())
    assert [type(a) for a in first] == [Create], first
    surge = first[0].pod  # type: ignore[union-attr]
    assert surge["metadata"]["labels"]["weightcache.io/role"] == "standby"
    assert (
        surge["metadata"]["labels"]["weightcache.io/engine-hash"]
        != old[0]["metadata"]["labels"]["weightcache.io/engine-hash"]
    )
    leader = run(surge, "node-1", ip="198.18.1.7")
    group = leader["metadata"]["labels"]["weightcache.io/engine-group"]
    follower = plan_groups(new_cache, [*old, leader], READY, ids())
    assert len(follower) == 1 and isinstance(follower[0], Create)
    member = run(follower[0].pod, "node-2", "198.18.2.7")
    assert plan_groups(new_cache, [*old, leader, member], READY, ids()) == [], "waits for the new group to be Ready"
    # The old active fails meanwhile: the old standby group takes over, not the unready new one.
    failing = complete_groups(old_cache, ready_active=False)
    roles = {
        a.name: a.role
        for a in plan_groups(new_cache, [*failing, leader, member], READY, ids())
        if isinstance(a, SetRole)
    }
    assert roles["tiny-0-gb-0"] == "active" and f"tiny-0-{group}-0" not in roles
    ready_group = [
        run(surge, "node-1", "198.18.1.7", ready=True),
        run(follower[0].pod, "node-2", "198.18.2.7", ready=True),
    ]
    switch = plan_groups(new_cache, [*old, *ready_group], READY, ids())
    assert {a.name for a in switch if isinstance(a, SetRole) and a.role == "active"} == {
        p["metadata"]["name"] for p in ready_group
    }
    assert sorted(a.name for a in switch if isinstance(a, Delete)) == [
        "tiny-0-ga-0",
        "tiny-0-ga-1",
        "tiny-0-gb-0",
        "tiny-0-gb-1",
    ]
    assert all("rolled out" in a.why for a in switch if isinstance(a, Delete))
    promoted = [copy.deepcopy(p) for p in ready_group]
    for pod in promoted:
        pod["metadata"]["labels"]["weightcache.io/role"] = "active"
    restore = plan_groups(new_cache, promoted, READY, ids())
    assert [(type(a), a.pod["metadata"]["labels"]["weightcache.io/role"]) for a in restore] == [(Create, "standby")]  # type: ignore[union-attr]


def test_group_rollout_reports_progress_stalls_past_the_deadline_and_completes() -> None:
    """status.rollout for engine groups: what planner.plan tells rollout_status at each stage."""
    old_cache = make(**TWO)
    new_cache = make(**TWO, **{"engine.template.spec.containers": [{"name": "engine", "image": "engine:2"}]})
    want = Desired(
        engine_template_hash(new_cache), daemon_spec_hash(new_cache), replicas=1, standbys=1, ready_deadline_s=600
    )
    at = lambda minutes: datetime(2026, 11, 29, 10, minutes, tzinfo=UTC)  # noqa: E731  (pods: 10:00)
    old = complete_groups(old_cache)
    assert planner.plan(want, complete_groups(new_cache), [], None, at(1), size=2).phase is None, (
        "nothing to roll, nothing rolled"
    )

    started = planner.plan(want, old, [], None, at(1), size=2)
    assert (started.mode, started.phase, started.updated) == ("Engine", "Progressing", 0)
    assert started.step == "replica 0: starting a new-version standby"

    [surge] = [a.pod for a in plan_groups(new_cache, old, READY, ids()) if isinstance(a, Create)]
    leader = run(surge, "node-1", ip="198.18.1.7")
    [member] = [
        run(a.pod, "node-2", "198.18.2.7")
        for a in plan_groups(new_cache, [*old, leader], READY, ids())
        if isinstance(a, Create)
    ]
    waiting = planner.plan(want, [*old, leader, member], [], None, at(5), size=2)
    assert waiting.phase == "Progressing"
    assert waiting.step == f"replica 0: waiting for {leader['metadata']['name']} to turn Ready"
    stalled = planner.plan(want, [*old, leader, member], [], None, at(11), size=2)
    assert stalled.phase == "Stalled" and stalled.stalled is not None
    assert f"engine group {leader['metadata']['name']}" in stalled.stalled
    assert "readyDeadlineSeconds is 600" in stalled.stalled
    typed = rollout_status(stalled, want, at(11), rollout_status(started, want, at(1), None))
    assert typed is not None
    status = typed.wire()
    assert (status["phase"], status["startedAt"]) == ("Stalled", "2026-11-29T10:01:00Z")
    assert status["message"] == stalled.stalled

    ready_group = [run(surge, "node-1", "198.18.1.7", ready=True), run(member, "node-2", "198.18.2.7", ready=True)]
    for pod in ready_group:
        pod["metadata"]["labels"]["weightcache.io/role"] = "active"
    draining = copy.deepcopy(old)
    for pod in draining:
        pod["metadata"]["deletionTimestamp"] = "2026-11-29T10:12:00Z"
    assert (
        planner.plan(want, [*draining, *ready_group], [], None, at(12), size=2).step
        == "replica 0: waiting for old engines to finish draining"
    )
    previous = RolloutStatus(phase="Progressing", mode="Engine")
    restoring = planner.plan(want, ready_group, [], None, at(13), previous, size=2)
    assert (restoring.phase, restoring.updated) == ("Progressing", 0), "no Ready new standby group yet"
    standby = [copy.deepcopy(p) for p in ready_group]
    for pod, name in zip(standby, ("tiny-0-gz-0", "tiny-0-gz-1")):
        pod["metadata"]["name"] = name
        pod["metadata"]["labels"]["weightcache.io/role"] = "standby"
        pod["metadata"]["labels"]["weightcache.io/engine-group"] = "gz"
    done = planner.plan(want, [*ready_group, *standby], [], None, at(14), previous, size=2)
    assert (done.phase, done.mode, done.updated, done.step) == ("Complete", "Engine", 1, "every replica updated")


def test_a_blue_green_generation_change_of_groups_switches_the_service_a_pass_after_the_promotion() -> None:
    """New weights (a new daemon generation) for engine groups: a new slot DaemonSet set next to
    the old one, a new group promoted next to the old active — which keeps serving — and only
    once the new group is labelled active does the Service switch, then the old groups drain and
    the old slot DaemonSets go."""
    old_cache = make(**TWO)
    new_cache = make(**TWO, **{"model.revision": "r2"})
    old_gen, new_gen = daemon_spec_hash(old_cache), daemon_spec_hash(new_cache)
    assert old_gen != new_gen
    sets = daemon_daemonsets(new_cache, [["node-1"], ["node-2"]], name=f"tiny-daemon-{new_gen[:10]}")
    assert [ds["metadata"]["name"] for ds in sets] == [f"tiny-daemon-{new_gen[:10]}-0", f"tiny-daemon-{new_gen[:10]}-1"]
    assert {slot_base(ds) for ds in sets} == {f"tiny-daemon-{new_gen[:10]}"}

    want = Desired(engine_template_hash(new_cache), new_gen, replicas=1, standbys=1, ready_deadline_s=600)
    old = complete_groups(old_cache)
    old_sets = {"tiny-daemon-0": old_gen, "tiny-daemon-1": old_gen}
    at = datetime(2026, 11, 29, 10, 5, tzinfo=UTC)
    [surge] = [a.pod for a in plan_groups(new_cache, old, READY, ids(), serving=old_gen) if isinstance(a, Create)]
    fresh = [run(surge, "node-1", "198.18.1.7", ready=True)]
    fresh.append(
        run(
            next(
                a.pod
                for a in plan_groups(new_cache, [*old, *fresh], READY, ids(), serving=old_gen)
                if isinstance(a, Create)
            ),
            "node-2",
            "198.18.2.7",
            ready=True,
        )
    )
    # Ready but a standby: the Service stays on the old generation; the new group is promoted
    # while the old active keeps its label and serves.
    progress = planner.plan(want, [*old, *fresh], [], old_gen, at, None, 0, old_sets, size=2)
    assert progress.serve_hash == old_gen and daemonsets_deleted(progress) == []
    plan = plan_groups(new_cache, [*old, *fresh], READY, ids(), serving=progress.serve_hash)
    assert {a.name: a.role for a in plan if isinstance(a, SetRole)} == {p["metadata"]["name"]: "active" for p in fresh}
    assert not [a for a in plan if isinstance(a, Delete)], "the old groups serve until the Service switches"

    promoted = copy.deepcopy(fresh)
    for pod in promoted:
        pod["metadata"]["labels"]["weightcache.io/role"] = "active"
    # Next pass: the new group is active and Ready, so the Service switches; the old groups drain.
    progress = planner.plan(want, [*old, *promoted], [], old_gen, at, None, 0, old_sets, size=2)
    assert progress.serve_hash == new_gen and daemonsets_deleted(progress) == [], "old engines still map it"
    plan = plan_groups(new_cache, [*old, *promoted], READY, ids(), serving=progress.serve_hash)
    assert sorted(a.name for a in plan if isinstance(a, Delete)) == [
        "tiny-0-ga-0",
        "tiny-0-ga-1",
        "tiny-0-gb-0",
        "tiny-0-gb-1",
    ]
    # The old active group leaves the Service only after the Service selects the new generation.
    steps = [type(a).__name__ for a in in_order([ApplyService(new_gen), *plan])]
    assert steps.index("ApplyService") < steps.index("Delete")
    # The old engines are gone: their slot DaemonSets go too.
    done = planner.plan(
        want, promoted, [], new_gen, at, RolloutStatus(phase="Progressing", mode="Generation"), 0, old_sets, size=2
    )
    assert sorted(daemonsets_deleted(done)) == ["tiny-daemon-0", "tiny-daemon-1"]
    # Without a pending switch (an engine-only rollout) promotion and retirement are one pass.
    assert any(isinstance(a, Delete) for a in plan_groups(new_cache, [*old, *fresh], READY, ids()))
