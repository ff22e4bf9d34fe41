"""Reading rendered objects back: a container of a pod or of a DaemonSet's pod template by name, and
a container's literal environment."""

from __future__ import annotations

from typing import Any


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "DaemonSet" else obj["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c["env"]}
