"""responsiveness.probe_url: where the operator's own probe asks, read from rendered engine pods."""

from __future__ import annotations

import copy

from builders import make, scheduled
from weightcache_operator.observe.responsiveness import probe_url
from weightcache_operator.render import engine_pod


def running(pod: dict, ip: str = "10.1.2.3") -> dict:
    """The rendered ``pod`` as the API returns it once scheduled and running at ``ip``."""
    return scheduled(pod, node="node-1", ip=ip)


def test_the_rendered_default_probe_is_asked_at_the_pod_ip() -> None:
    pod = engine_pod(make(**{"engine.port": 8123}), 0, "active")
    assert probe_url(running(pod)) == "http://10.1.2.3:8123/ready"
    assert probe_url(running(pod, "fd00::7")) == "http://[fd00::7]:8123/ready"
    assert probe_url(pod) is None  # not scheduled or not started yet: no IP


def test_the_templates_own_probe_wins_named_ports_resolve_and_non_http_probes_are_not_asked() -> None:
    template = {
        "spec": {
            "containers": [
                {
                    "name": "sglang",
                    "image": "s:1",
                    "ports": [{"name": "api", "containerPort": 30000}],
                    "readinessProbe": {"httpGet": {"path": "health_generate", "port": "api"}, "periodSeconds": 5},
                }
            ]
        }
    }
    pod = engine_pod(make(**{"engine.template": template}), 0, "active")
    assert probe_url(running(pod)) == "http://10.1.2.3:30000/health_generate"
    exec_probe = copy.deepcopy(template)
    exec_probe["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["true"]}}
    assert probe_url(running(engine_pod(make(**{"engine.template": exec_probe}), 0, "active"))) is None
    https = copy.deepcopy(template)
    https["spec"]["containers"][0]["readinessProbe"]["httpGet"]["scheme"] = "HTTPS"
    assert probe_url(running(engine_pod(make(**{"engine.template": https}), 0, "active"))) is None
