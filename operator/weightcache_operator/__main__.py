"""``python -m weightcache_operator``: run the operator (kopf, JSON logs).

Scope: every namespace, or the comma-separated $WEIGHTCACHE_OPERATOR_NAMESPACES. Credentials:
in-cluster ServiceAccount, else $KUBECONFIG. Liveness: ``/healthz`` on
$WEIGHTCACHE_OPERATOR_HEALTH (default 0.0.0.0:8080). Prometheus: ``/metrics`` on
$WEIGHTCACHE_OPERATOR_METRICS (default 0.0.0.0:9090; see metrics.py)."""

from __future__ import annotations

import os
import sys

import kopf

from . import handlers  # noqa: F401  (registers the handlers)
from .scope import watched_namespaces


def main() -> None:
    try:
        namespaces = watched_namespaces(os.environ)
    except ValueError as error:
        sys.exit(f"weightcache-operator: {error}")
    kopf.configure(verbose=os.environ.get("WEIGHTCACHE_OPERATOR_VERBOSE") == "1", log_format=kopf.LogFormat.JSON)
    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces,
        peering_name=handlers.PEERING_NAME,
        liveness_endpoint=f"http://{os.environ.get('WEIGHTCACHE_OPERATOR_HEALTH', '0.0.0.0:8080')}/healthz",
    )


if __name__ == "__main__":
    main()
