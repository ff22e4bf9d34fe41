"""A container's environment: what a real kubelet would set, on top of a minimal host base."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping

from ..rest import ApiError, Kube, Object
from .podfields import field_value, resource_value

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: unknown references stay as written, $$ escapes."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return variables.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


class MissingReference(Exception):
    """A non-optional ConfigMap/Secret key is missing: the container cannot start (yet)."""


def container_environment(
    kube: Kube, pod: Object, container: Object, base: Mapping[str, str], api_host: str, api_port: int
) -> dict[str, str]:
    namespace = pod["metadata"]["namespace"]
    cache: dict[str, Object | None] = {}

    def lookup(kind: str, name: str) -> Object | None:
        key = f"{kind}/{name}"
        if key not in cache:
            try:
                cache[key] = kube.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
            except ApiError as error:
                if error.status != 404:
                    raise
                cache[key] = None
        return cache[key]

    environment = dict(base)
    environment.update(
        {
            "HOSTNAME": pod["metadata"]["name"],
            # The Service IP of "kubernetes" is not routed here; in-cluster clients go straight to
            # the API server, whose certificate is valid for its address.
            "KUBERNETES_SERVICE_HOST": api_host,
            "KUBERNETES_SERVICE_PORT": str(api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(api_port),
            "KUBERNETES_PORT": f"tcp://{api_host}:{api_port}",
        }
    )
    for source in container.get("envFrom", []) or []:
        prefix = source.get("prefix", "")
        for kind, ref_key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
            if ref_key not in source:
                continue
            ref = source[ref_key]
            found = lookup(kind, ref["name"])
            if found is None:
                if ref.get("optional"):
                    continue
                raise MissingReference(f"{kind[:-1]} {ref['name']} not found")
            for key, value in (found.get("data") or {}).items():
                environment[prefix + key] = base64.b64decode(value).decode() if kind == "secrets" else value

    for variable in container.get("env", []) or []:
        name = variable["name"]
        if "valueFrom" not in variable:
            environment[name] = expand(variable.get("value", ""), environment)
            continue
        source = variable["valueFrom"]
        if "fieldRef" in source:
            environment[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            environment[name] = resource_value(container, source["resourceFieldRef"])
        else:
            kind, ref = (
                ("configmaps", source["configMapKeyRef"])
                if "configMapKeyRef" in source
                else ("secrets", source["secretKeyRef"])
            )
            value = _key(lookup(kind, ref["name"]), ref["key"], kind == "secrets")
            if value is None:
                if ref.get("optional"):
                    continue
                raise MissingReference(f"{kind[:-1]} {ref['name']} key {ref['key']} not found")
            environment[name] = value
    return environment


def _key(found: Object | None, key: str, encoded: bool) -> str | None:
    if found is None or key not in (found.get("data") or {}):
        return None
    value = found["data"][key]
    return base64.b64decode(value).decode() if encoded else value
