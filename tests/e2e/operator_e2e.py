"""What the operator e2e scenarios share: the README sample (examples/weightcache-cpu.yaml) with
spec fields changed, waiting on its status phase, every status the API server shows (StatusRecorder),
engine pods by role, the daemon-ready gate, and
plain HTTP to engines and to the operator's metrics. Fixtures (the operator, the checkpoint) are
in conftest.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml
from testcluster.controlplane import ControlPlane
from testcluster.rest import ApiError, Kube
from testcluster.sample import ENGINES, NAME, SAMPLE, converged, pods
from testcluster.waiting import wait_for
from weightcache_operator.render.warm import WARM_CONTAINER

REPO = Path(__file__).resolve().parents[2]
GATE = "weightcache.io/daemon-ready"
PROMPT = {"prompt": "The weight cache", "max_tokens": 8, "temperature": 0, "return_token_ids": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: dict | None = None, timeout: float = 60) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def http_text(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the series ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{labels} in:\n{text}")


def total(text: str, name: str) -> float:
    """The sum of every series of ``name`` (with labels or without) in a Prometheus text page."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + "{", name + " ")))


def warm_status(pod: dict) -> dict:
    """What the pod's warm sidecar says (render/warm.py): warm, requests served, failures."""
    warm = next(c for c in pod["spec"]["containers"] if c["name"] == WARM_CONTAINER)
    return http_json(f"http://{pod['status']['podIP']}:{warm['ports'][0]['containerPort']}/status")


def stop_operator(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def resync(shard: Path) -> None:
    """The shard with one weight byte changed (same size, same safetensors header), written to a
    temporary file and renamed over it, as rsync does."""
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the last byte of the last tensor's data: past the header
    staged = shard.with_name(f".{shard.name}.resync")
    staged.write_bytes(data)
    os.replace(staged, shard)


def is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def gate(pod: dict) -> str | None:
    return next((c["status"] for c in pod["status"].get("conditions", []) if c["type"] == GATE), None)


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
    whole: bool = True,
) -> dict:
    """Waits for ``status.phase == want`` (and ``also(status)``) of the WeightCache ``name``: the
    status written after a change, not a stale one from before it. ``Ready`` waits for the cache
    converged (``sample.converged``: every daemon and engine Ready too), not only serving, unless
    ``whole`` is False."""
    wc = f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/{name}"

    def status() -> dict | None:
        assert operator.poll() is None, operator.log.read_text()[-4000:]  # type: ignore[attr-defined]
        found = kube.get(wc).get("status") or {}
        wanted = converged(found) if want == "Ready" and whole else found.get("phase") == want
        return found if wanted and also(found) else None

    return wait_for(status, timeout, interval=0.3, describe=lambda: json.dumps(kube.get(wc).get("status"), indent=1))


class StatusRecorder:
    """Every status of the WeightCache ``name`` the API server shows from ``start`` to ``stop``,
    in order, from a watch (resumed from its last resourceVersion): each write the operator made,
    not what a poll happened to sample."""

    def __init__(self, kube: Kube, namespace: str, name: str = NAME) -> None:
        self.kube, self.name = kube, name
        self.path = f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches"
        self.statuses: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def start(self) -> StatusRecorder:
        listing = self.kube.get(self.path, fieldSelector=f"metadata.name={self.name}")
        self.statuses += [item.get("status") or {} for item in listing["items"]]
        self._version = listing["metadata"]["resourceVersion"]
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join()
        return self.statuses

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                # Short watches: stop() waits at most one of them out.
                for kind, found in self.kube.watch(
                    self.path,
                    resource_version=self._version,
                    fieldSelector=f"metadata.name={self.name}",
                    timeout_seconds=2,
                ):
                    self._version = found["metadata"]["resourceVersion"]
                    if kind in ("ADDED", "MODIFIED"):
                        self.statuses.append(found.get("status") or {})
            except ApiError as error:
                raise AssertionError(f"the status watch ended: {error}") from error


def condition_of(status: dict, kind: str) -> dict:
    """The condition ``kind`` of ``status``, or {} when it has none."""
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def by_role(kube: Kube, namespace: str, engines: str = ENGINES) -> dict[str, list[str]]:
    """The engine pods (``engines``: their label selector) not being deleted, by role."""
    found: dict[str, list[str]] = {"active": [], "standby": []}
    for pod in pods(kube, namespace, engines):
        if not pod["metadata"].get("deletionTimestamp"):
            found[pod["metadata"]["labels"]["weightcache.io/role"]].append(pod["metadata"]["name"])
    return found
