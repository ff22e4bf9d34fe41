"""Specs the API server accepts but the nodes cannot run, tried as a new user would: each ends
Failed, and the planner's (the daemon pod's `plan` init container), the daemon's or the GPU
holder's own words reach the places a user looks — `kubectl get wc` (PHASE and MESSAGE), the
DaemonsReady condition per node, and the Events of `kubectl describe wc`. One small test per case
on the helpers below."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from operator_e2e import apply_sample, http_json, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import DAEMONS, pods
from testcluster.waiting import wait_for
from weightcache.tools.sample_checkpoints import ModelSpec, write_sparse_checkpoint

pytestmark = pytest.mark.e2e


def refused(cluster: ControlPlane, kube: Kube, namespace: str, operator: subprocess.Popen, **changes: object) -> dict:
    """Applies the sample with ``changes`` and returns the status once it says Failed."""
    apply_sample(cluster, namespace, **changes)
    return wait_phase(kube, namespace, operator, "Failed", timeout=240)


def daemons_ready(status: dict) -> str:
    return next(c["message"] for c in status["conditions"] if c["type"] == "DaemonsReady")


def what_a_user_reads(cluster: ControlPlane, namespace: str, status: dict, reason: str) -> None:
    """The reason, per node, in the condition; in `kubectl get wc`; in `kubectl describe wc` Events."""
    assert f"node-1, node-2: {reason}" in daemons_ready(status), daemons_ready(status)
    row = cluster.kubectl("get", "wc", "tiny-llama", "-n", namespace, "--no-headers").stdout
    assert row.split()[1] == "Failed" and f"every node refuses this spec: {reason}" in row, row

    def described() -> str:
        return cluster.kubectl("describe", "wc", "tiny-llama", "-n", namespace).stdout

    # Events are posted right after the status: give the API server a moment.
    events = lambda: described().partition("\nEvents:")[2]  # noqa: E731
    seen = wait_for(lambda: (t := events()) and "Refused" in t and "PhaseFailed" in t and t, 30, describe=described)
    assert f"node-1, node-2: {reason}" in seen and f"every node refuses this spec: {reason}" in seen, seen


def remove(cluster: ControlPlane, namespace: str) -> None:
    """Deleting a refused cache completes: its finalizer stops the crash-looping pods."""
    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=90s")


def test_a_tensor_size_that_does_not_divide_the_heads(
    cluster: ControlPlane, kube: Kube, namespace: str, operator: subprocess.Popen, checkpoint: Path
) -> None:
    status = refused(cluster, kube, namespace, operator, parallelism={"tensor": 3})
    what_a_user_reads(
        cluster,
        namespace,
        status,
        "plan exited with code 2: 3 of 3 ranks refused: "
        "num_attention_heads=8 is not divisible by tensor-parallel size 3; use a tp size that divides 8",
    )
    remove(cluster, namespace)


def test_a_pipeline_size_larger_than_the_layer_count(
    cluster: ControlPlane, kube: Kube, namespace: str, operator: subprocess.Popen, checkpoint: Path
) -> None:
    status = refused(cluster, kube, namespace, operator, parallelism={"tensor": 1, "pipeline": 5})
    what_a_user_reads(
        cluster,
        namespace,
        status,
        "plan exited with code 2: 5 of 5 ranks refused: pipeline size 5 exceeds the model's 4 layers",
    )
    remove(cluster, namespace)


def test_an_impossible_plan_fails_before_any_rank_process_starts(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    tmp_path: Path,
) -> None:
    """128 ranks of a two-layer model on each node: the plan refuses it from the headers alone,
    so the daemon container — which would start 128 rank processes — never runs."""
    made = write_sparse_checkpoint(tmp_path / "two-layers", ModelSpec(num_layers=2, shards=1))
    for node in ("node-1", "node-2"):
        target = kubelet.node_root(node) / "models" / "two-layers"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(made, target, dirs_exist_ok=True)
    status = refused(
        cluster,
        kube,
        namespace,
        operator,
        model={"source": {"hostPath": {"path": "/models/two-layers"}}, "dtype": "float32"},
        parallelism={"tensor": 2, "pipeline": 64},
    )
    what_a_user_reads(
        cluster,
        namespace,
        status,
        "plan exited with code 2: 128 of 128 ranks refused: pipeline size 64 exceeds the model's 2 layers",
    )
    assert "plan" not in status, "a refused plan has no summary"
    daemon_pods = pods(kube, namespace, DAEMONS)
    assert len(daemon_pods) == 2
    for pod in daemon_pods:
        (daemon,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "daemon"]
        # Never started: no process, no exit, no restart.
        assert list(daemon["state"]) == ["waiting"] and not daemon.get("lastState"), daemon
        assert daemon["restartCount"] == 0 and "containerID" not in daemon, daemon
    remove(cluster, namespace)


def test_a_host_path_without_a_checkpoint(
    cluster: ControlPlane, kube: Kube, kubelet: ProcessKubelet, namespace: str, operator: subprocess.Popen
) -> None:
    for node in ("node-1", "node-2"):
        (kubelet.node_root(node) / "models" / "empty").mkdir(parents=True, exist_ok=True)
    status = refused(
        cluster,
        kube,
        namespace,
        operator,
        model={"source": {"hostPath": {"path": "/models/empty"}}, "dtype": "float32"},
    )
    what_a_user_reads(
        cluster,
        namespace,
        status,
        "plan exited with code 2: /weightcache/model/config.json is missing: "
        "a Hugging Face checkpoint needs its config.json",
    )
    remove(cluster, namespace)


def test_a_gpu_backend_on_nodes_whose_daemons_cannot_use_a_gpu(
    cluster: ControlPlane, kube: Kube, namespace: str, operator: subprocess.Popen, checkpoint: Path
) -> None:
    """The nodes advertise nvidia.com/gpu, so the GPU holder pods are placed, but nothing there can
    read a GPU: the holders exit, and the daemons, waiting for their grant, say so themselves."""
    status = refused(
        cluster, kube, namespace, operator, daemon={"image": "weightcache/daemon:0.1.0", "backend": "cuda-vmm"}
    )
    # The holders may crash before the pass that reads the plan container's summary: the status
    # says Failed first and gains the plan on a later pass.
    status = wait_phase(kube, namespace, operator, "Failed", timeout=60, also=lambda found: "plan" in found)
    what_a_user_reads(
        cluster,
        namespace,
        status,
        "gpu-holder exited with code 2: the GPU holder reads its GPUs through NVML, which failed",
    )
    # The plan passed before the daemons started waiting: its summary, and why no GPU limit was checked.
    plan = status["plan"]
    assert plan["ranks"] == 2 and 0 < plan["maxRankBytes"] <= plan["totalBytes"] == plan["nodeBytes"], plan
    assert "limitBytes" not in plan and plan["limit"].startswith("no GPU memory known: "), plan
    for pod in pods(kube, namespace, DAEMONS):

        def own(pod: dict = pod) -> dict:
            return http_json(f"http://{pod['status']['podIP']}:9400/status", timeout=10)

        # Its ranks start (imports) before they wait: "starting" until then.
        wait_for(
            lambda own=own: all(
                "waiting for the GPU holder's grant before touching any GPU: no GPU holder runs" in r["problem"]
                for r in own()["ranks"]
            ),
            30,
            describe=lambda own=own: json.dumps(own(), indent=1),
        )
    remove(cluster, namespace)
