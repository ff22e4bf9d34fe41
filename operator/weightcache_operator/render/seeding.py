"""Seeding (``spec.daemon.seeding``): what the daemon pods of a cache need to copy ranks from one
another instead of the disk, and the two objects the operator keeps for it.

- The **credential Secret** ``<name>-seeding``: ``CREDENTIAL_KEY`` holding random bytes, created
  when missing (never rewritten, never read, never logged: executor.py makes the bytes and sends
  them), owned by the WeightCache. Deleting it rotates it: the next full pass (the resync at the
  latest) creates a new one, and the daemons read the file again on each handshake.
- The **peers ConfigMap** ``<name>-seed-peers``: ``PEERS_FILE`` holding the ``SeedPeers`` JSON the
  operator computes each pass (plan/seeding.py), applied only when it differs.

Both are mounted into every daemon pod, neither is hashed into its template: a new Ready daemon
rewrites the peers file, which must not roll every daemon. The ConfigMap's volume is optional (a
daemon may start before the first peers file), the Secret's is not (a daemon never serves or
fetches without it). With ``mode: Off`` nothing of this is rendered.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from weightcache_contract.seeding import CREDENTIAL_KEY, PEERS_FILE, SEED_PORT, SEED_PORT_NAME, SeedPeers

from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import SEED_CREDENTIAL_MOUNT, SEED_PEERS_MOUNT, CacheRef

PEERS_VOLUME = "weightcache-seed-peers"
CREDENTIAL_VOLUME = "weightcache-seed-credential"
SEED_PEERS_FILE = f"{SEED_PEERS_MOUNT}/{PEERS_FILE}"
SEED_CREDENTIAL_FILE = f"{SEED_CREDENTIAL_MOUNT}/{CREDENTIAL_KEY}"


def uses_seeding(cache: WeightCache) -> bool:
    return cache.spec.daemon.seeding.mode == "Peers"


def seed_daemon_args(cache: WeightCache) -> dict[str, Any]:
    """The daemon's seeding flags (``DaemonArgs`` fields); none with ``mode: Off``."""
    if not uses_seeding(cache):
        return {}
    seeding = cache.spec.daemon.seeding
    return {
        "seed_listen": f"$(POD_IP):{SEED_PORT}",
        "seed_peers_file": SEED_PEERS_FILE,
        "seed_credential_file": SEED_CREDENTIAL_FILE,
        "seed_max_mib_s": seeding.max_mib_per_second,
        "seed_max_clients": seeding.max_clients,
        "seed_streams": seeding.streams,
        "seed_stall_seconds": seeding.stall_seconds,
        "seed_min_mib_s": seeding.min_mib_per_second,
        "node_name": "$(NODE_NAME)",
    }


NODE_NAME_ENV = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def seed_port() -> dict[str, Any]:
    """The daemon container's seed port: local rank 0's; local rank i serves on ``SEED_PORT + i``."""
    return {"name": SEED_PORT_NAME, "containerPort": SEED_PORT, "protocol": "TCP"}


def seed_volumes(cache: WeightCache) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, the daemon container's read-only mounts) of the peers file and the credential."""
    ref = CacheRef.of(cache)
    volumes = [
        {"name": PEERS_VOLUME, "configMap": {"name": ref.seed_peers_name, "optional": True}},
        {"name": CREDENTIAL_VOLUME, "secret": {"secretName": ref.seeding_secret_name, "optional": False}},
    ]
    mounts = [
        {"name": PEERS_VOLUME, "mountPath": SEED_PEERS_MOUNT, "readOnly": True},
        {"name": CREDENTIAL_VOLUME, "mountPath": SEED_CREDENTIAL_MOUNT, "readOnly": True},
    ]
    return volumes, mounts


def seeding_secret(cache: WeightCache, credential: bytes) -> dict[str, Any]:
    """The credential Secret holding ``credential`` (the caller's random bytes)."""
    ref = CacheRef.of(cache)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": ref.seeding_secret_name,
            "namespace": ref.namespace,
            "labels": ref.labels("seeding"),
            "ownerReferences": [ref.owner_reference()],
        },
        "data": {CREDENTIAL_KEY: base64.b64encode(credential).decode()},
    }


def seed_peers_configmap(cache: WeightCache, peers: SeedPeers) -> dict[str, Any]:
    """The peers ConfigMap: ``peers`` as sorted, compact JSON, so an unchanged world renders the
    same bytes and applies nothing."""
    ref = CacheRef.of(cache)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ref.seed_peers_name,
            "namespace": ref.namespace,
            "labels": ref.labels("seeding"),
            "ownerReferences": [ref.owner_reference()],
        },
        "data": {PEERS_FILE: peers_json(peers)},
    }


def peers_json(peers: SeedPeers) -> str:
    return json.dumps(peers.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
