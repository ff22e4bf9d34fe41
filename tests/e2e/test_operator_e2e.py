"""The operator as a real process against the real control plane and the process kubelet:
examples/weightcache-cpu.yaml → daemons Ready → engines Ready (gated on their node's daemon) →
a completion through the Service equal to an engine that read the checkpoint from disk.

The operator authenticates as a ServiceAccount bound to the ClusterRole below, so a missing or
excessive permission shows up here, not in production."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.kubelet.processes import CONTAINER_MARKER
from testcluster.rest import ApiError, Kube
from testcluster.sample import (
    DAEMONS,
    ENGINES,
    NAME,
    SAMPLE,
    events,
    generate_checkpoint,
    place_checkpoint,
    pods,
)
from testcluster.strays import MARKER, processes_with_environment
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PEERING = REPO / "crds" / "kopf-peering.yaml"
GATE = "weightcache.io/daemon-ready"
PROMPT = {"prompt": "The weight cache", "max_tokens": 8, "temperature": 0, "return_token_ids": True}

DEPLOY = REPO / "deploy" / "operator.yaml"
_DEPLOYED = list(yaml.safe_load_all(DEPLOY.read_text()))
CLUSTER_ROLE_RULES = next(d for d in _DEPLOYED if d["kind"] == "ClusterRole")["rules"]
"""The shipped least-privilege ClusterRole (the chart rendered with default values, whose peering
object is named like the operator's default peering): the operator under test runs with exactly
these rules."""
PEERING_OBJECT = next(d for d in _DEPLOYED if d["kind"] == "ClusterKopfPeering")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: dict | None = None, timeout: float = 60) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def checkpoint(kubelet: ProcessKubelet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated checkpoint at the sample's hostPath (/models/tiny-llama) on every node."""
    made = generate_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-llama")
    place_checkpoint(made, [kubelet.node_root(node) for node in ("node-1", "node-2")])
    return made


@pytest.fixture(scope="module")
def disk_completion(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The completion of an engine that loads the same checkpoint from disk (weight cache off);
    started at module setup so its torch import overlaps nothing a test waits on twice."""
    port = free_port()
    log = tmp_path_factory.mktemp("off") / "engine.log"
    sample = yaml.safe_load(SAMPLE.read_text())["spec"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "weightcache",
            "engine",
            "--model",
            str(checkpoint),
            "--tp-size",
            str(sample["parallelism"]["tensor"]),
            "--dtype",
            sample["model"]["dtype"],
            "--weight-cache-mode",
            "off",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--threads",
            "1",
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("contract", "daemon_image"))},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return http_json(f"http://127.0.0.1:{port}/ready", timeout=2) is not None
            except OSError:
                return False

        wait_for(ready, 180, interval=0.5, describe=lambda: log.read_text()[-2000:])
        yield http_json(f"http://127.0.0.1:{port}/v1/completions", PROMPT)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.fixture
def start_operator(
    cluster: ControlPlane, kube: Kube, namespace: str, weightcache_crd: str, tmp_path: Path, test_session_id: str
) -> Iterator[Callable[..., subprocess.Popen]]:
    """A factory: ``start_operator(priority=None, service_account="weightcache-operator")`` runs
    ``python -m weightcache_operator`` as that ServiceAccount (created on first use) bound to the
    shipped ClusterRole; every operator is stopped afterwards."""
    # The peering object (a template in the chart) maps only once its CRD is Established.
    cluster.kubectl("apply", "--server-side", "--field-manager=e2e", "-f", str(PEERING))
    cluster.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=30s")
    cluster.apply(yaml.safe_dump(PEERING_OBJECT))
    role = f"weightcache-operator-{namespace}"
    kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "weightcache-operator"}})
    kube.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles", {"metadata": {"name": role}, "rules": CLUSTER_ROLE_RULES}
    )
    kube.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "weightcache-operator", "namespace": namespace}],
        },
    )
    kubeconfigs = {"weightcache-operator": cluster.service_account_kubeconfig(namespace, "weightcache-operator")}
    started: list[subprocess.Popen] = []

    def kubeconfig_of(account: str) -> Path:
        if account not in kubeconfigs:
            kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": account}})
            binding = f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{role}"
            subjects = kube.get(binding)["subjects"] + [
                {"kind": "ServiceAccount", "name": account, "namespace": namespace}
            ]
            kube.patch(binding, {"subjects": subjects})
            kubeconfigs[account] = cluster.service_account_kubeconfig(namespace, account)
        return kubeconfigs[account]

    def start(priority: int | None = None, service_account: str = "weightcache-operator") -> subprocess.Popen:
        log = tmp_path / f"operator-{len(started)}.log"
        metrics_port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig_of(service_account)),
            "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("contract", "daemon_image", "operator")),
            "WEIGHTCACHE_OPERATOR_HEALTH": f"127.0.0.1:{free_port()}",
            "WEIGHTCACHE_OPERATOR_RESYNC_SECONDS": "5",
            "WEIGHTCACHE_OPERATOR_METRICS": f"127.0.0.1:{metrics_port}",
            MARKER: test_session_id,
        }
        if priority is not None:
            env["WEIGHTCACHE_OPERATOR_PRIORITY"] = str(priority)
        proc = subprocess.Popen(
            [sys.executable, "-m", "weightcache_operator"],
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.log = log  # type: ignore[attr-defined]
        proc.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"  # type: ignore[attr-defined]
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            stop_operator(proc)
        for kind in ("clusterrolebindings", "clusterroles"):
            try:
                kube.delete(f"/apis/rbac.authorization.k8s.io/v1/{kind}/{role}")
            except ApiError:
                pass
        for proc in started:
            print(f"--- operator {proc.pid} log tail\n{proc.log.read_text()[-6000:]}")  # type: ignore[attr-defined]


def stop_operator(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def operator(start_operator: Callable[..., subprocess.Popen]) -> subprocess.Popen:
    return start_operator()


def is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def gate(pod: dict) -> str | None:
    return next((c["status"] for c in pod["status"].get("conditions", []) if c["type"] == GATE), None)


def test_sample_becomes_ready_and_serves_the_disk_completion(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    disk_completion: dict,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
    wc = f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/tiny-llama"

    def phase() -> str | None:
        assert operator.poll() is None, operator.log.read_text()[-4000:]  # type: ignore[attr-defined]
        return (kube.get(wc).get("status") or {}).get("phase")

    wait_for(
        lambda: phase() == "Ready", 300, interval=0.5, describe=lambda: json.dumps(kube.get(wc).get("status"), indent=1)
    )

    daemons = pods(kube, namespace, "weightcache.io/cache=tiny-llama,weightcache.io/component=daemon")
    assert sorted(p["spec"]["nodeName"] for p in daemons) == ["node-1", "node-2"] and all(map(is_ready, daemons))
    engines = pods(kube, namespace, "weightcache.io/cache=tiny-llama,weightcache.io/component=engine")
    roles = sorted(p["metadata"]["labels"]["weightcache.io/role"] for p in engines)
    assert roles == ["active", "standby"] and all(map(is_ready, engines)) and all(gate(p) == "True" for p in engines)
    for engine in engines:
        assert engine["metadata"]["ownerReferences"][0]["kind"] == "WeightCache"

    status = kube.get(wc)["status"]
    assert (status["readyNodes"], status["activeEngines"], status["standbyEngines"]) == ("2/2", 1, 1)
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "DaemonsReady": "True",
        "EnginesReady": "True",
        "Available": "True",
        "Progressing": "False",
        "Degraded": "False",
        "CheckpointChanged": "False",
    }
    table = cluster.kubectl("get", "wc", "-n", namespace).stdout.splitlines()
    print("\n".join(table))
    assert table[0].split()[:8] == ["NAME", "PHASE", "READY", "NODES", "ACTIVE", "STANDBY", "SERVED", "MODEL"], table
    assert table[1].split()[:5] == ["tiny-llama", "Ready", "2/2", "1", "1"], table
    assert table[1].split()[5] == "tiny-llama", "engines serve under the cache's name"

    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(1)
    host, port = proxy.address
    served = http_json(f"http://{host}:{port}/v1/completions", PROMPT)
    assert served["choices"][0]["text"] == disk_completion["choices"][0]["text"]
    assert served["choices"][0].get("token_ids") == disk_completion["choices"][0].get("token_ids")
    # Clients can ask for the name kubectl get wc shows.
    assert http_json(f"http://{host}:{port}/v1/models")["data"][0]["id"] == "tiny-llama"
    named = http_json(f"http://{host}:{port}/v1/completions", {**PROMPT, "model": "tiny-llama"})
    assert named["model"] == "tiny-llama" and named["choices"][0]["text"] == served["choices"][0]["text"]
    # The engine behind the Service mapped the daemon's arena: no rank read the checkpoint.
    health = http_json(f"http://{host}:{port}/health")
    assert [r["weights"]["mode"] for r in health["ranks"]] == ["cache", "cache"], health


def sample(**spec_changes: object) -> dict:
    """The README sample with ``spec`` fields changed: ``engine__replicas=2`` sets spec.engine.replicas."""
    body = yaml.safe_load(SAMPLE.read_text())
    for path, value in spec_changes.items():
        *parents, leaf = path.split("__")
        node = body["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return body


def apply_sample(cluster: ControlPlane, namespace: str, **spec_changes: object) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(sample(**spec_changes)))


def wait_phase(
    kube: Kube,
    namespace: str,
    operator: subprocess.Popen,
    want: str,
    timeout: float = 300,
    also: Callable[[dict], bool] = lambda status: True,
    name: str = NAME,
) -> dict:
    """Waits for ``status.phase == want`` (and ``also(status)``) of the WeightCache ``name``: the
    status written after a change, not a stale one from before it."""
    wc = f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/{name}"

    def status() -> dict | None:
        assert operator.poll() is None, operator.log.read_text()[-4000:]  # type: ignore[attr-defined]
        found = kube.get(wc).get("status") or {}
        return found if found.get("phase") == want and also(found) else None

    return wait_for(status, timeout, interval=0.3, describe=lambda: json.dumps(kube.get(wc).get("status"), indent=1))


@pytest.fixture
def ready_sample(
    cluster: ControlPlane, kube: Kube, namespace: str, operator: subprocess.Popen, checkpoint: Path
) -> dict:
    """The README sample, unchanged, applied in the test's namespace once its checkpoint is on the
    nodes, and Ready under ``operator``: the status that said so. A module using it imports it
    with the fixtures it needs (``operator``, ``start_operator``, ``checkpoint``)."""
    apply_sample(cluster, namespace)
    return wait_phase(kube, namespace, operator, "Ready")


def by_role(kube: Kube, namespace: str, engines: str = ENGINES) -> dict[str, list[str]]:
    """The engine pods (``engines``: their label selector) not being deleted, by role."""
    found: dict[str, list[str]] = {"active": [], "standby": []}
    for pod in pods(kube, namespace, engines):
        if not pod["metadata"].get("deletionTimestamp"):
            found[pod["metadata"]["labels"]["weightcache.io/role"]].append(pod["metadata"]["name"])
    return found


def test_failover_gate_scaling_and_deletion(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    ready_sample: dict,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    before = by_role(kube, namespace)
    assert len(before["active"]) == 1 and len(before["standby"]) == 1

    # Deleting the active engine promotes the standby (its weights are mapped already) and a new
    # standby is created: the replica is whole again.
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/{before['active'][0]}")
    wait_for(
        lambda: by_role(kube, namespace)["active"] == before["standby"], 30, describe=lambda: by_role(kube, namespace)
    )
    wait_for(lambda: len(by_role(kube, namespace)["standby"]) == 1, 30, describe=lambda: by_role(kube, namespace))
    status = wait_phase(
        kube, namespace, operator, "Ready", also=lambda s: s["engines"][0]["active"] != before["active"][0]
    )
    assert status["engines"][0]["active"] == before["standby"][0]
    assert len(status["engines"][0]["standbys"]) == 1 and status["engines"][0]["standbys"] != before["standby"]

    # The active engine's processes die (its container restarts in place): the Ready standby
    # takes the Service's traffic at once; the crashed pod is retired and a new standby made.
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    crashed, standby = status["engines"][0]["active"], status["engines"][0]["standbys"][0]
    standby_ip = kube.get(f"/api/v1/namespaces/{namespace}/pods/{standby}")["status"]["podIP"]
    worker = kubelet.pod_worker(namespace, crashed)
    assert worker is not None and worker.runners[0].process is not None
    os.killpg(worker.runners[0].process.pid, signal.SIGKILL)
    wait_for(lambda: by_role(kube, namespace)["active"] == [standby], 30, describe=lambda: by_role(kube, namespace))
    wait_for(lambda: proxy.ready_endpoints == (f"{standby_ip}:8000",), 30, describe=lambda: proxy.ready_endpoints)
    host, port = proxy.address
    assert http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]
    status = wait_phase(kube, namespace, operator, "Ready", also=lambda s: s["engines"][0]["active"] == standby)
    assert len(status["engines"][0]["standbys"]) == 1 and crashed not in status["engines"][0]["standbys"]

    # The gate follows the node's daemon: it drops while that daemon is replaced, and returns.
    # (On the standby: an active on that node may be failed over and retired, see test_failover_e2e.)
    watched = next(
        p for p in pods(kube, namespace, ENGINES) if p["metadata"]["name"] == status["engines"][0]["standbys"][0]
    )
    node = watched["spec"]["nodeName"]
    daemon = next(p for p in pods(kube, namespace, DAEMONS) if p["spec"]["nodeName"] == node)
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/{daemon['metadata']['name']}")
    get_watched = lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{watched['metadata']['name']}")  # noqa: E731
    wait_for(
        lambda: gate(get_watched()) == "False" and not is_ready(get_watched()),
        20,
        describe=lambda: get_watched()["status"]["conditions"],
    )
    wait_for(
        lambda: gate(get_watched()) == "True" and is_ready(get_watched()),
        60,
        describe=lambda: get_watched()["status"]["conditions"],
    )
    wait_phase(kube, namespace, operator, "Ready")

    # Scaling converges both ways: two replicas without standbys, then one.
    cluster.kubectl(
        "patch",
        "wc",
        "tiny-llama",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec": {"engine": {"replicas": 2, "standbysPerReplica": 0}}}',
    )
    status = wait_phase(kube, namespace, operator, "Ready", also=lambda s: len(s["engines"]) == 2)
    assert (status["activeEngines"], status["standbyEngines"]) == (2, 0)
    assert [len(by_role(kube, namespace)[r]) for r in ("active", "standby")] == [2, 0]
    cluster.kubectl(
        "patch", "wc", "tiny-llama", "-n", namespace, "--type=merge", "-p", '{"spec": {"engine": {"replicas": 1}}}'
    )
    wait_for(lambda: len(by_role(kube, namespace)["active"]) == 1, 30, describe=lambda: by_role(kube, namespace))
    status = wait_phase(kube, namespace, operator, "Ready", also=lambda s: len(s["engines"]) == 1)
    assert (status["activeEngines"], status["standbyEngines"]) == (1, 0) and by_role(kube, namespace)["standby"] == []

    # Deleting the WeightCache removes every object and process it created.
    socket_dirs = [
        kubelet.node_root(n) / "run" / "weightcache" / f"{namespace}-tiny-llama" for n in ("node-1", "node-2")
    ]
    # One directory per daemon generation under the cache's.
    assert any(list(d.glob("*/tiny-llama/*.ready")) for d in socket_dirs), "the daemons wrote ready files"
    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=90s")
    assert pods(kube, namespace, "weightcache.io/cache=tiny-llama") == []
    for kind in ("apis/apps/v1/namespaces/{ns}/daemonsets", "api/v1/namespaces/{ns}/services"):
        assert kube.get("/" + kind.format(ns=namespace))["items"] == []
    for worker in kubelet.pods_in(namespace):
        for runner in [*worker.init_runners, *worker.runners]:
            assert runner.process is None or runner.process.poll() is not None, (worker.name, runner.name)
            assert not processes_with_environment(CONTAINER_MARKER, runner.marker), (worker.name, runner.name)
    assert not any(list(d.glob("*/tiny-llama/*.ready")) for d in socket_dirs), "daemons removed their ready files"


def http_text(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the series ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{labels} in:\n{text}")


def test_daemon_reports_reach_status_and_a_blocked_daemon_gates_its_engines(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    """The operator fills status.nodes from each daemon pod's status endpoint and exports its own
    metrics; a daemon whose rank is frozen (SIGSTOP: its probe stops answering) turns NotReady,
    the engines on its node lose the daemon-ready gate and their Ready, and the Service sends
    nothing there (after the 1 s daemon outage grace this test sets: the engines there are Ready
    and would ride out a shorter outage); thawed, everything is Ready again."""
    apply_sample(cluster, namespace, engine__failover={"daemonOutageGraceSeconds": 1})
    reported = lambda s: all(n.get("fingerprint") for n in s.get("nodes", [])) and len(s.get("nodes", [])) == 2  # noqa: E731
    status = wait_phase(kube, namespace, operator, "Ready", also=reported)

    def socket_dir(node: str) -> Path:
        return (
            kubelet.node_root(node)
            / "run"
            / "weightcache"
            / f"{namespace}-tiny-llama"
            / status["daemonSpecHash"]
            / "tiny-llama"
        )

    daemons = {p["spec"]["nodeName"]: p for p in pods(kube, namespace, DAEMONS)}
    for entry in status["nodes"]:
        pod = daemons[entry["node"]]
        assert entry["daemonPod"] == pod["metadata"]["name"] and "reportError" not in entry, entry
        own = http_json(f"http://{pod['status']['podIP']}:9400/status", timeout=10)  # what the daemon says itself
        assert entry["fingerprint"] == own["fingerprint"] and own["ready"]
        for rank in entry["ranks"]:
            held = json.loads((socket_dir(entry["node"]) / f"rank-{rank['rank']}.ready").read_text())
            assert rank["ready"] and rank["bytes"] == held["arena_bytes"] > 0, (rank, held)
            assert (
                rank["loadSeconds"] == held["load_seconds"] and rank["source"] == "disk" and rank["diskBytesRead"] > 0
            )
            assert "gpuUuid" not in rank, "cpu-shm holds no GPU"

    scraped = http_text(operator.metrics_url)  # type: ignore[attr-defined]
    assert metric(scraped, "weightcache_operator_caches", phase="Ready") >= 1
    assert (
        metric(scraped, "weightcache_operator_reconcile_total", namespace=namespace, cache="tiny-llama", outcome="ok")
        > 0
    )
    assert metric(scraped, "weightcache_operator_reconcile_seconds_count", namespace=namespace, cache="tiny-llama") > 0
    assert metric(scraped, "weightcache_operator_engines", namespace=namespace, cache="tiny-llama", role="active") == 1
    # Where passes spend their time: every pass observed and reported, and each request it sent
    # is timed by verb (the cache's status patched; its pods listed at least once, by the first
    # pass, before the watch holds them). Every pass reads its pods once, from the watch or a LIST:
    # how many of each depends on when the watch caught up, so only their sum is pinned.
    passes = metric(scraped, "weightcache_operator_reconcile_seconds_count", namespace=namespace, cache="tiny-llama")
    assert metric(scraped, "weightcache_operator_pass_step_seconds_count", step="observe") >= passes
    assert metric(scraped, "weightcache_operator_pass_step_seconds_count", step="status") >= 1
    assert metric(scraped, "weightcache_operator_api_request_seconds_count", verb="LIST") >= 1
    pod_reads = sum(
        metric(scraped, "weightcache_operator_pod_reads_total", source=source) for source in ("watch", "list")
    )
    assert pod_reads >= passes
    assert metric(scraped, "weightcache_operator_api_request_seconds_count", verb="PATCH") >= 1
    # The Events of the phases the cache went through were sent (off the passes) and counted.
    told = events(kube, namespace, "PhaseReady")
    scraped = http_text(operator.metrics_url)  # type: ignore[attr-defined]
    assert metric(scraped, "weightcache_operator_events_total", outcome="sent") >= len(told) >= 1
    # Passes after pod events read the pods from the watch; full passes LIST them.
    assert metric(scraped, "weightcache_operator_pod_reads_total", source="watch") >= 1
    assert metric(scraped, "weightcache_operator_pod_reads_total", source="list") >= 1

    # Freeze rank 0 of the daemon on the standby engine's node: its load is blocked mid-life.
    # (Not the active's node for its own sake: a Ready standby elsewhere would take over and the
    # active be retired — test_failover_e2e covers that.)
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(1)
    role = lambda p: p["metadata"]["labels"]["weightcache.io/role"]  # noqa: E731
    node = next(p for p in pods(kube, namespace, ENGINES) if role(p) == "standby")["spec"]["nodeName"]
    active_node = next(p for p in pods(kube, namespace, ENGINES) if role(p) == "active")["spec"]["nodeName"]
    frozen = json.loads((socket_dir(node) / "rank-0.ready").read_text())["pid"]
    on_node = lambda: [p for p in pods(kube, namespace, ENGINES) if p["spec"]["nodeName"] == node]  # noqa: E731
    node_ips = lambda: {p["status"].get("podIP") for p in on_node()}  # noqa: E731
    os.kill(frozen, signal.SIGSTOP)
    try:
        wait_for(
            lambda: not is_ready(kube.get(f"/api/v1/namespaces/{namespace}/pods/{daemons[node]['metadata']['name']}")),
            60,
            describe=f"the daemon on {node} stayed Ready",
        )
        wait_for(
            lambda: on_node() and all(gate(p) == "False" and not is_ready(p) for p in on_node()),
            30,
            describe=lambda: [(p["metadata"]["name"], p["status"].get("conditions")) for p in on_node()],
        )
        wait_for(
            lambda: not {e.rsplit(":", 1)[0] for e in proxy.ready_endpoints} & node_ips(),
            30,
            describe=lambda: (proxy.ready_endpoints, node_ips()),
        )
        own = http_json(f"http://{daemons[node]['status']['podIP']}:9400/status", timeout=10)
        assert [r["ready"] for r in own["ranks"]] == [False, True] and not own["ready"], own
        assert "socket does not answer" in own["ranks"][0]["problem"]
        # The active shares the frozen node: no Ready standby can take over, so Degraded.
        blocked = wait_phase(kube, namespace, operator, "Degraded" if active_node == node else "Loading")
        entry = next(n for n in blocked["nodes"] if n["node"] == node)
        assert [r["ready"] for r in entry["ranks"]] == [False, False], entry
    finally:
        os.kill(frozen, signal.SIGCONT)
    wait_phase(kube, namespace, operator, "Ready", also=reported)
    wait_for(
        lambda: all(gate(p) == "True" and is_ready(p) for p in pods(kube, namespace, ENGINES)),
        60,
        describe=lambda: [
            (p["metadata"]["name"], p["status"].get("conditions")) for p in pods(kube, namespace, ENGINES)
        ],
    )
    proxy.wait_for_ready(1)
    host, port = proxy.address
    assert http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model__quantization": {"method": "fp8", "weightBlockSize": [64, 64]}}, "verified for [128, 128] only"),
        ({"daemon__resources": {"limits": {"nvidia.com/gpu": 1}}}, "cpu-shm uses no GPUs"),
        (
            {"daemon__backend": "cuda-vmm", "daemon__resources": {"limits": {"nvidia.com/gpu": 1}}},
            "GPUs per node must be ≥ ranks per node",
        ),
    ],
)
def test_invalid_spec_is_reported_and_nothing_is_created(
    cluster: ControlPlane, kube: Kube, namespace: str, operator: subprocess.Popen, changes: dict, message: str
) -> None:
    apply_sample(cluster, namespace, **changes)
    status = wait_phase(kube, namespace, operator, "Failed", timeout=60)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec") and message in degraded["message"]
    assert pods(kube, namespace, "weightcache.io/cache=tiny-llama") == []
    assert kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"] == []
    assert operator.poll() is None
    wc = kube.get(f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/tiny-llama")
    assert wc["metadata"]["finalizers"] == ["weightcache.io/cleanup"]
    # Deleting an invalid object completes: its finalizer has nothing to wait for.
    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=30s")


def test_two_replicas_do_not_fight_and_hand_over(
    cluster: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., subprocess.Popen]
) -> None:
    """kopf peering: a higher-priority replica makes the running one pause — which then stops
    acting for its caches, so its own timers and engine probes run no pass (kopf stops the
    per-cache daemon that marks it acting) — and the paused one takes over again (here: the
    deletion and its finalizer) once the higher one is gone."""
    # kopf starts paused and resumes once the peering object shows no higher-priority peer.
    resumed = lambda proc: "Resuming operations" in proc.log.read_text()  # noqa: E731
    log = lambda proc: proc.log.read_text()  # noqa: E731
    # This namespace's cache only: an earlier test's cache of the same name may still be finalizing.
    acting = lambda proc, on: sum(  # noqa: E731
        f'"message": "{"acting" if on else "no longer acting"} for the cache"' in line
        and f'"namespace": "{namespace}"' in line
        for line in log(proc).splitlines()
    )
    first = start_operator(priority=100)
    wait_for(lambda: resumed(first), 30, describe=lambda: log(first)[-3000:])
    apply_sample(cluster, namespace, model__quantization={"method": "fp8", "weightBlockSize": [64, 64]})
    wait_phase(kube, namespace, first, "Failed", timeout=60)
    wait_for(lambda: acting(first, True) == 1, 30, describe=lambda: log(first)[-3000:])

    second = start_operator(priority=200)

    def priorities() -> set[int]:
        peering = json.loads(cluster.kubectl("get", "clusterkopfpeering", "weightcache-operator", "-o", "json").stdout)
        return {p["priority"] for p in (peering.get("status") or {}).values()}

    wait_for(lambda: {100, 200} <= priorities(), 30, describe=priorities)
    wait_for(
        lambda: "Pausing operations" in log(first) and acting(first, False) == 1,
        60,
        describe=lambda: log(first)[-3000:],
    )
    wait_for(lambda: resumed(second) and acting(second, True) == 1, 60, describe=lambda: log(second)[-3000:])
    assert acting(first, True) == 1, "the paused replica does not act again while the other runs"

    stop_operator(second)
    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=60s")
    assert first.poll() is None
    assert "Deletion is processed" in log(first), log(first)[-3000:]


def test_deletion_completes_with_a_node_gone(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
) -> None:
    """A node that stops answering never confirms its pods' stop: the finalizer deletes them with
    grace 0 once the node is NotReady, so deleting the WeightCache still completes."""
    apply_sample(cluster, namespace)
    wait_for(
        lambda: (
            sorted(p["spec"].get("nodeName") or "" for p in pods(kube, namespace, DAEMONS) if is_ready(p))
            == ["node-1", "node-2"]
        ),
        120,
        describe=lambda: pods(kube, namespace, DAEMONS),
    )
    kubelet.fail_node("node-2")
    try:
        wait_for(
            lambda: (
                not any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in kube.get("/api/v1/nodes/node-2")["status"]["conditions"]
                )
            ),
            30,
        )
        cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=60s")
        assert pods(kube, namespace, "weightcache.io/cache=tiny-llama") == []
    finally:
        kubelet.recover_node("node-2")
        wait_for(
            lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in kube.get("/api/v1/nodes/node-2")["status"]["conditions"]
            ),
            30,
        )


def test_tensor_parallel_over_two_nodes_serves_the_disk_completion(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    disk_completion: dict,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    """parallelism.nodes 2: node-1 (slot 0) holds rank 0 and node-2 (slot 1) rank 1; each engine
    is a group of two pods (one per node) and the Service reaches the active group's leader."""
    apply_sample(cluster, namespace, parallelism__nodes=2)
    status = wait_phase(kube, namespace, operator, "Ready", timeout=480)

    daemons = {p["spec"]["nodeName"]: p for p in pods(kube, namespace, DAEMONS)}
    assert sorted(daemons) == ["node-1", "node-2"] and all(map(is_ready, daemons.values()))
    for node, rank in (("node-1", "0"), ("node-2", "1")):
        command = next(c for c in daemons[node]["spec"]["containers"] if c["name"] == "daemon")["command"]
        assert command[command.index("--ranks") + 1] == rank
        held = (
            kubelet.node_root(node)
            / "run"
            / "weightcache"
            / f"{namespace}-tiny-llama"
            / status["daemonSpecHash"]
            / "tiny-llama"
        )
        assert sorted(p.name for p in held.glob("*.ready")) == [f"rank-{rank}.ready"], "each node holds only its ranks"
    assert [(n["node"], [r["rank"] for r in n["ranks"]]) for n in status["nodes"]] == [("node-1", [0]), ("node-2", [1])]
    assert (status["readyNodes"], status["activeEngines"], status["standbyEngines"]) == ("2/2", 1, 1)

    engines = [p for p in pods(kube, namespace, ENGINES) if not p["metadata"].get("deletionTimestamp")]
    groups: dict[str, list[dict]] = {}
    for pod in engines:
        groups.setdefault(pod["metadata"]["labels"]["weightcache.io/engine-group"], []).append(pod)
    assert len(groups) == 2, [p["metadata"]["name"] for p in engines]
    roles = []
    for members in groups.values():
        placed = sorted((p["metadata"]["labels"]["weightcache.io/node-rank"], p["spec"]["nodeName"]) for p in members)
        assert placed == [("0", "node-1"), ("1", "node-2")], placed
        assert len({p["metadata"]["labels"]["weightcache.io/role"] for p in members}) == 1, "a group shares its role"
        assert all(is_ready(p) and gate(p) == "True" for p in members)
        roles.append(members[0]["metadata"]["labels"]["weightcache.io/role"])
    assert sorted(roles) == ["active", "standby"]

    leader = next(
        p
        for p in engines
        if p["metadata"]["labels"]["weightcache.io/role"] == "active"
        and p["metadata"]["labels"]["weightcache.io/node-rank"] == "0"
    )
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    wait_for(
        lambda: proxy.ready_endpoints == (f"{leader['status']['podIP']}:8000",),
        30,
        describe=lambda: proxy.ready_endpoints,
    )
    host, port = proxy.address
    served = http_json(f"http://{host}:{port}/v1/completions", PROMPT)
    assert served["choices"][0]["text"] == disk_completion["choices"][0]["text"]
    assert served["choices"][0].get("token_ids") == disk_completion["choices"][0].get("token_ids")
    health = http_json(f"http://{host}:{port}/health")
    assert [(r["rank"], r["weights"]["mode"]) for r in health["ranks"]] == [(0, "cache"), (1, "cache")], health

    # The active group's node-rank-1 engine is SIGKILLed: the standby group takes over whole, and
    # the failover is recorded as for single-node engines (leaders as from/to, the signal, an Event).
    group = leader["metadata"]["labels"]["weightcache.io/engine-group"]
    follower = next(
        p
        for p in engines
        if p["metadata"]["labels"]["weightcache.io/engine-group"] == group
        and p["metadata"]["labels"]["weightcache.io/node-rank"] == "1"
    )
    standby = next(
        p
        for p in engines
        if p["metadata"]["labels"]["weightcache.io/role"] == "standby"
        and p["metadata"]["labels"]["weightcache.io/node-rank"] == "0"
    )
    worker = kubelet.pod_worker(namespace, follower["metadata"]["name"])
    assert worker is not None and worker.runners[0].process is not None
    os.killpg(worker.runners[0].process.pid, signal.SIGKILL)
    status = wait_phase(
        kube,
        namespace,
        operator,
        "Ready",
        timeout=300,
        also=lambda s: (s.get("lastFailover") or {}).get("to") == standby["metadata"]["name"],
    )
    last = status["lastFailover"]
    assert (last["from"], last["replica"]) == (leader["metadata"]["name"], 0), last
    assert last["signal"] in ("ContainerRestarted", "ReadinessFailed", "PodFailed"), last
    assert last["promotionMs"] >= 0 and last["toNode"] == "node-1"
    failovers = events(kube, namespace, "Failover")
    assert sum(e.get("count", 1) for e in failovers) == 1, failovers
    wait_for(
        lambda: proxy.ready_endpoints == (f"{standby['status']['podIP']}:8000",),
        60,
        describe=lambda: proxy.ready_endpoints,
    )
    assert (
        http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]
        == disk_completion["choices"][0]["text"]
    )

    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=120s")
    assert pods(kube, namespace, "weightcache.io/cache=tiny-llama") == []
    assert kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"] == []
