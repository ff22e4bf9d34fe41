"""podsecurity.pod_security_problem: from the namespace's labels and the cache's backend, whether
Pod Security admission would refuse the cache's pods, said so that the fix can be copied."""

from __future__ import annotations

import pytest
from weightcache_operator.plan.podsecurity import ENFORCE_LABEL, beyond_baseline, pod_security_problem

BACKENDS = ["cpu-shm", "cuda-vmm", "cuda-ipc"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_baseline_and_restricted_namespaces_refuse_every_backend_naming_label_level_and_fix(
    backend: str, level: str
) -> None:
    problem = pod_security_problem("team-a", {ENFORCE_LABEL: level, "other": "x"}, backend)
    assert problem is not None
    assert f"namespace team-a has {ENFORCE_LABEL}={level}" in problem
    assert "need the privileged Pod Security level for hostPath volumes" in problem
    assert f"kubectl label namespace team-a {ENFORCE_LABEL}=privileged --overwrite" in problem


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "labels", [{ENFORCE_LABEL: "privileged"}, {}, None, {"pod-security.kubernetes.io/warn": "restricted"}]
)
def test_a_privileged_unlabelled_or_unreadable_namespace_is_not_refused(
    backend: str, labels: dict[str, str] | None
) -> None:
    assert pod_security_problem("team-a", labels, backend) is None


def test_only_cuda_ipc_names_host_ipc_and_pid() -> None:
    problem = pod_security_problem("ns", {ENFORCE_LABEL: "baseline"}, "cuda-ipc")
    assert problem is not None and "hostIPC and hostPID" in problem
    for backend in ("cpu-shm", "cuda-vmm"):
        assert not any("hostIPC" in use for use in beyond_baseline(backend)), backend
