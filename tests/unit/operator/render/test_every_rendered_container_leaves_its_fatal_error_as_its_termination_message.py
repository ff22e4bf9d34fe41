"""Every container the operator renders (daemon, keeper, GPU holder, engine) leaves its fatal error where
Kubernetes reads the termination message, and the process is told that path."""

from __future__ import annotations

from builders import make
from rendered import container, env_of
from weightcache_operator.render import (
    daemon_daemonset,
    engine_pod,
)
from weightcache_operator.render.gpu_holder import gpu_holder_daemonset


def test_every_rendered_container_leaves_its_fatal_error_as_its_termination_message() -> None:
    gpu = make(**{"daemon.backend": "cuda-vmm"})
    holder = gpu_holder_daemonset(gpu, [])
    assert holder is not None
    rendered = [
        container(daemon_daemonset(gpu), "daemon"),
        container(daemon_daemonset(gpu), "keeper"),
        container(holder, "gpu-holder"),
        engine_pod(gpu, 0, "active")["spec"]["containers"][0],
    ]
    for c in rendered:
        assert (c["terminationMessagePath"], c["terminationMessagePolicy"]) == (
            "/dev/termination-log",
            "FallbackToLogsOnError",
        )
        assert env_of(c)["WEIGHTCACHE_TERMINATION_LOG"] == "/dev/termination-log", c["name"]
    # A path the user's engine template chooses is kept, and the CLI is told that one.
    own = make(**{"engine.template.spec.containers": [{"name": "e", "terminationMessagePath": "/tmp/why"}]})
    engine = engine_pod(own, 0, "active")["spec"]["containers"][0]
    assert engine["terminationMessagePath"] == env_of(engine)["WEIGHTCACHE_TERMINATION_LOG"] == "/tmp/why"
