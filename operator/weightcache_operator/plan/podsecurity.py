"""Whether a namespace's Pod Security admission admits a cache's pods: decided before anything is
rendered, so that a forbidding ``pod-security.kubernetes.io/enforce`` label gives the cache a
condition that names it, instead of DaemonSets whose pods the API server never creates.

Every backend's daemon, GPU holder and engine pods mount hostPath directories (the socket
directory the engines connect through; a hostPath model), which the baseline and restricted
levels forbid, so they need the privileged level; ``cuda-ipc`` adds hostIPC and hostPID, also
beyond baseline. docs/operations.md ("Pod Security and least privilege") lists what each pod uses.
"""

from __future__ import annotations

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
NEEDED_LEVEL = "privileged"
FORBIDDING_LEVELS = ("baseline", "restricted")
"""The levels that refuse hostPath volumes. A label absent (the cluster's default level applies,
which admission configuration sets and the API does not show) or of another value is not judged."""
REASON = "PodSecurityForbids"


def beyond_baseline(backend: str) -> list[str]:
    """What the backend's pods use that only the privileged level admits."""
    uses = ["hostPath volumes (the socket directory shared by daemons and engines)"]
    if backend == "cuda-ipc":
        uses.append("hostIPC and hostPID (legacy CUDA IPC handles open only across shared namespaces)")
    return uses


def pod_security_problem(namespace: str, labels: dict[str, str] | None, backend: str) -> str | None:
    """Why the namespace (its ``labels``; None when they could not be read) refuses the pods of a
    cache of ``backend``, naming the label, the level needed and the fix; None when it admits them
    or the level is not known."""
    level = (labels or {}).get(ENFORCE_LABEL)
    if level not in FORBIDDING_LEVELS:
        return None
    return (
        f"namespace {namespace} has {ENFORCE_LABEL}={level}, which forbids the cache's pods: they need the"
        f" {NEEDED_LEVEL} Pod Security level for {' and '.join(beyond_baseline(backend))}; nothing is created until"
        f" the namespace allows them: kubectl label namespace {namespace} {ENFORCE_LABEL}={NEEDED_LEVEL} --overwrite"
        " (or create the cache in a namespace labelled so)"
    )
