"""Smoke tests of the e2e harness itself: the real control plane, the process kubelet and the
service proxy behave like the Kubernetes that the operator will meet in production."""

from __future__ import annotations

import json
import textwrap
import time
import urllib.request

import pytest
from testcluster.controlplane import ControlPlane, ToolFailed
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import ApiError, Kube
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.e2e.weightcache.io}
spec:
  group: e2e.weightcache.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [replicas]
            properties:
              replicas: {type: integer, minimum: 1, maximum: 8}
              model: {type: string, pattern: '^[a-z0-9-]+$'}
          status:
            type: object
            properties:
              observedGeneration: {type: integer}
              phase: {type: string}
"""


def widget(namespace: str, name: str, spec: str) -> str:
    return f"""
apiVersion: e2e.weightcache.io/v1
kind: Widget
metadata: {{name: {name}, namespace: {namespace}}}
spec: {spec}
"""


def test_crd_schema_validation_and_status_subresource(cluster: ControlPlane, kube: Kube, namespace: str) -> None:
    cluster.kubectl("apply", "--server-side", "-f", "-", input=WIDGET_CRD)
    cluster.kubectl("wait", "--for=condition=Established", "crd/widgets.e2e.weightcache.io", "--timeout=30s")
    path = f"/apis/e2e.weightcache.io/v1/namespaces/{namespace}/widgets"

    cluster.kubectl("apply", "--server-side", "-f", "-", input=widget(namespace, "good", "{replicas: 2, model: tiny}"))
    assert kube.get(f"{path}/good")["spec"] == {"replicas": 2, "model": "tiny"}

    with pytest.raises(ToolFailed) as too_small:
        cluster.kubectl("apply", "--server-side", "-f", "-", input=widget(namespace, "bad", "{replicas: 0}"))
    assert "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1" in str(
        too_small.value
    )
    with pytest.raises(ToolFailed) as missing:
        cluster.kubectl("apply", "--server-side", "-f", "-", input=widget(namespace, "bad", "{model: tiny}"))
    assert "spec.replicas: Required value" in str(missing.value)
    with pytest.raises(ApiError) as bad_pattern:
        kube.create(
            path,
            {
                "apiVersion": "e2e.weightcache.io/v1",
                "kind": "Widget",
                "metadata": {"name": "bad"},
                "spec": {"replicas": 1, "model": "Not_Valid"},
            },
        )
    assert bad_pattern.value.status == 422
    assert "should match '^[a-z0-9-]+$'" in str(bad_pattern.value)

    # Spec changes bump the generation; status is written only through the subresource.
    updated = kube.patch(f"{path}/good", {"spec": {"replicas": 3}}, content_type="application/merge-patch+json")
    assert updated["metadata"]["generation"] == 2
    ignored = kube.patch(f"{path}/good", {"status": {"phase": "Sneaky"}}, content_type="application/merge-patch+json")
    assert "status" not in ignored
    written = kube.patch(
        f"{path}/good/status",
        {"status": {"observedGeneration": 2, "phase": "Ready"}},
        content_type="application/merge-patch+json",
    )
    assert written["status"] == {"observedGeneration": 2, "phase": "Ready"}
    assert written["metadata"]["generation"] == 2
    cluster.kubectl("delete", "crd", "widgets.e2e.weightcache.io", "--wait=false")


WEB = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 5
      volumes: [{name: srv, emptyDir: {}}]
      initContainers:
      - name: content
        image: python:3.11-slim
        command: [sh, -c, 'printf %s "$POD_NAME" > /srv/name && touch /srv/ready']
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        volumeMounts: [{name: srv, mountPath: /srv}]
      containers:
      - name: http
        image: python:3.11-slim
        command: [python, -m, http.server, --bind, $(POD_IP), --directory, /srv, "8080"]
        env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /ready, port: http}, periodSeconds: 1, failureThreshold: 1}
        volumeMounts: [{name: srv, mountPath: /srv}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
"""


def ready_pods(kube: Kube, namespace: str, selector: str) -> dict[str, dict]:
    pods = kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)["items"]
    return {
        p["metadata"]["name"]: p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    }


def slice_endpoints(kube: Kube, namespace: str, service: str) -> dict[str, bool]:
    slices = kube.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        labelSelector=f"kubernetes.io/service-name={service}",
    )["items"]
    return {
        address: bool(endpoint["conditions"].get("ready"))
        for s in slices
        for endpoint in s.get("endpoints") or []
        for address in endpoint["addresses"]
    }


def fetch(address: tuple[str, int], path: str) -> str:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}{path}", timeout=5) as response:
        return response.read().decode()


def test_deployment_service_endpoints_proxy_and_readiness(
    cluster: ControlPlane, kube: Kube, kubelet: ProcessKubelet, namespace: str, service_proxy
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=WEB)
    pods = wait_for(
        lambda: len(ready_pods(kube, namespace, "app=web")) == 2 and ready_pods(kube, namespace, "app=web"),
        60,
        describe=lambda: cluster.kubectl("get", "pods,endpointslices", "-n", namespace, "-o", "wide").stdout,
    )
    ips = {p["status"]["podIP"] for p in pods.values()}
    assert {p["spec"]["nodeName"] for p in pods.values()} <= {"node-1", "node-2"}
    wait_for(
        lambda: slice_endpoints(kube, namespace, "web") == {ip: True for ip in ips},
        30,
        describe=lambda: slice_endpoints(kube, namespace, "web"),
    )

    proxy = service_proxy(namespace, "web", "http")
    proxy.wait_for_ready(2)
    served = {fetch(proxy.address, "/name") for _ in range(6)}
    assert served == set(pods), "round-robin through the Service should reach both pods"

    # A deleted pod is replaced by the ReplicaSet, and the old one is gone for good.
    victim = sorted(pods)[0]
    cluster.kubectl("delete", "pod", "-n", namespace, victim, "--wait=true", "--timeout=30s")
    replaced = wait_for(
        lambda: (len(r := ready_pods(kube, namespace, "app=web")) == 2 and victim not in r) and r,
        60,
        describe=lambda: cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout,
    )
    proxy.wait_for_ready(2)
    assert '"GET /name HTTP/1.1" 200' in kubelet.logs(namespace, victim, "http")

    # A failing readiness probe takes a pod out of the EndpointSlice and out of rotation.
    sick, healthy = sorted(replaced)
    (kubelet.volume_dir(namespace, sick, "srv") / "ready").unlink()
    sick_ip = replaced[sick]["status"]["podIP"]
    wait_for(
        lambda: slice_endpoints(kube, namespace, "web").get(sick_ip) is False,
        30,
        describe=lambda: slice_endpoints(kube, namespace, "web"),
    )
    proxy.wait_for_ready(1)
    assert {fetch(proxy.address, "/name") for _ in range(6)} == {healthy}
    assert proxy.changes[-1].removed == (f"{sick_ip}:8080",)
    print(f"endpoint change latencies: {[c.latency for c in proxy.changes]}")


DAEMON = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: agent
        image: busybox
        command: [sleep, "3600"]
"""


def test_daemonset_and_node_failure(cluster: ControlPlane, kube: Kube, kubelet: ProcessKubelet, namespace: str) -> None:
    nodes = sorted(kubelet.agents)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=DAEMON)
    pods = wait_for(
        lambda: len(r := ready_pods(kube, namespace, "app=agent")) == len(nodes) and r,
        60,
        describe=lambda: cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout,
    )
    assert sorted(p["spec"]["nodeName"] for p in pods.values()) == nodes

    failing = nodes[-1]
    on_failing = next(name for name, p in pods.items() if p["spec"]["nodeName"] == failing)
    kubelet.fail_node(failing)
    try:

        def node_not_ready() -> bool:
            conditions = kube.get(f"/api/v1/nodes/{failing}")["status"]["conditions"]
            return any(c["type"] == "Ready" and c["status"] != "True" for c in conditions)

        wait_for(node_not_ready, 30, describe=lambda: cluster.kubectl("get", "nodes").stdout)
        wait_for(
            lambda: on_failing not in ready_pods(kube, namespace, "app=agent"),
            30,
            describe=lambda: cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout,
        )
        survivors = ready_pods(kube, namespace, "app=agent")
        assert {p["spec"]["nodeName"] for p in survivors.values()} == set(nodes) - {failing}
    finally:
        kubelet.recover_node(failing)
    wait_for(
        lambda: on_failing in ready_pods(kube, namespace, "app=agent"),
        30,
        describe=lambda: cluster.kubectl("get", "nodes,pods", "-n", namespace, "-o", "wide").stdout,
    )


RBAC = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: configmap-reader}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader}
subjects: [{kind: ServiceAccount, name: reader}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-reader}
"""

IN_CLUSTER_PROBE = textwrap.dedent("""
    import json, os, ssl, urllib.error, urllib.request
    base = "/var/run/secrets/kubernetes.io/serviceaccount"
    token = open(f"{base}/token").read()
    namespace = open(f"{base}/namespace").read()
    context = ssl.create_default_context(cafile=f"{base}/ca.crt")
    server = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
    def call(method, body=None):
        request = urllib.request.Request(f"{server}/api/v1/namespaces/{namespace}/configmaps", method=method,
            data=json.dumps(body).encode() if body else None,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            return urllib.request.urlopen(request, context=context).status
        except urllib.error.HTTPError as error:
            return error.code
    print(json.dumps({"list": call("GET"), "create": call("POST", {"metadata": {"name": "x"}})}))
""")


def test_service_account_rbac_is_enforced(
    cluster: ControlPlane, kube: Kube, kubelet: ProcessKubelet, namespace: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=RBAC)
    as_reader = Kube.from_kubeconfig(cluster.service_account_kubeconfig(namespace, "reader"))
    assert as_reader.get(f"/api/v1/namespaces/{namespace}/configmaps")["kind"] == "ConfigMapList"
    with pytest.raises(ApiError) as denied:
        as_reader.create(f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "nope"}})
    assert denied.value.status == 403
    assert 'cannot create resource "configmaps"' in str(denied.value)

    # The same from inside a pod, through the projected token and in-cluster environment.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "in-cluster", "namespace": namespace},
        "spec": {
            "serviceAccountName": "reader",
            "restartPolicy": "Never",
            "containers": [{"name": "probe", "image": "python", "command": ["python", "-c", IN_CLUSTER_PROBE]}],
        },
    }
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    wait_for(
        lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/in-cluster")["status"].get("phase") == "Succeeded",
        60,
        describe=lambda: kubelet.logs(namespace, "in-cluster", "probe"),
    )
    assert json.loads(kubelet.logs(namespace, "in-cluster", "probe")) == {"list": 200, "create": 403}


def test_container_exit_is_reported_promptly(kube: Kube, kubelet: ProcessKubelet, namespace: str) -> None:
    script = "import time; time.sleep(0.5); print(repr(time.time()), flush=True); raise SystemExit(3)"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "exits", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "python", "command": ["python", "-c", script]}],
        },
    }
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    path = f"/api/v1/namespaces/{namespace}/pods"
    listing = kube.get(path, fieldSelector="metadata.name=exits")
    seen_at = None
    for _kind, event in kube.watch(
        path,
        resource_version=listing["metadata"]["resourceVersion"],
        fieldSelector="metadata.name=exits",
        timeout_seconds=60,
    ):
        statuses = event.get("status", {}).get("containerStatuses") or []
        if statuses and "terminated" in statuses[0]["state"]:
            seen_at = time.time()
            final = event
            break
    assert seen_at is not None, "the pod never reported its container's exit"
    exited_at = float(kubelet.logs(namespace, "exits", "main").strip())
    terminated = final["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    print(f"container exit seen by a watcher {1000 * (seen_at - exited_at):.0f} ms after the process printed")
    # A generous sanity bound; the measured figure (tens of ms) goes to the README.
    assert seen_at - exited_at < 2.0
    wait_for(lambda: kube.get(f"{path}/exits")["status"]["phase"] == "Failed", 10)


def test_helm_installs_a_chart(cluster: ControlPlane, kube: Kube, namespace: str, tmp_path) -> None:
    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "greeting.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: greeting}\ndata: {text: {{ .Values.greeting | quote }}}\n"
    )
    cluster.helm("install", "demo", str(chart), "--namespace", namespace, "--set", "greeting=hi")
    config_map = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/greeting")
    assert config_map["data"] == {"text": "hi"}
    assert config_map["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_garbage_collection_follows_owner_references(kube: Kube, namespace: str) -> None:
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    owner = kube.create(configmaps, {"metadata": {"name": "owner"}})
    kube.create(
        configmaps,
        {
            "metadata": {
                "name": "dependent",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
                ],
            }
        },
    )
    kube.delete(f"{configmaps}/owner", {"propagationPolicy": "Background"})

    def dependent_collected() -> bool:
        try:
            kube.get(f"{configmaps}/dependent")
        except ApiError as error:
            return error.status == 404
        return False

    wait_for(dependent_collected, 30)


def test_kubernetes_python_client_works_with_the_admin_kubeconfig(
    cluster: ControlPlane, kubelet: ProcessKubelet
) -> None:
    import kubernetes.client

    nodes = kubernetes.client.CoreV1Api(cluster.api_client()).list_node()
    assert sorted(n.metadata.name for n in nodes.items) == sorted(kubelet.agents)
    assert all(n.status.capacity["nvidia.com/gpu"] == "8" for n in nodes.items)
    # The build stamps the release version; charts' kubeVersion constraints depend on it.
    assert kubernetes.client.VersionApi(cluster.api_client()).get_code().git_version.startswith("v1.35.")
    assert "Server Version: v1.35." in cluster.kubectl("version").stdout
