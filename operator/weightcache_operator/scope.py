"""Which namespaces the operator serves: every one, or an exact list from the environment.

A namespaced install (the Helm chart's ``watchNamespaces``) grants the operator Roles only in
the listed namespaces, so the operator must not try to watch the whole cluster: that would fail
with 403 on every list and watch. kopf takes either ``clusterwide=True`` or ``namespaces=[...]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

VARIABLE = "WEIGHTCACHE_OPERATOR_NAMESPACES"

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def watched_namespaces(environment: Mapping[str, str]) -> list[str]:
    """The namespaces listed in ``$WEIGHTCACHE_OPERATOR_NAMESPACES`` (comma-separated), or ``[]``
    for cluster-wide. Names are exact: kopf would read ``*`` or ``!`` as patterns that need
    cluster-wide namespace access, which a namespaced install does not grant."""
    text = environment.get(VARIABLE, "")
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if len(name) > 63 or not _LABEL.match(name):
            raise ValueError(
                f"{VARIABLE}={text!r}: {name!r} is not a namespace name (lowercase letters, digits and '-',"
                " at most 63 characters); list exact names separated by commas, or unset it to serve every namespace"
            )
    return sorted(set(names))
