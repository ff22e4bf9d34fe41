"""A daemon generation is the hash of what decides the arena's bytes, and a blue/green generation is a
second DaemonSet with a socket directory of its own, which its engines mount."""

from __future__ import annotations

from builders import make
from weightcache_operator.render import (
    daemon_daemonset,
    daemon_spec_hash,
    engine_pod,
)
from weightcache_operator.render.daemon import blue_green_name


def test_spec_hash_follows_daemon_inputs_only() -> None:
    base = daemon_spec_hash(make())
    assert daemon_spec_hash(make()) == base
    assert daemon_spec_hash(make(**{"model.dtype": "bfloat16"})) != base
    assert daemon_spec_hash(make(**{"daemon.image": "wc/daemon:2"})) != base
    assert daemon_spec_hash(make(**{"engine.replicas": 3})) == base, "engine scaling must not restart daemons"
    assert daemon_spec_hash(make(**{"daemon.generationChange": "NodeByNode"})) == base, (
        "how to roll is not what is held"
    )


def test_blue_green_daemonset_is_a_second_daemonset_with_its_own_socket_directory() -> None:
    old, new = make(), make(**{"model.revision": "r2"})
    serving = daemon_daemonset(old)
    green = daemon_daemonset(
        new, name=blue_green_name(new), annotations={"weightcache.io/generation-change": "BlueGreen"}
    )
    assert green["metadata"]["name"] != serving["metadata"]["name"]
    assert green["metadata"]["name"].startswith("tiny-daemon-")
    assert green["metadata"]["annotations"] == {
        "weightcache.io/generation-change": "BlueGreen",
        "weightcache.io/daemon-spec-hash": daemon_spec_hash(new),
    }
    sockets = [
        {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}["weightcache-sockets"]["hostPath"]["path"]
        for ds in (serving, green)
    ]
    assert sockets[0] != sockets[1] and sockets[1].endswith(daemon_spec_hash(new))
    engine = engine_pod(new, 0, "active", ["node-1"])
    assert {v["name"]: v for v in engine["spec"]["volumes"]}["weightcache-sockets"]["hostPath"]["path"] == sockets[1]
