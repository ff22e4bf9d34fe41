"""Starting a container's process: its own session, its volumes bind-mounted at their paths.

As root each container runs in a private mount namespace (``unshare --mount``), where its
volumes are bind-mounted at the container paths the pod spec names, so a command that opens
``/var/run/secrets/kubernetes.io/serviceaccount/token`` or ``/models`` works unchanged. Mount
points that do not exist are created (empty) on the host filesystem, as bind mounts need them.
The kubelet remembers which of those it created and removes them at shutdown, once empty and
no longer a mount point in any process's namespace. A pod's containers (but hostNetwork
ones) also get a UTS namespace whose hostname is the pod's, and its /etc/hosts (``pods.py``).
Each starts in its node's network namespace (the caller's thread is in it, ``testcluster.netns``).
Without root there is no mount namespace: the command runs with the host's view, and volumes
are only reachable at their host paths (a documented limitation; env and args are not rewritten).

Each container process leads its own session and process group, so stopping a container
signals everything it started; processes that left the group (``setsid``, daemonizing) are
still found by the ``WEIGHTCACHE_CONTAINER`` marker in their environment and killed when the
container ends, as a container runtime would by tearing down the container's cgroup.
``setpriv --pdeathsig KILL`` ties the container to the kubelet thread that started and waits
on it: if the test process is killed outright, its containers die with it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..strays import processes_with_environment

_SETPRIV = shutil.which("setpriv")
_created_mount_points: set[Path] = set()
_created_lock = threading.Lock()


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False


def mount_namespaces_available() -> bool:
    return os.geteuid() == 0 and subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


def start_process(
    argv: Sequence[str],
    environment: dict[str, str],
    working_dir: str | None,
    mounts: Sequence[Mount],
    log: IO[bytes],
    isolate: bool,
    hostname: str | None = None,
) -> subprocess.Popen[bytes]:
    """Starts the container's command; the returned Popen's pid is the command itself
    (unshare and the mount script exec into it), so waiting on it sees the real exit code.
    ``hostname``: the container's, in a UTS namespace of its own (isolated only)."""
    if isolate:
        _remember_missing([Path(mount.target) for mount in mounts] + ([Path(working_dir)] if working_dir else []))
        lines = ["set -e"]
        if hostname:
            lines.append(f"echo {shlex.quote(hostname)} > /proc/sys/kernel/hostname")
        for mount in mounts:
            target = shlex.quote(mount.target)
            if mount.source.is_dir():
                lines.append(f"mkdir -p {target}")
            else:
                lines.append(f"mkdir -p $(dirname {target}) && [ -e {target} ] || touch {target}")
            lines.append(f"mount --bind {shlex.quote(str(mount.source))} {target}")
            if mount.read_only:
                lines.append(f"mount -o remount,bind,ro {target}")
        if working_dir:
            lines.append(f"mkdir -p {shlex.quote(working_dir)} && cd {shlex.quote(working_dir)}")
        lines.append('exec "$@"')
        command = [
            "unshare",
            "--mount",
            *(["--uts"] if hostname else []),
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            "\n".join(lines),
            "container",
            *argv,
        ]
        cwd = None
    else:
        command = list(argv)
        cwd = working_dir if working_dir and Path(working_dir).is_dir() else None
    if _SETPRIV:
        command = [_SETPRIV, "--pdeathsig", "KILL", "--", *command]
    return subprocess.Popen(
        command,
        env=environment,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def signal_group(process: subprocess.Popen[bytes], signal_number: int) -> None:
    """Signals the container's whole process group; a group that is already gone is fine."""
    try:
        os.killpg(process.pid, signal_number)
    except (ProcessLookupError, PermissionError):
        pass


def _remember_missing(targets: list[Path]) -> None:
    missing = []
    for target in targets:
        path = target
        while not os.path.lexists(path):
            missing.append(path)
            path = path.parent
    with _created_lock:
        _created_mount_points.update(missing)


def remove_created_mount_points() -> None:
    """Removes the empty mount points this process created on the host, deepest first,
    unless one is still mounted somewhere (another test session may be using it)."""
    in_use = _mount_points_in_use()
    with _created_lock:
        candidates = sorted(_created_mount_points, key=lambda p: len(p.parts), reverse=True)
        _created_mount_points.clear()
    for path in candidates:
        if str(path) in in_use:
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif path.is_file() and path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass  # not empty or already gone: someone else's now


def _mount_points_in_use() -> set[str]:
    seen_namespaces: set[str] = set()
    points: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            namespace = os.readlink(entry / "ns" / "mnt")
            if namespace in seen_namespaces:
                continue
            seen_namespaces.add(namespace)
            for line in (entry / "mountinfo").read_text().splitlines():
                points.add(line.split()[4])
        except OSError:
            continue
    return points


CONTAINER_MARKER = "WEIGHTCACHE_CONTAINER"


def kill_container_processes(process: subprocess.Popen[bytes], marker: str) -> None:
    """SIGKILLs what is left of a container: its process group and any escaped descendant."""
    signal_group(process, signal.SIGKILL)
    for pid in processes_with_environment(CONTAINER_MARKER, marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
