"""Values of a pod's fields as the downward API (env fieldRef, downwardAPI volumes) exposes them."""

from __future__ import annotations

import re
from typing import Any

from ..rest import Object

_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: Object, field_path: str) -> str:
    metadata, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs", [])),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs", [])),
    }
    if field_path in simple:
        return simple[field_path]
    if field_path in ("metadata.labels", "metadata.annotations"):
        values = metadata.get(field_path.split(".")[1], {}) or {}
        return "".join(f'{key}="{value}"\n' for key, value in sorted(values.items()))
    match = _SUBSCRIPT.match(field_path)
    if match:
        return (metadata.get(match.group(1)) or {}).get(match.group(2), "")
    raise ValueError(f"unsupported fieldRef {field_path!r}")


def resource_value(container: Object, resource_ref: Object) -> str:
    """resourceFieldRef: limits fall back to requests, then to the node's (unlimited) capacity."""
    resources = container.get("resources", {})
    resource = resource_ref["resource"]
    kind, _, name = resource.partition(".")
    value: Any = resources.get(kind, {}).get(name)
    if value is None and kind == "limits":
        value = resources.get("requests", {}).get(name)
    if value is None:
        return "0"
    divisor = resource_ref.get("divisor", "1")
    return _divide(str(value), str(divisor))


def _divide(quantity: str, divisor: str) -> str:
    return str(max(1, int(-(-_parse_quantity(quantity) // _parse_quantity(divisor))))) if quantity != "0" else "0"


def _parse_quantity(text: str) -> float:
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * suffixes[suffix]
    return float(text)
