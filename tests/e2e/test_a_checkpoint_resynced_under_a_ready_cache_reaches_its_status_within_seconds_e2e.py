"""A checkpoint re-synced under a Ready cache (new bytes, same file names, each written to a
temporary file and renamed over the shard, as rsync does) shows up as ``CheckpointChanged=True``
in the WeightCache's status, with its ``FilesChanged`` Event, within 10 s of the write: the
daemons see it through inotify, and the operator hears their reports change through its long
polls (observe/daemon_changes.py) rather than at its next re-read of a Ready daemon (30 s)."""

from __future__ import annotations

import subprocess
import time

import pytest
from operator_e2e import resync
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import NAME, checkpoint_path

pytestmark = pytest.mark.e2e

WITHIN_S = 10.0


def test_a_checkpoint_resynced_under_a_ready_cache_reaches_its_status_and_event_within_seconds(
    kube: Kube, kubelet: ProcessKubelet, namespace: str, operator: subprocess.Popen, ready_sample: dict
) -> None:
    assert {c["type"]: c["status"] for c in ready_sample["conditions"]}["CheckpointChanged"] == "False"
    wc = f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/{NAME}"
    copies = [kubelet.node_root(node) / checkpoint_path().lstrip("/") for node in ("node-1", "node-2")]
    shard = sorted(copies[0].glob("*.safetensors"))[-1].name
    for copy in copies:
        resync(copy / shard)
    written = time.monotonic()

    verifying_at = changed_at = event_at = None
    condition: dict = {}
    while time.monotonic() - written < 60 and (changed_at is None or event_at is None):
        assert operator.poll() is None, operator.log.read_text()[-4000:]  # type: ignore[attr-defined]
        now = time.monotonic() - written
        conditions = {c["type"]: c for c in (kube.get(wc).get("status") or {}).get("conditions") or []}
        condition = conditions.get("CheckpointChanged") or {}
        if verifying_at is None and condition.get("reason") == "Verifying":
            verifying_at = now
        if changed_at is None and condition.get("status") == "True":
            changed_at = now
        if event_at is None:
            found = [
                e
                for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
                if e.get("reason") == "FilesChanged" and e["involvedObject"]["name"] == NAME
            ]
            if found:
                event_at = now
        time.sleep(0.1)
    print(
        f"checkpoint re-synced: Verifying in the status after {verifying_at} s, CheckpointChanged=True after "
        f"{changed_at} s, its FilesChanged Event after {event_at} s"
    )
    assert changed_at is not None and event_at is not None, condition
    assert condition["reason"] == "FilesChanged" and shard in condition["message"], condition
    assert changed_at < WITHIN_S and event_at < WITHIN_S, (changed_at, event_at)
