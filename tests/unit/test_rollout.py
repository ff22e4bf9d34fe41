"""Rollout decisions (operator/weightcache_operator/rollout/): pods as the API server returns
them in, actions out. The e2e tests run the same decisions against a real control plane."""

from __future__ import annotations

from typing import Any

import builders
import pytest
from builders import NOW
from weightcache_contract.daemon_report import DaemonReport, DeviceMemory, RankReport
from weightcache_operator.plan.actions import DeleteDaemonSet, ReplaceDaemon
from weightcache_operator.plan.engine_units import units
from weightcache_operator.plan.rollout.decisions import Plan, promoted, retired
from weightcache_operator.plan.rollout.generation import serve_hash
from weightcache_operator.plan.rollout.planner import plan
from weightcache_operator.plan.rollout.status import rollout_conditions, rollout_status
from weightcache_operator.plan.rollout.strategy import generation_strategy
from weightcache_operator.plan.rollout.views import Desired, EngineView, engine_views, unit_view
from weightcache_operator.render import SPEC_HASH_LABEL

WANT = Desired(engine_hash="new", daemon_hash="g1", replicas=2, standbys=1, ready_deadline_s=60)


def engine(
    name: str,
    replica: int,
    role: str,
    version: str = "new",
    generation: str = "g1",
    *,
    ready: bool = True,
    ready_after_s: float | None = None,
    node: str = "node-1",
    age_s: float = 10,
    deleting: bool = False,
) -> dict[str, Any]:
    """builders.engine as these scenarios name it: an engine of template ``version`` mapping the
    daemon generation ``generation`` (labelled with it too, as rendered), created ``age_s`` before
    NOW, Ready (``ready_after_s`` after its creation when given) unless ``ready`` is False, and
    being deleted since NOW when ``deleting``."""
    return builders.engine(
        name,
        replica=replica,
        role=role,
        engine_hash=version,
        spec_hash=generation,
        labels={SPEC_HASH_LABEL: generation},
        node=node,
        created=-age_s,
        deleted=0 if deleting else None,
        ready=ready,
        ready_since=None if ready_after_s is None else ready_after_s - age_s,
    )


def daemon(name: str, node: str, generation: str = "g1", *, ready: bool = True, **fields: Any) -> dict[str, Any]:
    """builders.daemon as these scenarios name it: the daemon ``name`` on ``node`` holding
    ``generation``, Ready unless ``ready`` is False; the rest as ``builders.pod`` takes it."""
    return builders.daemon(name, node=node, spec_hash=generation, ready=ready, **fields)


DAEMONS = [daemon("d1", "node-1"), daemon("d2", "node-2")]


def old_pair(replica: int, version: str = "old") -> list[dict[str, Any]]:
    return [engine(f"a{replica}", replica, "active", version), engine(f"s{replica}", replica, "standby", version)]


# --- engines as units ---------------------------------------------------------------------------


def daemon_replaced(result: Plan) -> str | None:
    """The daemon pod the rollout deletes for its DaemonSet to replace, if any (at most one a pass)."""
    [name] = [a.pod for a in result.actions if isinstance(a, ReplaceDaemon)] or [None]
    return name


def daemonsets_deleted(result: Plan) -> list[str]:
    """The old generation's DaemonSets the rollout deletes in this pass."""
    return [a.name for a in result.actions if isinstance(a, DeleteDaemonSet)]


def held(result: Plan) -> set[str]:
    """The units (by head pod) the rollout hands to scaling as held: neither counted nor trimmed."""
    return {unit.name for unit in result.units if unit.held}


def test_an_engine_of_one_pod_is_seen_as_a_unit_of_one_whose_view_is_its_pod_s() -> None:
    pods = [
        engine("a0", 0, "active", "old", deleting=True),
        engine("n0", 0, "standby", ready=False),
        engine("s0", 0, "standby"),
        engine("x0", 0, "standby", "old", ready=False, node="node-2"),
    ]
    as_units = [unit_view(WANT, u) for u in units(pods, 1)]
    assert [u.name for u in units(pods, 1)] == ["a0", "n0", "s0", "x0"]
    assert sorted(as_units, key=lambda v: v.name) == [EngineView.of(p) for p in pods]
    assert engine_views(WANT, list(reversed(pods)), 1) == [EngineView.of(p) for p in reversed(pods)], (
        "pods keep the order they are given"
    )


# --- engine rollout -----------------------------------------------------------------------------


def test_nothing_outdated_is_no_rollout() -> None:
    result = plan(WANT, old_pair(0, "new") + old_pair(1, "new"), DAEMONS, "g1", NOW, None, 2)
    assert (result.mode, result.phase, result.create, promoted(result), retired(result)) == (None, None, [], [], [])
    assert rollout_status(result, WANT, NOW, None) is None


def test_the_first_replica_gets_a_surge_standby_and_the_second_waits() -> None:
    result = plan(WANT, old_pair(0) + old_pair(1), DAEMONS, "g1", NOW, None, 2)
    assert (result.mode, result.phase, result.create) == ("Engine", "Progressing", [0])
    assert promoted(result) == [] and retired(result) == [] and result.updated == 0
    status = rollout_status(result, WANT, NOW, None)
    assert status is not None and (status["updated"], status["total"], status["engineTemplateHash"]) == (0, 2, "new")
    assert "replica 0" in status["currentStep"]


def test_an_unready_surge_is_held_and_waited_for() -> None:
    pods = [*old_pair(0), engine("n0", 0, "standby", ready=False), *old_pair(1)]
    result = plan(WANT, pods, DAEMONS, "g1", NOW, None, 2)
    assert held(result) == {"n0"}, "the scaler must not trim the surge as a second standby"
    assert (result.create, promoted(result), retired(result), result.stalled) == ([], [], [], None)


def test_a_ready_surge_is_promoted_and_the_old_pods_drained() -> None:
    pods = [*old_pair(0), engine("n0", 0, "standby"), *old_pair(1)]
    result = plan(WANT, pods, DAEMONS, "g1", NOW, None, 2)
    assert promoted(result) == ["n0"] and sorted(retired(result)) == ["a0", "s0"]
    assert held(result) == set(), "the promoted pod is the replica's active: the scaler must count it"
    assert not {"a1", "s1"} & set(retired(result)), "one replica at a time"


def test_the_next_replica_starts_only_when_the_first_is_whole() -> None:
    draining = [engine("n0", 0, "active"), engine("a0", 0, "active", "old", deleting=True), *old_pair(1)]
    result = plan(WANT, draining, DAEMONS, "g1", NOW, None, 2)
    assert (result.create, retired(result)) == ([], []) and "draining" in result.step
    restoring = [engine("n0", 0, "active"), engine("m0", 0, "standby", ready=False), *old_pair(1)]
    assert plan(WANT, restoring, DAEMONS, "g1", NOW, None, 2).create == []
    whole = [engine("n0", 0, "active"), engine("m0", 0, "standby"), *old_pair(1)]
    result = plan(WANT, whole, DAEMONS, "g1", NOW, None, 2)
    assert (result.create, result.updated) == ([1], 1)


def test_a_new_version_not_ready_by_the_deadline_stalls_and_keeps_the_old_serving() -> None:
    pods = [*old_pair(0), engine("n0", 0, "standby", ready=False, age_s=61), *old_pair(1)]
    result = plan(WANT, pods, DAEMONS, "g1", NOW, None, 2)
    assert result.phase == "Stalled" and result.stalled and "n0" in result.stalled
    assert "readyDeadlineSeconds" in result.stalled and "change it back" in result.stalled
    assert (result.create, promoted(result), retired(result)) == ([], [], [])
    assert held(result) == {"n0"}, "kept for its logs, not counted as a standby"
    conditions = rollout_conditions(result, None, NOW, [], 4)
    assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [("Progressing", "False", "RolloutStalled")]
    status = rollout_status(result, WANT, NOW, None)
    assert status is not None and status["phase"] == "Stalled" and status["message"] == result.stalled


def test_changing_the_spec_back_retires_the_broken_pod_and_completes() -> None:
    back = Desired(engine_hash="old", daemon_hash="g1", replicas=2, standbys=1, ready_deadline_s=60)
    pods = [*old_pair(0), engine("n0", 0, "standby", "new", ready=False, age_s=300), *old_pair(1)]
    previous = {"phase": "Stalled", "engineTemplateHash": "new", "startedAt": "2026-11-29T09:00:00Z"}
    result = plan(back, pods, DAEMONS, "g1", NOW, previous, 2)
    assert retired(result) == ["n0"] and promoted(result) == [] and result.stalled is None
    after = plan(back, [*old_pair(0), *old_pair(1)], DAEMONS, "g1", NOW, rollout_status(result, back, NOW, previous), 2)
    assert after.phase == "Complete"
    status = rollout_status(
        after, back, NOW, {"phase": "Progressing", "engineTemplateHash": "old", "startedAt": "2026-11-29T09:59:00Z"}
    )
    assert status is not None and status["finishedAt"] == "2026-11-29T10:00:00Z"
    assert status["startedAt"] == "2026-11-29T09:59:00Z" and (status["updated"], status["total"]) == (2, 2)


def test_complete_stays_complete_until_something_is_outdated() -> None:
    done = {"phase": "Complete", "engineTemplateHash": "new", "finishedAt": "2026-11-29T09:00:00Z"}
    scaling = [engine("n0", 0, "active"), engine("m0", 0, "standby", ready=False)]
    result = plan(WANT, scaling, DAEMONS, "g1", NOW, done, 2)
    assert result.phase == "Complete" and rollout_status(result, WANT, NOW, done) == done


# --- generation change --------------------------------------------------------------------------


def test_the_service_keeps_the_old_generation_until_every_replica_has_a_ready_new_one() -> None:
    one = Desired(engine_hash="new", daemon_hash="g2", replicas=2, standbys=0, ready_deadline_s=60)
    views = [
        EngineView.of(p)
        for p in (
            engine("a0", 0, "active", "old", "g1"),
            engine("a1", 1, "active", "old", "g1"),
            engine("n0", 0, "standby", generation="g2"),
        )
    ]
    assert serve_hash(one, views, "g1") == "g1"
    views.append(EngineView.of(engine("n1", 1, "standby", generation="g2")))
    assert serve_hash(one, views, "g1") == "g1", "Ready, but not labelled active yet"
    labelled = [
        *views[:2],
        *(EngineView.of(engine(n, r, "active", generation="g2")) for n, r in (("n0", 0), ("n1", 1))),
    ]
    assert serve_hash(one, labelled, "g1") == "g2"
    # Nothing of the old generation serves any more and the new one serves something: switch.
    dead = [EngineView.of(engine("a0", 0, "active", "old", "g1", ready=False)), views[2]]
    assert serve_hash(one, dead, "g1") == "g2"
    # Neither serves (the old one may recover): stay, rather than select nothing Ready for good.
    neither = [dead[0], EngineView.of(engine("n0", 0, "standby", generation="g2", ready=False))]
    assert serve_hash(one, neither, "g1") == "g1"
    assert serve_hash(one, neither, "g2") == "g2", "a switch is never taken back"
    assert serve_hash(one, [], None) == "g2", "a new Service selects the current generation"


GEN = Desired(engine_hash="new", daemon_hash="g2", replicas=1, standbys=1, ready_deadline_s=60)


def test_generation_change_drains_the_node_without_serving_engines_first() -> None:
    pods = [
        engine("a0", 0, "active", "old", "g1", node="node-1"),
        engine("s0", 0, "standby", "old", "g1", node="node-2"),
    ]
    daemons = [daemon("d1", "node-1", "g1"), daemon("d2", "node-2", "g1")]
    result = plan(GEN, pods, daemons, "g1", NOW, None, 2)
    assert (result.mode, result.serve_hash, retired(result)) == ("Generation", "g1", ["s0"])
    assert daemon_replaced(result) is None, "the daemon goes only once its engines are gone"
    drained = plan(
        GEN,
        [pods[0], {**pods[1], "metadata": {**pods[1]["metadata"], "deletionTimestamp": "x"}}],
        daemons,
        "g1",
        NOW,
        None,
        2,
    )
    assert daemon_replaced(drained) is None and "draining" in drained.step
    result = plan(GEN, [pods[0]], daemons, "g1", NOW, None, 2)
    assert daemon_replaced(result) == "d2" and retired(result) == []


def test_generation_change_waits_for_the_replaced_daemon_then_surges_and_switches() -> None:
    active = engine("a0", 0, "active", "old", "g1", node="node-1")
    loading = [daemon("d1", "node-1", "g1"), daemon("d2b", "node-2", "g2", ready=False)]
    result = plan(GEN, [active], loading, "g1", NOW, None, 2)
    assert (result.create, daemon_replaced(result)) == ([], None) and "load" in result.step
    loaded = [daemon("d1", "node-1", "g1"), daemon("d2b", "node-2", "g2")]
    result = plan(GEN, [active], loaded, "g1", NOW, None, 2)
    assert result.create == [0] and daemon_replaced(result) is None and retired(result) == []
    assert "before draining node-1" in result.step, "node-1 still serves; it waits for the switch"
    surge = engine("n0", 0, "standby", generation="g2", node="node-2")
    result = plan(GEN, [active, surge], loaded, "g1", NOW, None, 2)
    # Promoted first, while the Service still selects g1; the switch comes in the next pass.
    assert result.serve_hash == "g1" and promoted(result) == ["n0"] and retired(result) == []
    assert held(result) == {"n0"}, "two actives for a moment: the scaler must not demote the new one"
    new_active = engine("n0", 0, "active", generation="g2", node="node-2")
    result = plan(GEN, [active, new_active], loaded, "g1", NOW, None, 2)
    # The switch: a0 keeps serving what still reaches it until the next pass.
    assert result.serve_hash == "g2" and result.switching and promoted(result) == [] and retired(result) == []
    assert held(result) == {"n0"}
    result = plan(GEN, [active, new_active], loaded, "g2", NOW, None, 2)
    assert not result.switching and retired(result) == ["a0"] and held(result) == set()
    # After the switch node-1 serves nothing: its old daemon is next, once a0 has drained.
    after = [engine("n0", 0, "active", generation="g2", node="node-2")]
    result = plan(GEN, after, loaded, "g2", NOW, None, 2)
    assert daemon_replaced(result) == "d1"
    done = plan(
        GEN,
        [*after, engine("m0", 0, "standby", generation="g2", node="node-2")],
        [daemon("d1b", "node-1", "g2"), loaded[1]],
        "g2",
        NOW,
        {"phase": "Progressing", "mode": "Generation"},
        2,
    )
    assert (done.mode, done.phase) == ("Generation", "Complete")


def report(ranks: list[tuple[str | None, int | None]], memory: dict[str, int | None]) -> DaemonReport:
    """A daemon's status report: (GPU UUID or None for cpu-shm, arena bytes) per rank, free bytes per device."""
    return DaemonReport(
        cache="tiny",
        ready=True,
        ranks=[RankReport(rank=i, ready=True, gpu_uuid=gpu, bytes=size) for i, (gpu, size) in enumerate(ranks)],
        memory=[
            DeviceMemory(
                device=d,
                free_bytes=f,
                total_bytes=None if f is None else f * 2,
                error=None if f is not None else "NVML: not found",
            )
            for d, f in memory.items()
        ],
    )


def test_generation_strategy_blue_green_only_with_room_for_a_second_copy_on_every_node() -> None:
    shm = {
        "d1": report([(None, 3 << 30), (None, 3 << 30)], {"host": 7 << 30}),
        "d2": report([(None, 3 << 30), (None, 3 << 30)], {"host": 64 << 30}),
    }
    mode, why = generation_strategy("Auto", "cpu-shm", shm)
    assert mode == "BlueGreen" and "2 daemons" in why
    # 6 GiB of arenas need 6.6 GiB with the headroom: 6.5 GiB free on one node is not enough.
    tight = {**shm, "d1": report([(None, 3 << 30), (None, 3 << 30)], {"host": int(6.5 * (1 << 30))})}
    mode, why = generation_strategy("Auto", "cpu-shm", tight)
    assert mode == "NodeByNode" and "host of d1" in why and "6.50 GiB free" in why and "6.60 GiB" in why
    assert generation_strategy("NodeByNode", "cpu-shm", shm) == (
        "NodeByNode",
        "spec.daemon.generationChange is NodeByNode",
    )
    mode, why = generation_strategy("Auto", "cpu-shm", {**shm, "d2": "GET http://10.0.0.2:9400/status: timed out"})
    assert mode == "NodeByNode" and "d2" in why and "timed out" in why
    mode, why = generation_strategy("Auto", "cpu-shm", {"d1": report([(None, None)], {"host": 1 << 40})})
    assert mode == "NodeByNode" and "rank 0" in why
    assert generation_strategy("Auto", "cpu-shm", {})[0] == "NodeByNode"


@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc"])
def test_generation_strategy_on_gpus_is_blue_green_when_every_gpu_has_room(backend: str) -> None:
    gpus = {
        "d1": report(
            [("GPU-a", 40 << 30), ("GPU-b", 40 << 30)], {"host": 1 << 40, "GPU-a": 90 << 30, "GPU-b": 50 << 30}
        )
    }
    mode, why = generation_strategy("Auto", backend, gpus)
    assert mode == "BlueGreen" and "GPUs the holder books" in why and "2 devices checked" in why
    # 40 GiB × 1.1 + the new daemon's CUDA context (1 GiB) = 45 GiB; 44.5 GiB free is not enough.
    short = {
        "d1": report(
            [("GPU-a", 40 << 30), ("GPU-b", 40 << 30)],
            {"host": 1 << 40, "GPU-a": 90 << 30, "GPU-b": int(44.5 * (1 << 30))},
        )
    }
    mode, why = generation_strategy("Auto", backend, short)
    assert mode == "NodeByNode" and "GPU-b of d1" in why and "44.50 GiB free" in why and "needs 45.00 GiB" in why
    mode, why = generation_strategy("Auto", backend, gpus, gpu_access="dra")
    assert mode == "NodeByNode" and "ResourceClaim of its own" in why
    blocked = "daemon pod tiny-daemon-x requests nvidia.com/gpu itself"
    assert generation_strategy("Auto", backend, gpus, gpus_shared=blocked) == ("NodeByNode", blocked)
    assert generation_strategy("NodeByNode", backend, gpus)[0] == "NodeByNode"
    # The blocker is about GPUs: host memory arenas ignore it.
    shm = {"d1": report([(None, 1 << 30)], {"host": 64 << 30})}
    assert generation_strategy("Auto", "cpu-shm", shm, gpus_shared=blocked)[0] == "BlueGreen"


def test_generation_strategy_on_gpus_says_what_it_could_not_read() -> None:
    unreadable = {"d1": report([("GPU-a", 40 << 30)], {"host": 1 << 40, "GPU-a": None})}
    mode, why = generation_strategy("Auto", "cuda-vmm", unreadable)
    assert mode == "NodeByNode" and "no free memory for GPU-a" in why and "NVML" in why


def test_blue_green_retires_the_old_daemonset_only_after_the_switch_and_the_drain() -> None:
    old_engines = [
        engine("a0", 0, "active", "old", "g1", node="node-1"),
        engine("s0", 0, "standby", "old", "g1", node="node-2"),
    ]
    both = [
        daemon("d1", "node-1", "g1"),
        daemon("d2", "node-2", "g1"),
        daemon("n1", "node-1", "g2", ready=False),
        daemon("n2", "node-2", "g2", ready=False),
    ]
    for pod in both[:2]:
        pod["metadata"]["ownerReferences"] = [{"name": "tiny-daemon", "controller": True}]
    old_sets = {"tiny-daemon": "g1"}
    loading = plan(GEN, old_engines, both, "g1", NOW, None, 2, old_sets)
    assert (loading.mode, loading.serve_hash) == ("Generation", "g1")
    assert retired(loading) == [] and daemon_replaced(loading) is None and daemonsets_deleted(loading) == []
    assert loading.create == [] and "old ones serve" in loading.step, "nothing moves before the new daemons load"
    loaded = [*both[:2], daemon("n1", "node-1", "g2"), daemon("n2", "node-2", "g2")]
    loaded[0]["metadata"]["ownerReferences"] = loaded[1]["metadata"]["ownerReferences"] = both[0]["metadata"][
        "ownerReferences"
    ]
    surge = plan(GEN, old_engines, loaded, "g1", NOW, None, 2, old_sets)
    assert surge.create == [0] and retired(surge) == [] and daemon_replaced(surge) is None
    new = engine("n0", 0, "standby", generation="g2", node="node-1")
    promote = plan(GEN, [*old_engines, new], loaded, "g1", NOW, None, 2, old_sets)
    assert promote.serve_hash == "g1" and promoted(promote) == ["n0"] and retired(promote) == []
    new_active = engine("n0", 0, "active", generation="g2", node="node-1")
    switch = plan(GEN, [*old_engines, new_active], loaded, "g1", NOW, None, 2, old_sets)
    assert switch.serve_hash == "g2" and switch.switching and promoted(switch) == [] and retired(switch) == []
    settling = plan(GEN, [*old_engines, new_active], loaded, "g2", NOW, None, 2, old_sets, settling=True)
    assert settling.switching and retired(settling) == [], "the switch has not reached every proxy yet"
    retire = plan(GEN, [*old_engines, new_active], loaded, "g2", NOW, None, 2, old_sets)
    assert not retire.switching and sorted(retired(retire)) == ["a0", "s0"]
    assert daemonsets_deleted(retire) == [], "the old engines still map the old arenas"
    draining = [{**p, "metadata": {**p["metadata"], "deletionTimestamp": "x"}} for p in old_engines]
    waiting = plan(GEN, [*draining, new_active], loaded, "g2", NOW, None, 2, old_sets)
    assert daemonsets_deleted(waiting) == [] and "draining 2 engines" in waiting.step
    assert daemon_replaced(waiting) is None, "blue/green never deletes a serving generation's daemon pod by pod"
    gone = plan(GEN, [new_active], loaded, "g2", NOW, None, 2, old_sets)
    assert daemonsets_deleted(gone) == ["tiny-daemon"] and daemon_replaced(gone) is None


def test_generation_condition_says_which_strategy_and_clears_afterwards() -> None:
    result = plan(GEN, [engine("a0", 0, "active", "old", "g1")], [daemon("d1", "node-1", "g1")], "g1", NOW, None, 1)
    conditions = rollout_conditions(result, ("NodeByNode", "no room"), NOW, [], 7)
    change = next(c for c in conditions if c["type"] == "GenerationChange")
    assert (change["status"], change["reason"], change["message"], change["observedGeneration"]) == (
        "True",
        "NodeByNode",
        "no room",
        7,
    )
    finished = plan(GEN, [], [], "g2", NOW, {"phase": "Complete"}, 0)
    cleared = rollout_conditions(finished, None, NOW, conditions, 8)
    assert [(c["type"], c["status"]) for c in cleared] == [("GenerationChange", "False")]


def test_status_lists_a_node_once_while_its_daemon_is_replaced() -> None:
    """status.nodes is a map keyed by node: two entries for one node are refused by the API server."""
    from weightcache_operator.observe.validation import parse
    from weightcache_operator.plan.status import Observed, aggregate

    body = {
        "apiVersion": "weightcache.io/v1alpha1",
        "kind": "WeightCache",
        "metadata": {"name": "tiny", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {
            "model": {"source": {"hostPath": {"path": "/m"}}},
            "parallelism": {"tensor": 1},
            "daemon": {"image": "i", "backend": "cpu-shm"},
            "engine": {"template": {"spec": {"containers": [{"name": "e", "image": "i"}]}}},
        },
    }
    cache, problems = parse(body)
    assert cache is not None and not problems
    old = daemon("d-old", "node-1", "g0", deleted=0)
    new = daemon("d-new", "node-1", "g1", ready=False)
    status = aggregate(cache, Observed([old, new], [], 1), NOW).wire()
    assert [(n["node"], n["daemonPod"]) for n in status["nodes"]] == [("node-1", "d-new")]
