"""The per-node processes that hold the weights: ``rank`` (one daemon process per rank: validate,
fingerprint, load, serve; and the launcher of a pod's local ranks), ``server`` (the framed Unix
socket server), ``serving`` (what a daemon answers), ``keeper`` (holds arena fds so a cache
outlives its daemon), ``probe`` (readiness of a node's ranks) and ``status_endpoint`` (the pod's
``/status``, ``/metrics`` and ``/ready``)."""
