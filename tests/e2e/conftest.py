"""Fixtures for end-to-end tests against a real control plane and the process kubelet.

Session scope: ``cluster`` (kube-apiserver, kube-controller-manager, kube-scheduler and etcd,
built from upstream modules by tests/cluster/build.sh) and ``kubelet`` (2 nodes unless
WEIGHTCACHE_E2E_NODES says otherwise). Module scope: ``checkpoint`` (the README sample's
checkpoint, generated and placed on every node) and ``disk_completion`` (an engine reading it from
disk, and its completion of the prompt). Function scope: ``namespace``, a fresh namespace per
test; ``start_operator`` and ``operator``, the operator as a process under the shipped ClusterRole;
``ready_sample``, the README sample Ready under it. ``wait_for`` is also importable:
``from testcluster.waiting import wait_for``; the operator scenarios' plain helpers are in
operator_e2e.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from operator_e2e import PROMPT, REPO, apply_sample, free_port, http_json, stop_operator, wait_phase
from testcluster.binaries import client_tools, control_plane_binary
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import KubeletConfig, ProcessKubelet
from testcluster.kubelet.nodes import NodeSpec
from testcluster.rest import ApiError, Kube
from testcluster.sample import SAMPLE, generate_checkpoint, place_checkpoint
from testcluster.serviceproxy import ServiceProxy
from testcluster.strays import MARKER, kill_all, marked_processes, new_session_id
from testcluster.waiting import wait_for as _wait_for

_timings: dict[str, float] = {}
_build_failures: list[Exception] = []
# The session's cluster and kubelet, for the failure report hook (which gets no fixtures).
_live: dict[str, object] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Builds the control plane (minutes when cold) and unpacks kubectl/helm before any test
    runs, so the build counts against no test's timeout; a no-op when nothing e2e is selected
    or the binary for these sources is cached."""
    if not any(item.get_closest_marker("e2e") for item in session.items):
        return
    started = time.monotonic()
    try:
        control_plane_binary()
        client_tools()
    except Exception as error:  # noqa: BLE001 - reported by every e2e test, not as a crash
        # Unit tests still run; each e2e test then errors with the build failure.
        _build_failures.append(error)
        return
    _timings["build or cache check (s)"] = time.monotonic() - started


@pytest.fixture(scope="session")
def test_session_id() -> str:
    return new_session_id()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, test_session_id: str) -> Iterator[ControlPlane]:
    """The control plane; afterwards, no process of this session may still be alive."""
    if _build_failures:
        raise RuntimeError(f"building the control plane failed: {_build_failures[0]}") from _build_failures[0]
    state = tmp_path_factory.mktemp("cluster")
    grace = float(os.environ.get("WEIGHTCACHE_E2E_NODE_GRACE", "6"))
    plane = ControlPlane(state, node_monitor_grace_period=grace, environment={MARKER: test_session_id})
    started = time.monotonic()
    plane.start()
    _timings["cluster start (s)"] = time.monotonic() - started
    _timings["control plane up (s)"] = plane.start_seconds
    try:
        _live["cluster"] = plane
        yield plane
    finally:
        plane.stop()
        # Components exit within milliseconds of their parent; give them that long.
        leftovers = _wait_for_no_strays(test_session_id, timeout=10)
        if leftovers:
            kill_all(leftovers)
            pytest.fail(f"processes outlived the test session: {leftovers}")


@pytest.fixture(scope="session")
def kube(cluster: ControlPlane) -> Kube:
    """An admin REST client (plain dicts); ``cluster.api_client()`` gives a kubernetes one."""
    return Kube.from_kubeconfig(cluster.kubeconfig)


@pytest.fixture(scope="session")
def kubelet(
    cluster: ControlPlane, kube: Kube, tmp_path_factory: pytest.TempPathFactory, test_session_id: str
) -> Iterator[ProcessKubelet]:
    count = int(os.environ.get("WEIGHTCACHE_E2E_NODES", "2"))
    nodes = [NodeSpec(f"node-{i + 1}", labels={"weightcache.io/test-node": "true"}) for i in range(count)]
    config = KubeletConfig(
        root=tmp_path_factory.mktemp("kubelet"),
        nodes=nodes,
        # Pods run our code from this checkout (`python -m weightcache`, `python -m weightcache_operator`),
        # as the images have both packages installed.
        environment={
            MARKER: test_session_id,
            "PYTHONPATH": os.pathsep.join(
                str(Path(__file__).resolve().parents[2] / part) for part in ("contract", "daemon_image", "operator")
            ),
        },
        serving_cert=cluster.kubelet_serving_cert,
    )
    agent = ProcessKubelet(kube, cluster.port, config)
    started = time.monotonic()
    agent.start()
    _wait_for(lambda: _all_nodes_ready(kube, [n.name for n in nodes]), 30, describe="nodes never turned Ready")
    _timings["kubelet nodes Ready (s)"] = time.monotonic() - started
    try:
        _live["kubelet"] = agent
        yield agent
    finally:
        agent.stop()


@pytest.fixture(scope="session")
def weightcache_crd(cluster: ControlPlane) -> str:
    """The WeightCache CRD, generated from the pydantic models (not read from crds/, which a unit
    test keeps equal), applied once per session and Established; returns its name."""
    from weightcache_operator.crd import custom_resource_definition, render

    name = custom_resource_definition()["metadata"]["name"]
    cluster.kubectl("apply", "--server-side", "--field-manager=e2e", "-f", "-", input=render())
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")
    return name


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: Kube) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists (pods are rejected before that)."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    kube.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": {"weightcache.io/e2e": "true"}}})
    _wait_for(
        lambda: kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        30,
        describe=f"namespace {name} never got its default ServiceAccount",
    )
    yield name
    try:
        kube.delete(f"/api/v1/namespaces/{name}")
    except ApiError:
        pass


@pytest.fixture
def wait_for():  # type: ignore[no-untyped-def]
    """``wait_for(condition, timeout=30, *, interval=0.1, describe=...)`` as a fixture."""
    return _wait_for


@pytest.fixture
def service_proxy(kube: Kube) -> Iterator:  # type: ignore[type-arg]
    """A factory: ``service_proxy(namespace, service, port)`` → a started ServiceProxy,
    stopped after the test."""
    proxies: list[ServiceProxy] = []

    def start(namespace: str, service: str, port: int | str) -> ServiceProxy:
        proxy = ServiceProxy(kube, namespace, service, port).start()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.stop()


# --- the operator and the README sample's checkpoint -------------------------------------------
# The operator authenticates as a ServiceAccount bound to the ClusterRole below (``start_operator``),
# so a missing or excessive permission shows up here, not in production.

PEERING = REPO / "crds" / "kopf-peering.yaml"

DEPLOY = REPO / "deploy" / "operator.yaml"
_DEPLOYED = list(yaml.safe_load_all(DEPLOY.read_text()))
CLUSTER_ROLE_RULES = next(d for d in _DEPLOYED if d["kind"] == "ClusterRole")["rules"]
"""The shipped least-privilege ClusterRole (the chart rendered with default values, whose peering
object is named like the operator's default peering): the operator under test runs with exactly
these rules."""
PEERING_OBJECT = next(d for d in _DEPLOYED if d["kind"] == "ClusterKopfPeering")


@pytest.fixture(scope="session")
def generated_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, str], Path]:
    """``generated(example, name)``: the example's checkpoint, generated once per session (seeded
    random weights, the same every time; each generation is a process importing torch). Modules
    place copies of it on the nodes, which their tests may rewrite; the generated one stays as made."""
    made: dict[Path, Path] = {}

    def generated(example: Path, name: str) -> Path:
        if example not in made:
            made[example] = generate_checkpoint(tmp_path_factory.mktemp("ckpt") / name, example)
        return made[example]

    return generated


@pytest.fixture(scope="module")
def checkpoint(kubelet: ProcessKubelet, generated_checkpoints: Callable[[Path, str], Path]) -> Path:
    """The sample's checkpoint at its hostPath (/models/tiny-llama) on every node."""
    made = generated_checkpoints(SAMPLE, "tiny-llama")
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

        _wait_for(ready, 180, interval=0.5, describe=lambda: log.read_text()[-2000:])
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


@pytest.fixture
def operator(start_operator: Callable[..., subprocess.Popen]) -> subprocess.Popen:
    return start_operator()


@pytest.fixture
def ready_sample(
    cluster: ControlPlane, kube: Kube, namespace: str, operator: subprocess.Popen, checkpoint: Path
) -> dict:
    """The README sample, unchanged, applied in the test's namespace once its checkpoint is on the
    nodes, and Ready under ``operator``: the status that said so."""
    apply_sample(cluster, namespace)
    return wait_phase(kube, namespace, operator, "Ready")


def _all_nodes_ready(kube: Kube, names: list[str]) -> bool:
    for name in names:
        node = kube.get(f"/api/v1/nodes/{name}")
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])):
            return False
    return True


def _wait_for_no_strays(session_id: str, timeout: float) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while True:
        leftovers = marked_processes(session_id)
        if not leftovers or time.monotonic() > deadline:
            return leftovers
        time.sleep(0.1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """On a failed e2e test, appends what its namespace looked like: objects, events, and the
    tail of every container's log, so a CI failure can be diagnosed from the log alone. A failed
    setup counts too: fixtures such as ``ready_sample`` wait on the cluster before the test runs."""
    outcome = yield
    report = outcome.get_result()
    namespace = getattr(item, "funcargs", {}).get("namespace")
    if report.when not in ("setup", "call") or not report.failed or not namespace or "cluster" not in _live:
        return
    report.sections.append(("cluster state", _describe_namespace(namespace)))


def _describe_namespace(namespace: str) -> str:
    plane = _live["cluster"]
    assert isinstance(plane, ControlPlane)
    parts = []
    for args in (("get", "all,endpointslices", "-o", "wide"), ("get", "events", "--sort-by=.lastTimestamp")):
        result = plane.kubectl(*args, "-n", namespace, check=False)
        parts.append(f"$ kubectl {' '.join(args)}\n{result.stdout}{result.stderr}")
    # Nodes are shared by every test: their readiness and taints explain many a stuck DaemonSet.
    nodes = (
        "get",
        "nodes",
        "-o",
        "custom-columns=NAME:.metadata.name,READY:.status.conditions[?(@.type=='Ready')].status,TAINTS:.spec.taints[*].key,UNSCHEDULABLE:.spec.unschedulable",
    )
    result = plane.kubectl(*nodes, check=False)
    parts.append(f"$ kubectl {' '.join(nodes)}\n{result.stdout}{result.stderr}")
    agent = _live.get("kubelet")
    if isinstance(agent, ProcessKubelet):
        for worker in agent.pods_in(namespace):
            for runner in [*worker.init_runners, *worker.runners]:
                tail = agent.logs(namespace, worker.name, runner.name)[-2000:]
                parts.append(f"--- logs {worker.name}/{runner.name} (restarts: {runner.restart_count})\n{tail}")
    return "\n".join(parts)


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _timings:
        terminalreporter.section("e2e cluster timings")
        for name, seconds in _timings.items():
            terminalreporter.write_line(f"{name}: {seconds:.2f}")
