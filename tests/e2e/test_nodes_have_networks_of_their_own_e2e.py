"""Each process-kubelet node is a host of its own: its pods' addresses live in its network
namespace and nowhere else, the test client and the other nodes reach them over the bridge, and
the fault API cuts a node off (from everything, or from the API server only: its kubelet goes
silent and the node NotReady, while its pods still answer), slows its link, and heals it."""

from __future__ import annotations

import os
import socket
import time
import urllib.request

import pytest
from network_e2e import fault, wait_node
from test_process_kubelet import create_pod, get_pod
from testcluster.kubelet import ProcessKubelet
from testcluster.netns import entered
from testcluster.rest import Kube
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e

BODY = 256 * 1024
SERVE = (
    "mkdir -p /srv && readlink /proc/self/ns/net > /srv/ns && head -c {body} /dev/zero > /srv/body && "
    'exec python3 -m http.server 8080 --bind "$POD_IP" --directory /srv'
)


def fetch(url: str, netns: str | None = None, timeout: float = 3) -> bytes:
    with entered(netns):
        # The connection is made where the thread is; reading it may happen anywhere.
        response = urllib.request.urlopen(url, timeout=timeout)
    with response:
        return response.read()


def answers(url: str, netns: str | None = None) -> bool:
    try:
        return bool(fetch(url, netns, timeout=1))
    except OSError:
        return False


def test_a_node_s_pods_live_in_its_network_and_faults_cut_slow_and_heal_it(
    kube: Kube, kubelet: ProcessKubelet, namespace: str
) -> None:
    node, other = "node-1", "node-2"
    create_pod(
        kube,
        namespace,
        "web",
        {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "web",
                    "image": "python",
                    "command": ["sh", "-c", SERVE.format(body=BODY)],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "volumeMounts": [{"name": "srv", "mountPath": "/srv"}],
                    "readinessProbe": {"httpGet": {"path": "/ns", "port": 8080}, "periodSeconds": 1},
                }
            ],
            "volumes": [{"name": "srv", "emptyDir": {}}],
        },
    )
    wait_for(
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in get_pod(kube, namespace, "web")["status"].get("conditions", [])
        ),
        60,
        describe=lambda: get_pod(kube, namespace, "web")["status"],
    )
    ip = get_pod(kube, namespace, "web")["status"]["podIP"]
    url = f"http://{ip}:8080"
    netns = kubelet.netns(node)
    assert netns is not None and kubelet.netns(other) not in (None, netns)

    # The pod runs in its node's namespace; its address is bound there and nowhere else.
    served = fetch(f"{url}/ns").decode().strip()
    assert served == f"net:[{os.stat(f'/run/netns/{netns}').st_ino}]", served
    with pytest.raises(OSError):
        socket.create_server((ip, 0)).close()
    assert fetch(f"{url}/ns", kubelet.netns(other)).decode().strip() == served, "the other node reaches it"

    # Cut off from the API server only: the node turns NotReady while its pod still answers.
    with fault(kubelet, node, "cut-api"):
        wait_node(kube, node, ready=False)
        assert answers(f"{url}/ns") and answers(f"{url}/ns", kubelet.netns(other))
    wait_node(kube, node, ready=True)

    # Cut off from everything: nobody reaches the pod, and the node turns NotReady.
    with fault(kubelet, node, "cut"):
        assert not answers(f"{url}/ns") and not answers(f"{url}/ns", kubelet.netns(other))
        wait_node(kube, node, ready=False)
    wait_node(kube, node, ready=True)
    assert wait_for(lambda: answers(f"{url}/ns"), 30)

    # A slow link: 256 KiB at 1 Mbit/s takes about 2 s; healed, a small share of that.
    with fault(kubelet, node, "slow", rate_kbit=1000):
        started = time.monotonic()
        assert len(fetch(f"{url}/body", timeout=30)) == BODY
        slow = time.monotonic() - started
    started = time.monotonic()
    assert len(fetch(f"{url}/body")) == BODY
    fast = time.monotonic() - started
    print(f"256 KiB over the node's link: {slow:.2f} s at 1 Mbit/s, {fast:.3f} s healed")
    assert slow > 1.5 and fast < slow / 4, (slow, fast)
    assert kubelet.network(node).faults() == []
