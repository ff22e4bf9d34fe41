"""Materializes a pod's volumes as host directories, ready to be bind-mounted into containers.

hostPath volumes live under the node's root directory: ``hostPath.path: /models`` on node
``node-1`` is ``<kubelet root>/nodes/node-1/root/models`` on this machine, so two simulated
nodes never share a "host" directory and tests can pre-populate one node's disk.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from ..rest import ApiError, Kube, Object
from .podfields import field_value, resource_value

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class VolumeNotReady(Exception):
    """A source the volume needs (a ConfigMap, a Secret, a token) is not there yet: retry."""


def node_host_path(node_root: Path, host_path: str) -> Path:
    return node_root / host_path.lstrip("/")


def prepare_volumes(kube: Kube, pod: Object, pod_dir: Path, node_root: Path) -> dict[str, Path]:
    """Returns each volume's name and its host directory (or file, for file hostPaths)."""
    prepared: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes", []) or []:
        name = volume["name"]
        target = pod_dir / "volumes" / name
        if "hostPath" in volume:
            prepared[name] = _host_path(node_root, volume["hostPath"])
        elif "emptyDir" in volume:
            target.mkdir(parents=True, exist_ok=True)
            prepared[name] = target
        elif "configMap" in volume:
            _write_files(
                target, _config_map_files(kube, pod, volume["configMap"]), volume["configMap"].get("defaultMode")
            )
            prepared[name] = target
        elif "secret" in volume:
            source = {**volume["secret"], "name": volume["secret"].get("secretName")}
            _write_files(target, _secret_files(kube, pod, source), volume["secret"].get("defaultMode"))
            prepared[name] = target
        elif "downwardAPI" in volume:
            _write_files(target, _downward_files(pod, volume["downwardAPI"]), volume["downwardAPI"].get("defaultMode"))
            prepared[name] = target
        elif "projected" in volume:
            files: dict[str, tuple[bytes, int | None]] = {}
            for source in volume["projected"].get("sources", []) or []:
                files.update(_projected_source_files(kube, pod, source))
            _write_files(target, files, volume["projected"].get("defaultMode"))
            prepared[name] = target
        else:
            raise ValueError(f"volume {name!r}: unsupported source {sorted(set(volume) - {'name'})}")
    return prepared


REFRESHED = ("configMap", "secret")
"""Volume kinds whose files follow their object while the pod runs, as a kubelet's sync loop
keeps them (every minute or so there; every ``pods.VOLUME_SYNC_S`` here). Projected volumes are
left as written: their tokens are not refreshed either (``request_token``)."""


def refresh_volumes(kube: Kube, pod: Object, pod_dir: Path) -> None:
    """Rewrites the files of the pod's configMap and secret volumes from the objects as they are now."""
    for volume in pod["spec"].get("volumes", []) or []:
        target = pod_dir / "volumes" / volume["name"]
        if "configMap" in volume:
            files = _config_map_files(kube, pod, volume["configMap"])
            _write_files(target, files, volume["configMap"].get("defaultMode"))
        elif "secret" in volume:
            source = {**volume["secret"], "name": volume["secret"].get("secretName")}
            _write_files(target, _secret_files(kube, pod, source), volume["secret"].get("defaultMode"))


def _host_path(node_root: Path, source: Object) -> Path:
    path = node_host_path(node_root, source["path"])
    kind = source.get("type", "")
    if kind in ("File", "FileOrCreate"):
        if kind == "FileOrCreate" or not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)
    elif kind in ("Socket", "CharDevice", "BlockDevice"):
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        # "", Directory and DirectoryOrCreate: a missing "host" directory is created, because a
        # simulated node starts empty and a bind mount needs something to mount.
        path.mkdir(parents=True, exist_ok=True)
    return path


def _optional_get(kube: Kube, path: str, optional: bool) -> Object | None:
    try:
        return kube.get(path)
    except ApiError as error:
        if error.status == 404:
            if optional:
                return None
            raise VolumeNotReady(f"{path} not found") from error
        raise


def _select(items: list[Object] | None, data: dict[str, bytes]) -> dict[str, tuple[bytes, int | None]]:
    if not items:
        return {key: (value, None) for key, value in data.items()}
    return {item["path"]: (data[item["key"]], item.get("mode")) for item in items if item["key"] in data}


def _config_map_files(kube: Kube, pod: Object, source: Object) -> dict[str, tuple[bytes, int | None]]:
    namespace = pod["metadata"]["namespace"]
    config_map = _optional_get(
        kube, f"/api/v1/namespaces/{namespace}/configmaps/{source['name']}", bool(source.get("optional"))
    )
    if config_map is None:
        return {}
    data = {k: v.encode() for k, v in (config_map.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (config_map.get("binaryData") or {}).items()})
    return _select(source.get("items"), data)


def _secret_files(kube: Kube, pod: Object, source: Object) -> dict[str, tuple[bytes, int | None]]:
    namespace = pod["metadata"]["namespace"]
    secret = _optional_get(
        kube, f"/api/v1/namespaces/{namespace}/secrets/{source['name']}", bool(source.get("optional"))
    )
    if secret is None:
        return {}
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    return _select(source.get("items"), data)


def _downward_files(pod: Object, source: Object) -> dict[str, tuple[bytes, int | None]]:
    files = {}
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    for item in source.get("items", []) or []:
        if "fieldRef" in item:
            value = field_value(pod, item["fieldRef"]["fieldPath"])
        else:
            ref = item["resourceFieldRef"]
            value = resource_value(containers[ref.get("containerName") or next(iter(containers))], ref)
        files[item["path"]] = (value.encode(), item.get("mode"))
    return files


def _projected_source_files(kube: Kube, pod: Object, source: Object) -> dict[str, tuple[bytes, int | None]]:
    if "serviceAccountToken" in source:
        token_source = source["serviceAccountToken"]
        return {token_source["path"]: (request_token(kube, pod, token_source).encode(), None)}
    if "configMap" in source:
        return _config_map_files(kube, pod, source["configMap"])
    if "secret" in source:
        return _secret_files(kube, pod, source["secret"])
    if "downwardAPI" in source:
        return _downward_files(pod, source["downwardAPI"])
    raise ValueError(f"unsupported projected source {sorted(source)}")


def request_token(kube: Kube, pod: Object, source: Object) -> str:
    """A bound ServiceAccount token via the TokenRequest API, as the real kubelet obtains it.

    Tokens are not refreshed: they default to an hour (3607 s), longer than any test session.
    """
    metadata = pod["metadata"]
    account = pod["spec"].get("serviceAccountName") or "default"
    body: dict[str, Any] = {
        "spec": {
            "audiences": [source["audience"]] if source.get("audience") else [],
            "expirationSeconds": int(source.get("expirationSeconds", 3607)),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": metadata["name"], "uid": metadata["uid"]},
        }
    }
    try:
        answer = kube.create(f"/api/v1/namespaces/{metadata['namespace']}/serviceaccounts/{account}/token", body)
    except ApiError as error:
        if error.status == 404:
            raise VolumeNotReady(f"ServiceAccount {account} not found") from error
        raise
    return answer["status"]["token"]


def _write_files(directory: Path, files: dict[str, tuple[bytes, int | None]], default_mode: int | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for relative, (content, mode) in files.items():
        path = directory / relative
        if path.is_file() and path.read_bytes() == content:
            continue  # unchanged: a reader never sees a replacement for nothing
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(content)
        os.chmod(partial, mode if mode is not None else (default_mode if default_mode is not None else 0o644))
        os.replace(partial, path)
