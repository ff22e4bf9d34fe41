"""Every pass of a daemon generation change, blue/green and node by node, through the real
``Reconciler`` (pass_world.py), with the new daemons loading and the new engines starting for a
pass before they turn Ready: the old generation serves throughout, so the phase stays Ready in
every status written; ``GenerationChange`` (True, reason the strategy) and ``status.generationChange``
say what changes, and both clear once the change completed."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from builders import BASE, changed
from pass_world import World, serving
from weightcache_operator.objects import stamp


def generation_change(status: dict[str, Any]) -> tuple[str, str] | None:
    found = next((c for c in status.get("conditions") or [] if c["type"] == "GenerationChange"), None)
    return (found["status"], found["reason"]) if found is not None else None


def walk_through_a_change(world: World, passes: int = 12) -> list[dict[str, Any]]:
    """The statuses written by every pass from the spec change on: in each step the cluster's
    controllers start what the last pass asked for (new daemons loading, new engines starting),
    a pass sees that, then it all turns Ready and another pass sees that."""
    world.change_spec(**{"daemon.image": "wc/daemon:2"})
    world.run(apply=True)
    written = [copy.deepcopy(world.body["status"])]
    for _ in range(passes):
        world.terminated()
        world.daemons_run(ready=False)
        _created_now(world)
        world.placed(ready=False)
        world.later(5)
        world.run()
        written.append(copy.deepcopy(world.body["status"]))
        world.loaded()
        world.later(5)
        world.run()
        written.append(copy.deepcopy(world.body["status"]))
    return written


@pytest.mark.parametrize(
    ("requested", "strategy"), [("NodeByNode", "NodeByNode"), ("Auto", "BlueGreen")], ids=["node-by-node", "blue-green"]
)
def test_the_phase_stays_ready_through_every_pass_of_a_generation_change_the_old_generation_serves(
    requested: str, strategy: str
) -> None:
    world = serving(World(changed(BASE, **{"daemon.generationChange": requested}), roomy=requested == "Auto"))
    before = copy.deepcopy(world.body["status"])
    assert before["phase"] == "Ready" and before.get("generationChange") is None
    written = walk_through_a_change(world)

    phases = [(s["phase"], _available(s)) for s in written]
    assert all(available for _, available in phases), f"the old generation serves throughout: {phases}"
    assert [phase for phase, _ in phases] == ["Ready"] * len(phases), phases
    changes = [(s.get("generationChange"), generation_change(s)) for s in written]
    assert (strategy, ("True", strategy)) in changes, changes
    # Under way from the first pass (which records the strategy) until the rollout completed,
    # then cleared: no flip back to True once cleared.
    assert changes[0] == (strategy, ("True", strategy)), changes
    cleared = changes.index((None, ("False", "Converged")))
    assert set(changes[cleared:]) == {(None, ("False", "Converged"))}, changes
    assert set(changes[:cleared]) == {(strategy, ("True", strategy))}, changes
    done = written[-1]
    assert done["rollout"]["phase"] == "Complete" and done["daemonSpecHash"] != before["daemonSpecHash"]
    assert done["readyNodes"] == "2/2" and (done["activeEngines"], done["standbyEngines"]) == (1, 1)


def test_the_change_s_condition_says_the_generations_and_how_far_the_replicas_are() -> None:
    world = serving(World(changed(BASE, **{"daemon.generationChange": "Auto"}), roomy=True))
    old = world.body["status"]["daemonSpecHash"]
    written = walk_through_a_change(world, passes=2)
    new = written[-1]["daemonSpecHash"]
    message = next(c["message"] for c in written[1]["conditions"] if c["type"] == "GenerationChange")
    assert f"daemon generation {old[:10]} -> {new[:10]}: 0/1 replicas whole on the new one" in message, message
    assert "(BlueGreen: every daemon has room for a second copy" in message, message


def _available(status: dict[str, Any]) -> bool:
    return next(c["status"] for c in status["conditions"] if c["type"] == "Available") == "True"


def _created_now(world: World) -> None:
    """The API server stamps the engine pods the last pass created with the pass's clock (the
    double leaves it out), so none is past its ready deadline at its first look."""
    for name in world.engines():
        pod = world.api.stored("Pod", name)
        if "creationTimestamp" not in pod["metadata"]:
            pod["metadata"]["creationTimestamp"] = stamp(world.now)
            world.api.put("Pod", pod)
