"""The operator's settings: every ``$WEIGHTCACHE_OPERATOR_*`` variable, read and checked in one
place, once, before kopf starts (``python -m weightcache_operator`` exits with the message of the
first bad one). The chart's deployment sets them from its values (docs/operator.md lists them).

Scope: a namespaced install (the chart's ``watchNamespaces``) grants the operator Roles only in
the listed namespaces, so the operator must not try to watch the whole cluster: that would fail
with 403 on every list and watch. kopf takes either ``clusterwide=True`` or ``namespaces=[...]``.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.readonly_http import parse_addr

NAMESPACES = "WEIGHTCACHE_OPERATOR_NAMESPACES"
VERBOSE = "WEIGHTCACHE_OPERATOR_VERBOSE"
HEALTH = "WEIGHTCACHE_OPERATOR_HEALTH"
METRICS = "WEIGHTCACHE_OPERATOR_METRICS"
RESYNC_SECONDS = "WEIGHTCACHE_OPERATOR_RESYNC_SECONDS"
PASS_THREADS = "WEIGHTCACHE_OPERATOR_PASS_THREADS"
PEERING = "WEIGHTCACHE_OPERATOR_PEERING"
PEERING_LIFETIME = "WEIGHTCACHE_OPERATOR_PEERING_LIFETIME"
PRIORITY = "WEIGHTCACHE_OPERATOR_PRIORITY"

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()
    """Exact namespace names to serve; empty: the whole cluster."""
    verbose: bool = False
    health: str = "0.0.0.0:8080"
    """Where kopf's liveness endpoint (``/healthz``) listens."""
    metrics: str = "0.0.0.0:9090"
    """Where ``/metrics`` listens (metrics.py)."""
    resync_seconds: float = 30.0
    """How often every cache gets a full pass even when nothing announced a change."""
    pass_threads: int = 6
    """At most this many passes (and other handlers) run at once, over all caches: the operator's
    own setting, not its host's CPU count (handlers.configure says why)."""
    peering: str = "weightcache-operator"
    peering_lifetime: int = 15
    """Seconds a replica's peering keep-alive (and hand-over lease) holds: a killed acting replica
    is replaced within about this long (docs/operations.md)."""
    priority: str = ""
    """This replica's peering priority as given: an integer, or any text (the chart passes the
    pod's uid) that handlers.py hashes into one."""

    @classmethod
    def from_environment(cls, environment: Mapping[str, str]) -> OperatorSettings:
        """The settings the environment gives; a ``ValueError`` naming the variable and its fix
        for the first that is not understood. Unset (or blank) variables take the defaults."""
        default = cls()
        return cls(
            namespaces=tuple(watched_namespaces(environment)),
            verbose=environment.get(VERBOSE, "").strip() == "1",
            health=_addr(environment, HEALTH, default.health),
            metrics=_addr(environment, METRICS, default.metrics),
            resync_seconds=_seconds(environment, RESYNC_SECONDS, default.resync_seconds),
            pass_threads=pass_threads(environment),
            peering=_name(environment, PEERING, default.peering),
            peering_lifetime=int(_seconds(environment, PEERING_LIFETIME, default.peering_lifetime, whole=True)),
            priority=environment.get(PRIORITY, "").strip(),
        )


@functools.cache
def current() -> OperatorSettings:
    """This process's settings, from its environment: the only place the operator reads it."""
    return OperatorSettings.from_environment(os.environ)


def watched_namespaces(environment: Mapping[str, str]) -> list[str]:
    """The namespaces listed in ``$WEIGHTCACHE_OPERATOR_NAMESPACES`` (comma-separated), or ``[]``
    for cluster-wide. Names are exact: kopf would read ``*`` or ``!`` as patterns that need
    cluster-wide namespace access, which a namespaced install does not grant."""
    text = environment.get(NAMESPACES, "")
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if len(name) > 63 or not _LABEL.match(name):
            raise ValueError(
                f"{NAMESPACES}={text!r}: {name!r} is not a namespace name (lowercase letters, digits and '-',"
                " at most 63 characters); list exact names separated by commas, or unset it to serve every namespace"
            )
    return sorted(set(names))


def pass_threads(environment: Mapping[str, str]) -> int:
    """``$WEIGHTCACHE_OPERATOR_PASS_THREADS``, 6 when unset."""
    text = environment.get(PASS_THREADS, "").strip() or "6"
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise ValueError(
            f"{PASS_THREADS}={text!r}: give a whole number of threads from 1 to 256"
            " (the chart's passThreads), or unset it for 6"
        )
    return int(text)


def _seconds(environment: Mapping[str, str], variable: str, default: float, whole: bool = False) -> float:
    text = environment.get(variable, "").strip()
    if not text:
        return default
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = -1
    # NaN and infinity parse as floats but are no interval a timer or a lease can use.
    if not 0 < value < 86_400:
        kind = "a whole number of seconds" if whole else "a number of seconds"
        raise ValueError(f"{variable}={text!r}: give {kind} above 0 and below 86400, or unset it for {default:g}")
    return value


def _addr(environment: Mapping[str, str], variable: str, default: str) -> str:
    text = environment.get(variable, "").strip() or default
    try:
        parse_addr(text, f"${variable}")
    except WeightCacheError as error:
        raise ValueError(f"{error}; or unset it for {default}") from None
    return text


def _name(environment: Mapping[str, str], variable: str, default: str) -> str:
    """A Kubernetes object name (the peering object's): a DNS-1123 subdomain."""
    text = environment.get(variable, "").strip() or default
    if len(text) > 253 or not all(_LABEL.match(part) for part in text.split(".")):
        raise ValueError(
            f"{variable}={text!r} is not an object name (lowercase letters, digits, '-' and '.');"
            f" give the name of the peering object (the chart's release name), or unset it for {default}"
        )
    return text
