"""Fixtures for end-to-end tests against a real control plane and the process kubelet.

Session scope: ``cluster`` (kube-apiserver, kube-controller-manager, kube-scheduler and etcd,
built from upstream modules by tests/cluster/build.sh) and ``kubelet`` (2 nodes unless
WEIGHTCACHE_E2E_NODES says otherwise). Function scope: ``namespace``, a fresh namespace per
test. ``wait_for`` is also importable: ``from testcluster.waiting import wait_for``.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from testcluster.binaries import client_tools, control_plane_binary  # noqa: E402
from testcluster.controlplane import ControlPlane  # noqa: E402
from testcluster.kubelet import KubeletConfig, ProcessKubelet  # noqa: E402
from testcluster.kubelet.nodes import NodeSpec  # noqa: E402
from testcluster.rest import ApiError, Kube  # noqa: E402
from testcluster.serviceproxy import ServiceProxy  # noqa: E402
from testcluster.strays import MARKER, kill_all, marked_processes, new_session_id  # noqa: E402
from testcluster.waiting import wait_for as _wait_for  # noqa: E402

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
