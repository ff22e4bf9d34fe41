"""Plans refused before any rank starts: the daemon pod's ``plan`` init container (rendered from the
typed spec), its verdict (the daemon's own planner over headers: refusals in one line with the
fix, ranks that cannot fit), and what the operator makes of its termination message (Failed with
the planner's words, ``status.plan``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from builders import NOW, container_status, make, terminated
from cache_status import CACHE, cache_daemon, condition
from weightcache.checkpoints.planner import MemoryLimit, plan_world, verdict
from weightcache.tools.sample_checkpoints import ModelSpec, write_sparse_checkpoint
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.plan_summary import PlanSummary
from weightcache_operator.plan.reasons import failure_events
from weightcache_operator.plan.status import Observed, aggregate, plan_status
from weightcache_operator.render import daemon_daemonset
from weightcache_operator.render.plan import memory_bytes
from weightcache_operator.spec import WeightCacheStatus

GIB = 2**30
DEEP = "128 of 128 ranks refused: pipeline size 64 exceeds the model's 2 layers"


def init_containers(ds: dict[str, Any]) -> list[dict[str, Any]]:
    return list(ds["spec"]["template"]["spec"]["initContainers"])


def plan_container(ds: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in init_containers(ds) if c["name"] == "plan")


def planned(pod: dict[str, Any], code: int, message: str, *, waiting_again: bool = False) -> dict[str, Any]:
    """``pod`` (a daemon pod) whose ``plan`` init container ended with ``code`` and ``message``; its
    containers not started. ``waiting_again``: refused and in back-off (the exit in lastState)."""
    ended = terminated(code, message)
    plan = (
        container_status("plan", restarts=1, waiting="CrashLoopBackOff", last_exit=ended)
        if waiting_again
        else container_status("plan", restarts=0, exited=ended)
    )
    pod["status"]["initContainerStatuses"] = [container_status("own-host-dirs", exited={"exitCode": 0}), plan]
    if code:
        pod["status"]["containerStatuses"] = [container_status("daemon", waiting="PodInitializing")]
    return pod


def summary(**changes: Any) -> str:
    fields: dict[str, Any] = {
        "ranks": 2,
        "max_rank_bytes": 3 * GIB,
        "total_bytes": 6 * GIB,
        "node_bytes": 6 * GIB,
        "limit_bytes": 64 * GIB,
        "limit": "the node's RAM (MemTotal)",
    }
    return PlanSummary(**{**fields, **changes}).model_dump_json()


# --- the init container, from the typed spec ------------------------------------------------------


def test_the_daemon_pod_plans_its_ranks_after_owning_its_directories_and_before_any_rank_starts() -> None:
    ds = daemon_daemonset(make(**{"parallelism": {"tensor": 2, "pipeline": 3}}))
    assert [c["name"] for c in init_containers(ds)] == ["own-host-dirs", "plan"]
    plan = plan_container(ds)
    assert plan["command"] == [
        *("python", "-m", "weightcache", "plan"),
        *("--model", "/weightcache/model", "--dtype", "float32", "--quantization", "none"),
        *("--tp", "2", "--pp", "3", "--ep", "1", "--verdict", "--ranks", "0-5", "--fit", "host"),
    ]
    assert plan["image"] == "wc/daemon:1"
    assert plan["volumeMounts"] == [{"name": "model", "mountPath": "/weightcache/model", "readOnly": True}]
    # Its verdict reaches the operator as its termination message.
    assert plan["terminationMessagePath"] == "/dev/termination-log"
    assert {"name": "WEIGHTCACHE_TERMINATION_LOG", "value": "/dev/termination-log"} in plan["env"]


def test_the_plan_checks_a_cpu_nodes_ranks_against_the_daemon_containers_memory_limit() -> None:
    ds = daemon_daemonset(make(**{"daemon.resources": {"limits": {"memory": "64Gi"}}}))
    assert plan_container(ds)["command"][-4:] == ["--fit", "host", "--memory-limit", str(64 * GIB)]


def test_a_gpu_backends_plan_checks_each_rank_against_the_gpus_nvml_sees_in_the_pod() -> None:
    ds = daemon_daemonset(make(**{"daemon.backend": "cuda-vmm", "daemon.resources": {"limits": {"memory": "8Gi"}}}))
    plan = plan_container(ds)
    assert plan["command"][-2:] == ["--fit", "gpu"], "a host memory limit says nothing about GPU memory"
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in plan["env"]


def test_an_fp8_cache_plans_with_its_block_size_and_the_revision_stays_out_of_the_plan() -> None:
    ds = daemon_daemonset(make(**{"model.quantization": {"method": "fp8"}}))
    command = plan_container(ds)["command"]
    assert command[command.index("--quantization") + 1 :][:3] == ["fp8", "--weight-block-size", "128,128"]
    assert "--revision" not in command


def test_each_slot_daemon_plans_the_whole_world_and_checks_its_own_ranks() -> None:
    from weightcache_operator.render.daemon import daemon_daemonsets

    sets = daemon_daemonsets(make(**{"parallelism": {"tensor": 4, "nodes": 2}}), [["node-a"], ["node-b"]])
    commands = [plan_container(ds)["command"] for ds in sets]
    assert [c[c.index("--ranks") + 1] for c in commands] == ["0-1", "2-3"]
    assert all(c[c.index("--tp") + 1] == "4" for c in commands)


def test_memory_quantities_are_read_in_bytes_and_forms_it_does_not_know_are_not_guessed() -> None:
    assert memory_bytes("64Gi") == 64 * GIB
    assert memory_bytes("1.5G") == 1_500_000_000
    assert memory_bytes(1024) == 1024
    assert memory_bytes("100m") is None and memory_bytes("1e3") is None and memory_bytes(None) is None


# --- the verdict (the daemon's planner, headers only) ---------------------------------------------


@pytest.fixture(scope="module")
def two_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_sparse_checkpoint(tmp_path_factory.mktemp("ck"), ModelSpec(num_layers=2, shards=1)))


def test_a_pipeline_deeper_than_the_model_is_refused_in_one_line_for_every_rank(two_layers: Path) -> None:
    world = plan_world(str(two_layers), 2, 64)
    with pytest.raises(WeightCacheError) as refused:
        verdict(world, list(range(128)), None)
    assert str(refused.value) == DEEP


def test_a_rank_larger_than_the_largest_gpu_is_refused_with_the_fix(two_layers: Path) -> None:
    world = plan_world(str(two_layers), 2, 1)
    small = MemoryLimit(1000, "the largest of this node's 8 GPUs", per_rank=True)
    with pytest.raises(WeightCacheError, match=r"^ranks 0-1 need up to .* GiB of the largest of this node's 8 GPUs; "):
        verdict(world, [0, 1], small)
    with pytest.raises(WeightCacheError, match=r"^rank 1 needs .*raise parallelism.tensor or parallelism.pipeline"):
        verdict(world, [1], small)


def test_a_nodes_ranks_beyond_its_memory_are_refused_together_and_a_plan_that_fits_is_summarised(
    two_layers: Path,
) -> None:
    world = plan_world(str(two_layers), 2, 1)
    per_rank = world.ranks[0].arena_bytes
    tight = MemoryLimit(per_rank + 1, "the daemon container's memory limit", per_rank=False)
    with pytest.raises(WeightCacheError, match=r"^this node's ranks 0-1 need .* together, .*parallelism.nodes"):
        verdict(world, [0, 1], tight)
    fits = verdict(world, [1], tight)
    assert (fits.ranks, fits.node_bytes, fits.limit_bytes) == (2, world.ranks[1].arena_bytes, per_rank + 1)
    assert fits.total_bytes == sum(r.arena_bytes for r in world.ranks)
    unknown = verdict(world, [0, 1], None, "no GPU memory known: NVML lists no GPU here")
    assert (unknown.limit_bytes, unknown.limit) == (None, "no GPU memory known: NVML lists no GPU here")
    assert len(unknown.model_dump_json()) < 1024, "a termination message, not a table"


# --- what the operator makes of it ----------------------------------------------------------------


def test_a_plan_every_node_refuses_fails_the_cache_with_the_planners_words_and_an_event() -> None:
    pods = [
        planned(cache_daemon(node="node-1"), 2, DEEP),
        planned(cache_daemon(node="node-2"), 2, DEEP, waiting_again=True),
    ]
    status = aggregate(CACHE, Observed(pods, [], 2), NOW).wire()
    WeightCacheStatus.model_validate(status)
    assert status["phase"] == "Failed"
    assert status["message"] == f"every node refuses this spec: plan exited with code 2: {DEEP}"
    ready = condition(status, "DaemonsReady")
    assert (ready["reason"], ready["message"]) == (
        "Refused",
        f"0/2 nodes ready; node-1, node-2: plan exited with code 2: {DEEP}",
    )
    assert ("Refused", ready["message"]) in failure_events([], WeightCacheStatus.model_validate(status).conditions)
    assert status["plan"] is None


def test_a_passed_plan_is_summarised_in_status_from_the_first_node_that_has_one() -> None:
    pods = [
        cache_daemon(node="node-1"),
        planned(cache_daemon(node="node-2"), 0, summary()),
        planned(cache_daemon(node="node-3"), 0, summary()),
    ]
    status = aggregate(CACHE, Observed(pods, [], 3), NOW).wire()
    WeightCacheStatus.model_validate(status)
    assert status["plan"] == {
        "ranks": 2,
        "maxRankBytes": 3 * GIB,
        "totalBytes": 6 * GIB,
        "node": "node-2",
        "nodeBytes": 6 * GIB,
        "limitBytes": 64 * GIB,
        "limit": "the node's RAM (MemTotal)",
    }
    assert status["phase"] == "Loading"


def test_an_older_generations_plan_or_an_unreadable_message_is_not_this_generations_plan() -> None:
    old = planned(cache_daemon(node="node-1", spec_hash="0ld"), 0, summary())
    cut = planned(cache_daemon(node="node-2"), 0, summary()[:40])
    assert aggregate(CACHE, Observed([old, cut], [], 2), NOW).wire()["plan"] is None
    # The next node's plan speaks instead of a cut one.
    found = plan_status([cut, planned(cache_daemon(node="node-3"), 0, summary(ranks=4))])
    assert found is not None and (found.ranks, found.node) == (4, "node-3")


def test_a_plan_that_passes_after_a_refusal_is_no_longer_a_reason() -> None:
    """The checkpoint was fixed on disk: the retried plan passed and the daemon loads."""
    pod = planned(cache_daemon(node="node-1"), 2, DEEP, waiting_again=True)
    plan = pod["status"]["initContainerStatuses"][1]
    plan["state"] = {"terminated": terminated(0, summary())}
    pod["status"]["containerStatuses"] = [container_status("daemon")]
    status = aggregate(CACHE, Observed([pod], [], 1), NOW).wire()
    assert status["phase"] == "Loading" and status["message"] is None, status["message"]
    assert status["plan"]["ranks"] == 2


def test_the_verdict_command_leaves_its_summary_or_its_refusal_as_the_termination_message(
    two_layers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from weightcache.cli import main

    message = tmp_path / "termination-log"
    monkeypatch.setenv("WEIGHTCACHE_TERMINATION_LOG", str(message))
    base = ["plan", "--model", str(two_layers), "--dtype", "float32", "--verdict", "--fit", "host"]
    assert main([*base, "--tp", "2", "--ranks", "0-1"]) == 0
    passed = PlanSummary.model_validate_json(message.read_text())
    assert passed.ranks == 2 and passed.limit == "the node's RAM (MemTotal)" and passed.limit_bytes
    assert main([*base, "--tp", "2", "--ranks", "0-1", "--memory-limit", "4096"]) == 2
    assert message.read_text().startswith("this node's ranks 0-1 need ")
    assert main([*base, "--tp", "2", "--pp", "64"]) == 2
    assert message.read_text() == DEEP
