"""The securityContext of every rendered container, and how a template's own merges with it.

Every container runs as the images' user (``RUN_AS``, the Dockerfile's ``USER 10001``), cannot
gain privileges, has no capabilities and runs under the runtime's default seccomp profile — the
restricted Pod Security profile's container rules. The pods as a whole cannot meet that profile:
they mount hostPath directories (the socket directory, a hostPath model, the GPU holder's grant),
which only the privileged level admits (docs/operations.md, "Pod Security and least privilege").

Daemon, keeper and engines must share one uid: a daemon admits on its sockets only peers of its
own uid or root (SO_PEERCRED, ``PeerPolicy``), creates its rank directory 0700 and its sockets
0600. The kubelet creates a hostPath ``DirectoryOrCreate`` as root (0755), and ``fsGroup`` does not
apply to hostPath volumes, so an init container (``owner_init``) hands the pod's host directories
to ``RUN_AS`` before the non-root processes start.
"""

from __future__ import annotations

import copy
from typing import Any

from weightcache_operator.render.layout import explain_exits

RUN_AS = 10001
"""uid and gid of every rendered container: the user the daemon and engine images are built with."""
SCRATCH_VOLUME = "weightcache-scratch"
SCRATCH_MOUNT = "/weightcache/scratch"
"""An emptyDir for temporary files (``TMPDIR``) of containers whose root filesystem is read-only."""
POD_LEVEL_FIELDS = ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile", "seLinuxOptions", "appArmorProfile")
"""Container securityContext fields a pod-level securityContext also sets (the container's win)."""


def container_security(read_only_root: bool) -> dict[str, Any]:
    """The restricted profile's container fields, non-root as ``RUN_AS``; ``read_only_root``
    where the process writes only to its volumes."""
    context: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    return context


def scratch_volume() -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The scratch emptyDir, its mount and the ``TMPDIR`` that points ``tempfile`` at it."""
    return (
        {"name": SCRATCH_VOLUME, "emptyDir": {}},
        {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_MOUNT},
        {"name": "TMPDIR", "value": SCRATCH_MOUNT},
    )


def owner_init(image: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """An init container that gives the host directories mounted at ``mounts`` (and what a
    process of an older image left in them) to ``RUN_AS``. It alone runs as root, with only
    CAP_CHOWN: a hostPath directory is root's when the kubelet creates it, and nothing else can
    make it writable for the non-root daemon, keeper and GPU holder."""
    paths = [m["mountPath"] for m in mounts]
    return explain_exits(
        {
            "name": "own-host-dirs",
            "image": image,
            "command": ["chown", "-R", f"{RUN_AS}:{RUN_AS}", *paths],
            "volumeMounts": [{k: v for k, v in m.items() if k != "readOnly"} for m in mounts],
            "securityContext": {
                **container_security(read_only_root=True),
                "runAsNonRoot": False,
                "runAsUser": 0,
                "runAsGroup": 0,
                "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
            },
        }
    )


def with_defaults(
    container_context: dict[str, Any] | None, pod_context: dict[str, Any] | None, defaults: dict[str, Any]
) -> dict[str, Any]:
    """A template container's securityContext: ``defaults`` under what the template sets, field by
    field (objects such as ``capabilities`` merged key by key, lists replaced whole). A field the
    template sets in the pod's securityContext is left out of the defaults, since a container's
    value would override the pod's and undo the user's choice."""
    pod_set = {k for k in POD_LEVEL_FIELDS if k in (pod_context or {})}
    base = {k: v for k, v in copy.deepcopy(defaults).items() if k not in pod_set}
    return _merge(base, copy.deepcopy(container_context or {}))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = value
    return base
