"""The operator as a real process against the real control plane and the process kubelet:
examples/weightcache-cpu.yaml → daemons Ready → engines Ready (gated on their node's daemon, and
only once each has served its warm sidecar's request) → a completion through the Service equal to
an engine that read the checkpoint from disk."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from operator_e2e import PROMPT, gate, http_json, http_text, is_ready, total, warm_status
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import SAMPLE, converged, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


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

    def whole() -> bool:
        assert operator.poll() is None, operator.log.read_text()[-4000:]  # type: ignore[attr-defined]
        return converged(kube.get(wc).get("status") or {})

    wait_for(whole, 300, interval=0.5, describe=lambda: json.dumps(kube.get(wc).get("status"), indent=1))

    daemons = pods(kube, namespace, "weightcache.io/cache=tiny-llama,weightcache.io/component=daemon")
    assert sorted(p["spec"]["nodeName"] for p in daemons) == ["node-1", "node-2"] and all(map(is_ready, daemons))
    engines = pods(kube, namespace, "weightcache.io/cache=tiny-llama,weightcache.io/component=engine")
    roles = sorted(p["metadata"]["labels"]["weightcache.io/role"] for p in engines)
    assert roles == ["active", "standby"] and all(map(is_ready, engines)) and all(gate(p) == "True" for p in engines)
    for engine in engines:
        assert engine["metadata"]["ownerReferences"][0]["kind"] == "WeightCache"
        # Hot means it has served: before any client asked, each Ready engine (the standby too)
        # generated a token for its warm sidecar's request, through its own API.
        assert warm_status(engine)["warmed"] >= 1, warm_status(engine)
        page = http_text(f"http://{engine['status']['podIP']}:8000/metrics")
        assert total(page, "weightcache_engine_generated_tokens_total") >= 1, page

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
    assert table[0].split()[:9] == ["NAME", "PHASE", "CHANGE", "READY", "NODES", "ACTIVE", "STANDBY", "SERVED", "MODEL"]
    # CHANGE is empty while no generation change is under way, so the row has no word for it.
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
