"""The node's compile-artifact directory of a cache whose profile uses one (``uses_artifacts``):
the daemon pod owns and publishes it, engines start from its entries and stage what they compile
(``weightcache artifacts-run``)."""

from __future__ import annotations

from typing import Any

from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import ARTIFACT_MOUNT, CacheRef

ARTIFACT_VOLUME = "weightcache-artifacts"


def daemon_artifact_volume(cache: WeightCache) -> tuple[dict[str, Any], dict[str, Any]]:
    """The daemon pod owns the node's artifact directory (owner_init hands it to the daemon's uid)."""
    volume = {
        "name": ARTIFACT_VOLUME,
        "hostPath": {"path": CacheRef.of(cache).artifact_host_dir, "type": "DirectoryOrCreate"},
    }
    return volume, {"name": ARTIFACT_VOLUME, "mountPath": ARTIFACT_MOUNT}


def engine_artifact_volumes(cache: WeightCache) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """An engine sees the published entries read-only (the kernel refuses its writes there, so no
    engine can change what another starts from) and writes only under ``staging/``, where its
    wrapper makes a private directory. ``Directory``, not ``DirectoryOrCreate``: the daemon creates
    both (a kubelet-created one would be root's, unwritable for the engine), and engines start only
    where the daemon is ready."""
    host = CacheRef.of(cache).artifact_host_dir
    return [
        (
            {"name": f"{ARTIFACT_VOLUME}-{part}", "hostPath": {"path": f"{host}/{part}", "type": "Directory"}},
            {"name": f"{ARTIFACT_VOLUME}-{part}", "mountPath": f"{ARTIFACT_MOUNT}/{part}", "readOnly": read_only},
        )
        for part, read_only in (("entries", True), ("staging", False))
    ]
