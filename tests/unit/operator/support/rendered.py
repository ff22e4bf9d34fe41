"""Reading rendered objects back: a container of a pod or of a DaemonSet's pod template by name, a
container's literal environment, and the two commands a cache's daemon and engine run."""

from __future__ import annotations

from typing import Any

from weightcache_operator.render import daemon_daemonset, engine_pod
from weightcache_operator.spec import WeightCache


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "DaemonSet" else obj["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in c["env"]}


def daemon_command(cache: WeightCache) -> list[str]:
    """The command of the daemon container of ``cache``'s DaemonSet."""
    containers = daemon_daemonset(cache)["spec"]["template"]["spec"]["containers"]
    return list(next(c for c in containers if c["name"] == "daemon")["command"])


def main_container(cache: WeightCache) -> dict[str, Any]:
    """The engine container of ``cache``'s active engine pod of replica 0, on node-a."""
    return dict(engine_pod(cache, 0, "active", ["node-a"])["spec"]["containers"][0])
