"""Rollouts on the real control plane with the process kubelet and the operator as a process:
an engine template change rolls through under load without a failed request, a daemon restart
or a weight byte read from disk; a broken new version stalls and keeps the old one serving until
the spec is changed back; a daemon generation change never puts two fingerprints behind the
Service, and the cache's phase stays Ready through it while it serves."""

from __future__ import annotations

import copy
import json
import subprocess
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from operator_e2e import StatusRecorder, condition_of, http_json, http_text, is_ready, metric, sample, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.load import SteadyLoad
from testcluster.rest import Kube
from testcluster.sample import DAEMONS, ENGINES, NAME, events, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e

WC = "/apis/weightcache.io/v1alpha1/namespaces/{ns}/weightcaches/tiny-llama"


def apply(cluster: ControlPlane, namespace: str, body: dict) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))


def with_engine_env(body: dict, name: str, value: str) -> dict:
    body = copy.deepcopy(body)
    body["spec"]["engine"]["template"]["spec"]["containers"][0]["env"].append({"name": name, "value": value})
    return body


def daemon_facts(kube: Kube, namespace: str) -> dict[str, tuple[str, int, list[int]]]:
    """Node → (daemon pod uid, container restarts, each rank's disk_bytes_read as the daemon
    itself reports it on its status endpoint)."""
    facts = {}
    for pod in pods(kube, namespace, DAEMONS):
        own = http_json(f"http://{pod['status']['podIP']}:9400/status", timeout=10)
        restarts = sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))
        facts[pod["spec"]["nodeName"]] = (
            pod["metadata"]["uid"],
            restarts,
            [r["disk_bytes_read"] for r in own["ranks"]],
        )
    return facts


def rollout(kube: Kube, namespace: str, name: str = NAME) -> dict:
    """status.rollout of the WeightCache ``name``."""
    wc = f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/{name}"
    return (kube.get(wc).get("status") or {}).get("rollout") or {}


def reported(status: dict) -> bool:
    """Both nodes' daemons report their fingerprint in the status."""
    return len(status.get("nodes", [])) == 2 and all(n.get("fingerprint") for n in status["nodes"])


def replaced(before: dict) -> Callable[[dict], bool]:
    """A status whose generation change from ``before`` is complete: another daemon spec hash,
    the rollout Complete, and only new fingerprints on the nodes."""
    return lambda s: (
        reported(s)
        and s["daemonSpecHash"] != before["daemonSpecHash"]
        and (s.get("rollout") or {}).get("phase") == "Complete"
        and {n["fingerprint"] for n in s["nodes"]}.isdisjoint({n["fingerprint"] for n in before["nodes"]})
    )


def rollout_gauges(operator: subprocess.Popen, namespace: str) -> tuple[dict[str, float], float, float]:
    """What the operator's /metrics says of the cache's latest rollout (the chart's dashboard
    shows it): each phase's gauge, updated replicas, total replicas."""
    scraped = http_text(operator.metrics_url)  # type: ignore[attr-defined]
    mine = {"namespace": namespace, "cache": NAME}
    phases = {
        phase: metric(scraped, "weightcache_operator_rollout_phase", **mine, phase=phase)
        for phase in ("Progressing", "Stalled", "Complete")
    }
    return (
        phases,
        metric(scraped, "weightcache_operator_rollout_updated_replicas", **mine),
        metric(scraped, "weightcache_operator_rollout_replicas", **mine),
    )


def live_engine_names(kube: Kube, namespace: str) -> set[str]:
    """The engine pods not being deleted: a start on a busy machine can fail over once (an active
    slow to pass its probe is replaced), and the replaced pod may still be terminating at Ready."""
    return {p["metadata"]["name"] for p in pods(kube, namespace, ENGINES) if not p["metadata"].get("deletionTimestamp")}


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}


def test_template_change_rolls_through_without_failures_restarts_or_disk_reads(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    apply(cluster, namespace, sample())
    before_status = wait_phase(kube, namespace, operator, "Ready", also=reported)
    before = daemon_facts(kube, namespace)
    old_engines = live_engine_names(kube, namespace)
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(1)
    load = SteadyLoad(*proxy.address).start()
    try:
        apply(cluster, namespace, with_engine_env(sample(), "ENGINE_VERSION", "2"))
        wait_for(
            lambda: rollout(kube, namespace).get("phase") == "Progressing",
            30,
            describe=lambda: rollout(kube, namespace),
        )

        def rolled() -> bool:
            engines = [p for p in pods(kube, namespace, ENGINES)]
            return (
                rollout(kube, namespace).get("phase") == "Complete"
                and len(engines) == 2
                and all(env_of(p).get("ENGINE_VERSION") == "2" and is_ready(p) for p in engines)
            )

        wait_for(rolled, 300, interval=0.5, describe=lambda: (rollout(kube, namespace), pods(kube, namespace, ENGINES)))
    finally:
        result = load.stop()
    print(f"load during the rollout: {result}")
    assert result.ok > 0 and result.failed == [], result.failed
    # The Service never lost its ready active engine once it had one.
    assert all(change.ready for change in proxy.changes[1:]), [c.ready for c in proxy.changes]
    status = wait_phase(kube, namespace, operator, "Ready")
    done = status["rollout"]
    assert (done["mode"], done["updated"], done["total"]) == ("Engine", 1, 1) and done["finishedAt"] >= done[
        "startedAt"
    ]
    assert not old_engines & {p["metadata"]["name"] for p in pods(kube, namespace, ENGINES)}, "every old engine retired"
    # The replica's time: its new engine's start, the promotion, the old engines' drain.
    [timing] = done["replicas"]
    print(f"replica timing: {timing}")
    assert timing["replica"] == 0 and timing["engine"] not in old_engines, timing
    assert timing["startSeconds"] >= 1 and timing["promotionSeconds"] >= 0, timing
    assert timing["retiredAt"] == timing["promotedAt"] and timing["drainSeconds"] >= 0, "one pass promotes and drains"
    # The status is patched just before the gauges are set, in the same pass.
    wait_for(
        lambda: rollout_gauges(operator, namespace) == ({"Progressing": 0, "Stalled": 0, "Complete": 1}, 1, 1),
        10,
        describe=lambda: rollout_gauges(operator, namespace),
    )
    # No daemon restarted or re-read the checkpoint: same pods, same restart counts, same counters.
    assert daemon_facts(kube, namespace) == before
    assert status["daemonSpecHash"] == before_status["daemonSpecHash"]
    disk = [r["diskBytesRead"] for n in status["nodes"] for r in n["ranks"]]
    assert disk == [r["diskBytesRead"] for n in before_status["nodes"] for r in n["ranks"]]
    assert len(events(kube, namespace, "RolloutComplete")) >= 1
    host, port = proxy.address
    health = http_json(f"http://{host}:{port}/health")
    assert [r["weights"]["mode"] for r in health["ranks"]] == ["cache", "cache"], health


def test_template_change_rolls_engine_groups_over_two_nodes_without_failures(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    """parallelism.nodes 2: each engine is a group of two pods; a new engine version starts as a
    whole new standby group, takes over once all of it is Ready, and the old groups drain."""
    body = sample(parallelism__nodes=2)
    apply(cluster, namespace, body)
    wait_phase(kube, namespace, operator, "Ready", timeout=480)
    before = daemon_facts(kube, namespace)
    old_engines = live_engine_names(kube, namespace)
    assert len(old_engines) == 4, "an active and a standby group of two pods each"
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(1)
    load = SteadyLoad(*proxy.address).start()
    try:
        apply(cluster, namespace, with_engine_env(body, "ENGINE_VERSION", "2"))

        def rolled() -> bool:
            engines = pods(kube, namespace, ENGINES)
            return len(engines) == 4 and all(env_of(p).get("ENGINE_VERSION") == "2" and is_ready(p) for p in engines)

        wait_for(
            rolled,
            420,
            interval=0.5,
            describe=lambda: [
                (p["metadata"]["name"], env_of(p).get("ENGINE_VERSION"), is_ready(p))
                for p in pods(kube, namespace, ENGINES)
            ],
        )
    finally:
        result = load.stop()
    print(f"load during the group rollout: {result}")
    assert result.ok > 0 and result.failed == [], result.failed
    assert all(change.ready for change in proxy.changes[1:]), [c.ready for c in proxy.changes]
    engines = pods(kube, namespace, ENGINES)
    assert not old_engines & {p["metadata"]["name"] for p in engines}, "every old pod retired"
    roles = Counter(p["metadata"]["labels"]["weightcache.io/role"] for p in engines)
    assert roles == {"active": 2, "standby": 2}, roles
    assert len({p["metadata"]["labels"]["weightcache.io/engine-group"] for p in engines}) == 2
    assert daemon_facts(kube, namespace) == before, "no daemon restarted or read the checkpoint again"
    host, port = proxy.address
    health = http_json(f"http://{host}:{port}/health")
    assert [(r["rank"], r["weights"]["mode"]) for r in health["ranks"]] == [(0, "cache"), (1, "cache")], health
    # Reported as single-node rollouts are: status.rollout and the Progressing condition.
    wait_for(
        lambda: rollout(kube, namespace).get("phase") == "Complete",
        60,
        interval=0.5,
        describe=lambda: rollout(kube, namespace),
    )
    done = rollout(kube, namespace)
    assert (done["mode"], done["updated"], done["total"], done["currentStep"]) == (
        "Engine",
        1,
        1,
        "every replica updated",
    )
    assert done["startedAt"] <= done["finishedAt"]


def test_broken_version_stalls_keeps_serving_and_reverting_resumes(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    good = sample(engine__rollout={"readyDeadlineSeconds": 15})
    apply(cluster, namespace, good)
    wait_phase(kube, namespace, operator, "Ready")
    serving = {
        p["metadata"]["name"]: p["metadata"]["labels"]["weightcache.io/role"] for p in pods(kube, namespace, ENGINES)
    }
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(1)

    broken = copy.deepcopy(good)
    broken["spec"]["engine"]["template"]["spec"]["containers"][0]["command"] = [
        "python",
        "-c",
        "import sys; print('this engine version is broken'); sys.exit(3)",
    ]
    apply(cluster, namespace, broken)
    wait_for(
        lambda: rollout(kube, namespace).get("phase") == "Stalled",
        120,
        interval=0.5,
        describe=lambda: rollout(kube, namespace),
    )
    stalled = kube.get(WC.format(ns=namespace))["status"]
    progressing = next(c for c in stalled["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "RolloutStalled")
    assert "readyDeadlineSeconds" in progressing["message"] and "readyDeadlineSeconds" in stalled["rollout"]["message"]
    assert events(kube, namespace, "RolloutStalled"), "a Warning event says why"
    wait_for(
        lambda: rollout_gauges(operator, namespace)[0] == {"Progressing": 0, "Stalled": 1, "Complete": 0},
        10,
        describe=lambda: rollout_gauges(operator, namespace),
    )
    # The old version keeps serving: same active, Ready, answering through the Service.
    now = {p["metadata"]["name"]: p for p in pods(kube, namespace, ENGINES)}
    for name, role in serving.items():
        assert now[name]["metadata"]["labels"]["weightcache.io/role"] == role and is_ready(now[name]), name
    assert len(now) == 3, "the broken pod is kept (for its logs), not retried in a loop"
    host, port = proxy.address
    assert http_json(f"http://{host}:{port}/v1/completions", {"prompt": "a", "max_tokens": 2})["choices"]

    apply(cluster, namespace, good)
    wait_for(
        lambda: rollout(kube, namespace).get("phase") == "Complete",
        60,
        interval=0.5,
        describe=lambda: rollout(kube, namespace),
    )
    wait_for(
        lambda: sorted(p["metadata"]["name"] for p in pods(kube, namespace, ENGINES)) == sorted(serving),
        60,
        describe=lambda: [p["metadata"]["name"] for p in pods(kube, namespace, ENGINES)],
    )
    status = wait_phase(kube, namespace, operator, "Ready")
    assert next(c for c in status["conditions"] if c["type"] == "Progressing")["status"] == "False"
    assert http_json(f"http://{host}:{port}/v1/completions", {"prompt": "a", "max_tokens": 2})["choices"]


@pytest.mark.parametrize("strategy", ["NodeByNode", "BlueGreen"])
def test_generation_change_never_mixes_fingerprints_behind_the_service(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,
    strategy: str,  # type: ignore[no-untyped-def]
) -> None:
    """NodeByNode (asked for in the spec): nodes are drained and their daemons replaced one at a
    time. BlueGreen (``Auto``; the daemons report the host's free memory, and a tiny model fits
    twice): the new generation's DaemonSet loads next to the old one, engines move over, and the
    old DaemonSet goes last — no request fails even without a retry."""
    requested = "NodeByNode" if strategy == "NodeByNode" else "Auto"
    apply(cluster, namespace, sample(daemon__generationChange=requested))
    before = wait_phase(kube, namespace, operator, "Ready", also=reported)
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(1)

    # Every engine pod IP ever seen → the daemon generation it maps, recorded while things change;
    # and each node's Ready daemon generations, sampled at the same time.
    generation_of: dict[str, str] = {}
    resident: list[dict[str, set[str]]] = []
    stop = threading.Event()

    def watch_pods() -> None:
        while not stop.is_set():
            for pod in pods(kube, namespace, ENGINES):
                ip = pod["status"].get("podIP")
                if ip:
                    generation_of.setdefault(ip, pod["metadata"]["annotations"]["weightcache.io/daemon-spec-hash"])
            held: dict[str, set[str]] = {}
            for pod in pods(kube, namespace, DAEMONS):
                if is_ready(pod):
                    held.setdefault(pod["spec"]["nodeName"], set()).add(
                        pod["metadata"]["annotations"]["weightcache.io/daemon-spec-hash"]
                    )
            resident.append(held)
            stop.wait(0.1)

    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    recorder = StatusRecorder(kube, namespace).start()
    load = SteadyLoad(*proxy.address).start()
    try:
        apply(cluster, namespace, sample(model__revision="seed-1", daemon__generationChange=requested))
        after = wait_phase(kube, namespace, operator, "Ready", timeout=400, also=replaced(before))
        if strategy == "BlueGreen":  # the old DaemonSet's pods are deleted in the background
            wait_for(
                lambda: (
                    {
                        p["metadata"]["annotations"]["weightcache.io/daemon-spec-hash"]
                        for p in pods(kube, namespace, DAEMONS)
                    }
                    == {after["daemonSpecHash"]}
                ),
                60,
            )
    finally:
        result = load.stop()
        stop.set()
        watcher.join()
        statuses = recorder.stop()
    print(f"load during the generation change: {result}")
    # The phase is honest through the change: Ready whenever every replica has a Ready active
    # (Available), whichever generation it is of; GenerationChange and the CHANGE column say what moves.
    phases = [
        (
            s.get("phase"),
            condition_of(s, "Available").get("status"),
            s.get("generationChange"),
            condition_of(s, "GenerationChange").get("status"),
        )
        for s in statuses
    ]
    print(f"{len(phases)} statuses written during the change (phase, Available, generationChange, GenerationChange):")
    print(phases)
    assert all(phase == "Ready" for phase, available, _, _ in phases if available == "True"), phases
    assert (strategy, "True") in {(column, changing) for _, _, column, changing in phases}, phases
    assert phases[-1][2:] == (None, "False"), "the change ended: no column, GenerationChange False"
    assert after["rollout"]["mode"] == "Generation" and len({n["fingerprint"] for n in after["nodes"]}) == 1
    seen = [{generation_of.get(e.rsplit(":", 1)[0], "?") for e in change.ready} for change in proxy.changes]
    print("generations behind the Service, change by change:", seen)
    assert all(len(gens) <= 1 for gens in seen), seen
    assert {g for gens in seen for g in gens} == {before["daemonSpecHash"], after["daemonSpecHash"]}
    assert "?" not in {g for gens in seen for g in gens}
    progress = [e["message"] for e in events(kube, namespace, "RolloutProgressing")]
    both_on_a_node = any(len(gens) == 2 for held in resident for gens in held.values())
    daemonsets = kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"]
    # Where each node's new ranks came from (seeding is on by default): node by node, the first node
    # replaced reads its disk and the second copies from it; blue/green starts both at once.
    sources = {n["node"]: sorted({(r.get("source"), r.get("seedPeer")) for r in n["ranks"]}) for n in after["nodes"]}
    print("where each node's ranks came from:", sources)
    if strategy == "NodeByNode":
        (first,) = [node for node, got in sources.items() if got == [("disk", None)]]
        assert [got for node, got in sources.items() if node != first] == [[("peer", first)]], sources
        assert any("NodeByNode: spec.daemon.generationChange is NodeByNode" in m for m in progress), progress
        assert not both_on_a_node, "node by node never holds two generations on a node"
        assert [d["metadata"]["name"] for d in daemonsets] == ["tiny-llama-daemon"], "updated in place"
    else:
        assert any("BlueGreen: every daemon has room for a second copy" in m for m in progress), progress
        both = {node for held in resident for node, gens in held.items() if len(gens) == 2}
        assert len(both) == 2, f"each node held both generations at some point, saw only {both}"
        assert [d["metadata"]["name"] for d in daemonsets] == [f"tiny-llama-daemon-{after['daemonSpecHash'][:10]}"]
        assert result.failed == [] and result.retried == 0, (
            f"blue/green keeps Ready engines behind the Service: {result}"
        )
        assert not [c for c in proxy.changes if not c.ready], "the Service never had no Ready endpoint"
        assert {phase for phase, *_ in phases} == {"Ready"}, f"blue/green serves throughout: {phases}"
    condition = next(c for c in after["conditions"] if c["type"] == "GenerationChange")
    assert (condition["status"], condition["reason"]) == ("False", "Converged")
    assert result.ok > 0
    host, port = proxy.address
    health = http_json(f"http://{host}:{port}/health")
    assert [r["weights"]["mode"] for r in health["ranks"]] == ["cache", "cache"], health
    daemons = pods(kube, namespace, DAEMONS)
    assert {p["metadata"]["annotations"]["weightcache.io/daemon-spec-hash"] for p in daemons} == {
        after["daemonSpecHash"]
    }
    assert json.dumps(after).count(before["daemonSpecHash"]) == 0


def test_generation_change_of_engine_groups_goes_blue_green_without_a_gap(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    """parallelism.nodes 2, new weights: a second set of slot DaemonSets loads next to the old one,
    a new engine group starts on it and is promoted next to the old active, the Service switches
    once the new group is labelled active, the old groups drain and the old slot DaemonSets go —
    with no failed request, no retry, no moment without a Ready endpoint and never two
    fingerprints behind the Service."""
    apply(cluster, namespace, sample(parallelism__nodes=2))
    before = wait_phase(kube, namespace, operator, "Ready", timeout=480, also=reported)
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(1)
    generation_of: dict[str, str] = {}
    stop = threading.Event()

    def watch_pods() -> None:
        while not stop.is_set():
            for pod in pods(kube, namespace, ENGINES):
                if ip := pod["status"].get("podIP"):
                    generation_of.setdefault(ip, pod["metadata"]["annotations"]["weightcache.io/daemon-spec-hash"])
            stop.wait(0.1)

    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    load = SteadyLoad(*proxy.address).start()
    try:
        apply(cluster, namespace, sample(parallelism__nodes=2, model__revision="seed-1"))
        after = wait_phase(kube, namespace, operator, "Ready", timeout=480, also=replaced(before))
        wait_for(
            lambda: (
                {
                    p["metadata"]["annotations"]["weightcache.io/daemon-spec-hash"]
                    for p in pods(kube, namespace, DAEMONS)
                }
                == {after["daemonSpecHash"]}
            ),
            120,
        )
    finally:
        result = load.stop()
        stop.set()
        watcher.join()
    print(f"load during the group generation change: {result}")
    assert result.ok > 0 and result.failed == [] and result.retried == 0, result
    assert not [c for c in proxy.changes if not c.ready], "the Service never had no Ready endpoint"
    seen = [{generation_of.get(e.rsplit(":", 1)[0], "?") for e in change.ready} for change in proxy.changes]
    assert all(len(gens) == 1 for gens in seen) and {g for gens in seen for g in gens} == {
        before["daemonSpecHash"],
        after["daemonSpecHash"],
    }, seen
    progress = [e["message"] for e in events(kube, namespace, "RolloutProgressing")]
    assert any("BlueGreen: every daemon has room for a second copy" in m for m in progress), progress
    daemonsets = sorted(
        d["metadata"]["name"] for d in kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"]
    )
    assert daemonsets == [f"tiny-llama-daemon-{after['daemonSpecHash'][:10]}-{slot}" for slot in (0, 1)]
    assert (after["rollout"]["mode"], after["rollout"]["updated"], after["rollout"]["total"]) == ("Generation", 1, 1)
    host, port = proxy.address
    health = http_json(f"http://{host}:{port}/health")
    assert [(r["rank"], r["weights"]["mode"]) for r in health["ranks"]] == [(0, "cache"), (1, "cache")], health
