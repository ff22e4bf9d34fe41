"""The process kubelet's pod semantics that weightcache's operator and daemons will rely on:
probes and restarts, volumes and environment, readiness gates, graceful deletion, preStop hooks."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.kubelet.devices import gpu_uuid
from testcluster.kubelet.nodes import NodeSpec
from testcluster.kubelet.processes import CONTAINER_MARKER
from testcluster.rest import ApiError, Kube
from testcluster.strays import processes_with_environment
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def create_pod(
    kube: Kube, namespace: str, name: str, spec: dict, labels: dict | None = None, annotations: dict | None = None
) -> None:
    kube.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels or {},
                "annotations": annotations or {},
            },
            "spec": spec,
        },
    )


def get_pod(kube: Kube, namespace: str, name: str) -> dict:
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def container_status(kube: Kube, namespace: str, pod: str, container: str) -> dict:
    statuses = get_pod(kube, namespace, pod)["status"].get("containerStatuses") or []
    return next(s for s in statuses if s["name"] == container)


def gone(kube: Kube, namespace: str, name: str) -> bool:
    try:
        get_pod(kube, namespace, name)
        return False
    except ApiError as error:
        if error.status == 404:
            return True
        raise


def condition(pod: dict, kind: str) -> str | None:
    return next((c["status"] for c in pod["status"].get("conditions", []) if c["type"] == kind), None)


ARMED = "armed"
"""What a test container prints once its TERM trap is set. A pod is Ready as soon as its processes
exist, before a shell has run its first line; SIGTERM then would kill it without the trap."""


def wait_armed(kubelet: ProcessKubelet, namespace: str, pod: str, containers: list[str]) -> None:
    wait_for(
        lambda: all(ARMED in kubelet.logs(namespace, pod, name) for name in containers),
        30,
        describe=lambda: {name: kubelet.logs(namespace, pod, name)[-200:] for name in containers},
    )


def test_probes_and_restarts(cluster: ControlPlane, kube: Kube, kubelet: ProcessKubelet, namespace: str) -> None:
    create_pod(
        kube,
        namespace,
        "probed",
        {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "work", "emptyDir": {}}],
            "containers": [
                {"name": "crasher", "image": "busybox", "command": ["sh", "-c", "echo attempt; exit 2"]},
                {
                    "name": "unhealthy",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "livenessProbe": {"tcpSocket": {"port": 9}, "periodSeconds": 1, "failureThreshold": 1},
                },
                {
                    "name": "slow-starter",
                    "image": "busybox",
                    "command": ["sh", "-c", "sleep 1; touch /work/started; exec sleep 3600"],
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                    "startupProbe": {
                        "exec": {"command": ["test", "-e", "/work/started"]},
                        "periodSeconds": 1,
                        "failureThreshold": 10,
                    },
                    "readinessProbe": {"exec": {"command": ["test", "-e", "/work/started"]}, "periodSeconds": 1},
                },
            ],
        },
    )

    crashed = wait_for(
        lambda: (s := container_status(kube, namespace, "probed", "crasher"))["restartCount"] >= 2 and s,
        30,
        describe=lambda: get_pod(kube, namespace, "probed")["status"],
    )
    assert crashed["lastState"]["terminated"]["exitCode"] == 2
    assert kubelet.logs(namespace, "probed", "crasher", previous=True) == "attempt\n"
    # kubectl logs goes through the API server to the node's kubelet endpoint.
    assert cluster.kubectl("logs", "-n", namespace, "probed", "-c", "crasher", "--previous").stdout == "attempt\n"

    killed = wait_for(
        lambda: (s := container_status(kube, namespace, "probed", "unhealthy"))["restartCount"] >= 1 and s,
        30,
        describe=lambda: get_pod(kube, namespace, "probed")["status"],
    )
    assert killed["lastState"]["terminated"]["exitCode"] == 143  # SIGTERM from the liveness kill

    started = wait_for(
        lambda: (s := container_status(kube, namespace, "probed", "slow-starter"))["ready"] and s,
        30,
        describe=lambda: get_pod(kube, namespace, "probed")["status"],
    )
    assert started["started"] is True and started["restartCount"] == 0
    assert condition(get_pod(kube, namespace, "probed"), "Ready") == "False", "the crasher keeps the pod unready"


VOLUME_REPORT = textwrap.dedent("""
    import json, os
    def read(path):
        with open(path) as file:
            return file.read()
    print(json.dumps({
        "env": {k: os.environ.get(k) for k in ["GREETING", "POD_NAME", "POD_NAMESPACE", "NODE_NAME", "POD_IP",
                                               "APP", "ROLE", "MODE", "PASSWORD", "CFG_mode", "MESSAGE"]},
        "gpus": os.environ.get("NVIDIA_VISIBLE_DEVICES", ""),
        "cwd": os.getcwd(),
        "mode": read("/etc/settings/mode"),
        "password": read("/etc/creds/password"),
        "labels": read("/etc/podinfo/labels"),
        "weights": read("/models/tiny/weights.txt"),
        "single_file": read("/etc/mode.conf"),
        "namespace_file": read("/var/run/secrets/kubernetes.io/serviceaccount/namespace"),
        "has_token": len(read("/var/run/secrets/kubernetes.io/serviceaccount/token")) > 100,
    }))
""")


def test_volumes_and_environment(kube: Kube, kubelet: ProcessKubelet, namespace: str) -> None:
    kube.create(
        f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "settings"}, "data": {"mode": "fast"}}
    )
    kube.create(
        f"/api/v1/namespaces/{namespace}/secrets",
        {"metadata": {"name": "creds"}, "stringData": {"password": "hunter2"}},
    )
    node_disk = kubelet.node_root("node-1") / "models" / "tiny"
    node_disk.mkdir(parents=True, exist_ok=True)
    (node_disk / "weights.txt").write_text("seeded")

    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    create_pod(
        kube,
        namespace,
        "report",
        {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": "node-1"},
            "volumes": [
                {"name": "settings", "configMap": {"name": "settings"}},
                {"name": "creds", "secret": {"secretName": "creds"}},
                {
                    "name": "podinfo",
                    "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
                },
                {"name": "models", "hostPath": {"path": "/models", "type": "Directory"}},
                {"name": "work", "emptyDir": {}},
            ],
            "containers": [
                {
                    "name": "report",
                    "image": "python",
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                    "command": ["python", "-c", VOLUME_REPORT],
                    "workingDir": "/work",
                    "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
                    "env": [
                        {"name": "GREETING", "value": "hello"},
                        {"name": "POD_NAME", **field("metadata.name")},
                        {"name": "POD_NAMESPACE", **field("metadata.namespace")},
                        {"name": "NODE_NAME", **field("spec.nodeName")},
                        {"name": "POD_IP", **field("status.podIP")},
                        {"name": "APP", **field("metadata.labels['app']")},
                        {"name": "ROLE", **field("metadata.annotations['weightcache.io/role']")},
                        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
                        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                        {"name": "MESSAGE", "value": "$(GREETING) from $(POD_NAME), $$(escaped)"},
                    ],
                    "volumeMounts": [
                        {"name": "settings", "mountPath": "/etc/settings"},
                        {"name": "settings", "mountPath": "/etc/mode.conf", "subPath": "mode"},
                        {"name": "creds", "mountPath": "/etc/creds", "readOnly": True},
                        {"name": "podinfo", "mountPath": "/etc/podinfo"},
                        {"name": "models", "mountPath": "/models", "readOnly": True},
                        {"name": "work", "mountPath": "/work"},
                    ],
                }
            ],
        },
        labels={"app": "reporter"},
        annotations={"weightcache.io/role": "standby"},
    )

    pod = wait_for(
        lambda: (p := get_pod(kube, namespace, "report"))["status"].get("phase") == "Succeeded" and p,
        30,
        describe=lambda: (get_pod(kube, namespace, "report")["status"], kubelet.logs(namespace, "report")),
    )
    report = json.loads(kubelet.logs(namespace, "report", "report"))
    assert report["env"] == {
        "GREETING": "hello",
        "POD_NAME": "report",
        "POD_NAMESPACE": namespace,
        "NODE_NAME": "node-1",
        "POD_IP": pod["status"]["podIP"],
        "APP": "reporter",
        "ROLE": "standby",
        "MODE": "fast",
        "PASSWORD": "hunter2",
        "CFG_mode": "fast",
        "MESSAGE": "hello from report, $(escaped)",
    }
    # Like a device plugin: two distinct GPUs of this node, named by stable UUIDs.
    gpus = report["gpus"].split(",")
    assert len(set(gpus)) == 2 and set(gpus) <= {gpu_uuid("node-1", i) for i in range(8)}
    assert report["cwd"] == "/work"
    assert (report["mode"], report["password"], report["weights"]) == ("fast", "hunter2", "seeded")
    assert report["single_file"] == "fast", "a subPath mount is the one key's file"
    assert report["labels"] == 'app="reporter"\n'
    assert report["namespace_file"] == namespace and report["has_token"]


def test_readiness_gate_is_respected(kube: Kube, kubelet: ProcessKubelet, namespace: str) -> None:
    gate = "weightcache.io/daemon-ready"
    create_pod(
        kube,
        namespace,
        "gated",
        {
            "readinessGates": [{"conditionType": gate}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}],
        },
    )
    wait_for(lambda: condition(get_pod(kube, namespace, "gated"), "ContainersReady") == "True", 30)
    assert condition(get_pod(kube, namespace, "gated"), "Ready") == "False"

    # What the operator does: set the gate's condition on the status subresource.
    kube.patch(
        f"/api/v1/namespaces/{namespace}/pods/gated/status",
        {"status": {"conditions": [{"type": gate, "status": "True"}]}},
    )
    wait_for(
        lambda: condition(get_pod(kube, namespace, "gated"), "Ready") == "True",
        10,
        describe=lambda: get_pod(kube, namespace, "gated")["status"]["conditions"],
    )
    assert condition(get_pod(kube, namespace, "gated"), gate) == "True", "the kubelet must not erase the gate"


def test_graceful_deletion(kube: Kube, kubelet: ProcessKubelet, namespace: str) -> None:
    create_pod(
        kube,
        namespace,
        "stubborn",
        {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "polite",
                    "image": "busybox",
                    "command": [
                        "sh",
                        "-c",
                        f"trap 'echo got TERM; exit 0' TERM; echo {ARMED}; while true; do sleep 0.1; done",
                    ],
                },
                {
                    "name": "deaf",
                    "image": "busybox",
                    "command": ["sh", "-c", f"trap '' TERM; echo {ARMED}; while true; do sleep 0.1; done"],
                },
            ],
        },
    )
    wait_armed(kubelet, namespace, "stubborn", ["polite", "deaf"])
    asked = time.monotonic()
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/stubborn")

    wait_for(lambda: gone(kube, namespace, "stubborn"), 15)
    took = time.monotonic() - asked
    assert 1.5 < took < 6, f"the deaf container should be SIGKILLed after the 2 s grace period, took {took:.1f}s"
    assert "got TERM" in kubelet.logs(namespace, "stubborn", "polite")


def test_pre_stop_hooks_run_before_the_stop_signal_within_the_grace_period(
    kube: Kube, kubelet: ProcessKubelet, namespace: str
) -> None:
    # Each container prints when SIGTERM came and what the exec hook left in the shared volume.
    on_term = (
        "trap 'echo TERM $(date +%s.%N) $(cat /work/hook 2>/dev/null); exit 0' TERM; "
        f"echo {ARMED}; while true; do sleep 0.1; done"
    )
    create_pod(
        kube,
        namespace,
        "hooked",
        {
            "terminationGracePeriodSeconds": 10,
            "volumes": [{"name": "work", "emptyDir": {}}],
            "containers": [
                {
                    "name": name,
                    "image": "busybox",
                    "command": ["sh", "-c", on_term],
                    "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                    "lifecycle": {"preStop": hook},
                }
                for name, hook in (
                    ("sleeper", {"sleep": {"seconds": 3}}),
                    ("runner", {"exec": {"command": ["sh", "-c", "echo hook-ran > /work/hook"]}}),
                    ("overlong", {"exec": {"command": ["sleep", "60"]}}),
                )
            ],
        },
    )
    wait_armed(kubelet, namespace, "hooked", ["sleeper", "runner", "overlong"])
    asked = time.time()
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/hooked")

    wait_for(lambda: gone(kube, namespace, "hooked"), 30)
    took = time.time() - asked

    def term(container: str) -> tuple[float, str]:
        words = kubelet.logs(namespace, "hooked", container).split("TERM ", 1)[1].split()
        return float(words[0]) - asked, " ".join(words[1:])

    assert 2.8 < term("sleeper")[0] < 6, f"SIGTERM came after the 3 s sleep: {term('sleeper')}"
    assert term("runner")[1] == "hook-ran", f"the exec hook ran before SIGTERM: {term('runner')}"
    # A hook longer than the grace period is cut at the grace period; SIGTERM still comes, with
    # the kubelet's 2 s minimum left before SIGKILL.
    assert 9.5 < term("overlong")[0] < 12, term("overlong")
    assert took < 16, f"the pod was gone {took:.1f}s after its deletion (grace 10 s + 2 s)"


def test_escaped_processes_die_with_their_container(kube: Kube, kubelet: ProcessKubelet, namespace: str) -> None:
    # The child leaves the container's process group and session, like a daemonizing server.
    create_pod(
        kube,
        namespace,
        "daemonizer",
        {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "busybox", "command": ["sh", "-c", "setsid sleep 300 & sleep 0.5; echo $!"]}
            ],
        },
    )
    wait_for(lambda: get_pod(kube, namespace, "daemonizer")["status"].get("phase") == "Succeeded", 30)
    escaped_pid = int(kubelet.logs(namespace, "daemonizer", "main"))
    marker = kubelet.pod_worker(namespace, "daemonizer").runners[0].marker
    wait_for(
        lambda: not processes_with_environment(CONTAINER_MARKER, marker),
        5,
        describe=lambda: processes_with_environment(CONTAINER_MARKER, marker),
    )
    try:  # gone, or a zombie its parent has yet to reap; the process may finish exiting while read
        state = Path(f"/proc/{escaped_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        state = "gone"
    assert state in ("gone", "Z"), f"the escaped process {escaped_pid} still runs (state {state})"


def test_init_containers_run_in_order_and_a_failed_one_fails_the_pod(
    kube: Kube, kubelet: ProcessKubelet, namespace: str
) -> None:
    shared = {"volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}
    step = lambda name, script: {"name": name, "image": "busybox", "command": ["sh", "-c", script], **shared}  # noqa: E731
    create_pod(
        kube,
        namespace,
        "ordered",
        {
            "restartPolicy": "Never",
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "initContainers": [
                step("first", "sleep 0.3; echo first >> /shared/order"),
                step("second", "echo second >> /shared/order"),
            ],
            "containers": [step("main", "cat /shared/order")],
        },
    )
    wait_for(lambda: get_pod(kube, namespace, "ordered")["status"].get("phase") == "Succeeded", 30)
    assert kubelet.logs(namespace, "ordered", "main") == "first\nsecond\n"

    create_pod(
        kube,
        namespace,
        "broken",
        {
            "restartPolicy": "Never",
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "initContainers": [step("fails", "exit 7")],
            "containers": [step("main", "echo never")],
        },
    )
    pod = wait_for(lambda: (p := get_pod(kube, namespace, "broken"))["status"].get("phase") == "Failed" and p, 30)
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 7
    assert "running" not in pod["status"]["containerStatuses"][0]["state"]
    assert kubelet.logs(namespace, "broken", "main") == ""


def test_termination_messages_reach_the_container_status(kube: Kube, kubelet: ProcessKubelet, namespace: str) -> None:
    """As the real kubelet: the file at terminationMessagePath becomes state.terminated.message
    (lastState after a restart; every start gets an empty file), FallbackToLogsOnError uses the
    log's last 80 lines only when the file is empty, and five containers share 12 KiB."""
    sh = lambda name, script, **extra: {"name": name, "image": "busybox", "command": ["sh", "-c", script], **extra}  # noqa: E731
    create_pod(
        kube,
        namespace,
        "explained",
        {
            "restartPolicy": "Always",
            "volumes": [{"name": "work", "emptyDir": {}}],
            "containers": [
                sh(
                    "writer",
                    "[ -s /dev/termination-log ] && { echo stale > /dev/termination-log; exit 4; }; "
                    'echo $$ >> /work/starts; echo "start $(wc -l < /work/starts): no config.json" > /dev/termination-log; '
                    "exit 3",
                    volumeMounts=[{"name": "work", "mountPath": "/work"}],
                ),
                sh("own-path", "printf 'told here' > /var/run/why; exit 1", terminationMessagePath="/var/run/why"),
                sh(
                    "fallback",
                    "for i in $(seq 1 100); do echo line $i; done; exit 1",
                    terminationMessagePolicy="FallbackToLogsOnError",
                ),
                sh("log-only", "echo only in the log; exit 1"),
                sh("long", "head -c 5000 /dev/zero | tr '\\0' x > /dev/termination-log; exit 1"),
            ],
        },
    )

    def terminated(container: str) -> dict:
        status = container_status(kube, namespace, "explained", container)
        return status["state"].get("terminated") or status.get("lastState", {}).get("terminated") or {}

    writer = wait_for(
        lambda: (
            (s := container_status(kube, namespace, "explained", "writer"))["restartCount"] >= 1
            and s["lastState"].get("terminated", {}).get("message", "").startswith("start")
            and s
        ),
        30,
        describe=lambda: get_pod(kube, namespace, "explained")["status"],
    )
    assert writer["lastState"]["terminated"]["exitCode"] == 3, "a restart starts with an empty file"
    assert writer["lastState"]["terminated"]["message"].strip().endswith(": no config.json")
    wait_for(
        lambda: all(terminated(c) for c in ("own-path", "fallback", "log-only", "long")),
        30,
        describe=lambda: get_pod(kube, namespace, "explained")["status"],
    )
    assert terminated("own-path")["message"] == "told here"
    assert terminated("fallback")["message"].splitlines() == [f"line {i}" for i in range(21, 101)]
    assert "message" not in terminated("log-only"), "the default policy (File) never reads the log"
    assert terminated("long")["message"] == "x" * (12 * 1024 // 5)


def test_a_configmap_volume_follows_its_object_while_the_pod_runs(
    kube: Kube, kubelet: ProcessKubelet, namespace: str
) -> None:
    def settings(mode: str) -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "live"}, "data": {"mode": mode}}

    kube.create(f"/api/v1/namespaces/{namespace}/configmaps", settings("first"))
    create_pod(
        kube,
        namespace,
        "reader",
        {
            "volumes": [{"name": "live", "configMap": {"name": "live"}}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", "while true; do cat /live/mode; echo; sleep 0.2; done"],
                    "volumeMounts": [{"name": "live", "mountPath": "/live"}],
                }
            ],
        },
    )
    wait_for(lambda: "first" in kubelet.logs(namespace, "reader", "main"), 30)
    kube.patch(f"/api/v1/namespaces/{namespace}/configmaps/live", {"data": {"mode": "second"}})
    wait_for(lambda: "second" in kubelet.logs(namespace, "reader", "main"), 15)


def test_a_node_added_to_the_running_cluster_runs_its_pods_and_leaves_without_a_trace(
    kube: Kube, kubelet: ProcessKubelet, namespace: str
) -> None:
    node = f"joined-{namespace[-5:]}"
    kubelet.add_node(NodeSpec(node, labels={"joined": "true"}))
    try:
        wait_for(lambda: condition(kube.get(f"/api/v1/nodes/{node}"), "Ready") == "True", 30)
        create_pod(
            kube,
            namespace,
            "newcomer",
            {
                "nodeSelector": {"joined": "true"},
                "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "300"]}],
            },
        )
        wait_for(lambda: condition(get_pod(kube, namespace, "newcomer"), "Ready") == "True", 30)
        assert get_pod(kube, namespace, "newcomer")["spec"]["nodeName"] == node
        pids = [r.process.pid for r in kubelet.pod_worker(namespace, "newcomer").runners]
    finally:
        kubelet.remove_node(node)
    with pytest.raises(ApiError) as gone_node:
        kube.get(f"/api/v1/nodes/{node}")
    assert gone_node.value.status == 404
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 10)
    assert node not in kubelet.addresses and node not in kubelet.agents
