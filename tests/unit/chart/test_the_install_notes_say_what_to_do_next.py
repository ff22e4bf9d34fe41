"""What helm prints after an install: the next commands, the Pod Security label and what the install
serves."""

from __future__ import annotations

from helm_chart import CHART, run_helm


def test_notes_say_what_to_do_next(helm: str) -> None:
    result = run_helm(
        helm,
        "install",
        "weightcache",
        str(CHART),
        "--dry-run=client",
        "--namespace",
        "weightcache-system",
        "--set",
        "daemon.backend=cpu-shm",
        "--set",
        "daemon.image.tag=0.1.1",
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout[result.stdout.index("NOTES:") :]
    assert "kubectl apply -n NAMESPACE -f examples/weightcache-cpu.yaml" in notes
    assert "kubectl get wc -n NAMESPACE -w" in notes
    assert "pod-security.kubernetes.io/enforce=privileged" in notes
    assert "spec.daemon.image:   weightcache/daemon:0.1.1" in notes and "spec.daemon.backend: cpu-shm" in notes
    assert "serving every namespace" in notes
