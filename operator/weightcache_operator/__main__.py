"""``python -m weightcache_operator``: run the operator (kopf, JSON logs).

Its settings are ``$WEIGHTCACHE_OPERATOR_*`` (settings.py: scope, liveness and metrics addresses,
resync, pass threads, peering). Credentials: in-cluster ServiceAccount, else $KUBECONFIG."""

from __future__ import annotations

import sys

import kopf

from weightcache_operator.settings import current


def main() -> None:
    # Checked before the handlers are imported (they read the settings at import): a bad value is
    # one line naming the variable, not a traceback, and nothing connects to the cluster first.
    try:
        settings = current()
    except ValueError as error:
        sys.exit(f"weightcache-operator: {error}")
    from weightcache_operator.run import handlers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=settings.verbose, log_format=kopf.LogFormat.JSON)
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        peering_name=settings.peering,
        liveness_endpoint=f"http://{settings.health}/healthz",
    )


if __name__ == "__main__":
    main()
