"""A container's preStop hook, run as the kubelet runs it before the stop signal: within the
pod's grace period, whose remainder (at least ``MIN_GRACE_AFTER_HOOK_S``) is left for SIGTERM.

Handlers: ``sleep`` (the API's own action), ``exec`` and ``httpGet`` (reached like probes). A
failed hook is logged and the container is stopped anyway, as the kubelet does."""

from __future__ import annotations

import logging
import time

from ..rest import Object
from .probes import ProbeTarget, probe_once

log = logging.getLogger(__name__)

MIN_GRACE_AFTER_HOOK_S = 2.0
"""The kubelet's minimumGracePeriodInSeconds: what SIGTERM still gets after a hook that took
the whole grace period."""


def pre_stop(container: Object) -> Object | None:
    return (container.get("lifecycle") or {}).get("preStop")


def run_pre_stop(name: str, handler: Object, target: ProbeTarget, grace: float) -> float:
    """Runs ``handler`` for at most ``grace`` seconds; returns the grace left for SIGTERM."""
    began = time.monotonic()
    if "sleep" in handler:
        time.sleep(min(float(handler["sleep"]["seconds"]), grace))
    else:
        ok, message = probe_once({**handler, "timeoutSeconds": max(grace, 0.001)}, target)
        if not ok:
            log.info("container %s: preStop hook failed (%s); stopping it anyway", name, message)
    return max(grace - (time.monotonic() - began), MIN_GRACE_AFTER_HOOK_S)
