"""``spec.model.onChange: Reload`` under a Ready cache whose checkpoint is re-synced: a new daemon
generation loads the new bytes and the engines move to it while the old generation serves, and
every status the API server shows through the whole reload says ``Ready`` (what ``kubectl get wc
-w`` prints), with ``GenerationChange`` saying what moves and ``Converged`` at the end."""

from __future__ import annotations

import subprocess
import time

import pytest
from operator_e2e import StatusRecorder, apply_sample, resync, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import checkpoint_path

pytestmark = pytest.mark.e2e


def test_a_checkpoint_reload_moves_to_a_new_generation_and_the_phase_never_leaves_ready(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint,  # type: ignore[no-untyped-def]
) -> None:
    apply_sample(cluster, namespace, model__onChange="Reload")
    before = wait_phase(kube, namespace, operator, "Ready")
    old_hash = before["daemonSpecHash"]
    recorder = StatusRecorder(kube, namespace).start()
    copies = [kubelet.node_root(node) / checkpoint_path().lstrip("/") for node in ("node-1", "node-2")]
    shard = sorted(copies[0].glob("*.safetensors"))[-1].name
    for copy in copies:
        resync(copy / shard)
    written = time.monotonic()

    after = wait_phase(
        kube,
        namespace,
        operator,
        "Ready",
        timeout=300,
        also=lambda s: (
            s.get("daemonSpecHash") != old_hash
            and (s.get("rollout") or {}).get("phase") == "Complete"
            and not s.get("generationChange")
        ),
    )
    reloaded_s = time.monotonic() - written
    statuses = recorder.stop()

    assert after.get("checkpointReload"), after
    changes = [s.get("generationChange") for s in statuses]
    phases = [s.get("phase") for s in statuses if s.get("phase")]
    print(f"reload: new generation whole {reloaded_s:.1f} s after the write; {len(statuses)} statuses: {phases}")
    assert any(changes), "GenerationChange named the reload while it ran"
    assert set(phases) == {"Ready"}, f"the old generation served throughout, so no other phase: {phases}"
    moving = [next((c for c in s.get("conditions") or [] if c["type"] == "GenerationChange"), None) for s in statuses]
    assert any(c and c["status"] == "True" for c in moving)
    final = next(c for c in after["conditions"] if c["type"] == "GenerationChange")
    assert (final["status"], final["reason"]) == ("False", "Converged"), final
