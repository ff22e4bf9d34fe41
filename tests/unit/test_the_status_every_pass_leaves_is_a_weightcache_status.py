"""The status a pass leaves on the cache parses as the CRD's typed ``WeightCacheStatus`` (which
forbids unknown fields): what the operator writes and the schema it publishes agree, pass by pass,
through creation, serving, a failover and a spec change."""

from __future__ import annotations

from pass_world import World, serving
from weightcache_operator.spec.status import WeightCacheStatus


def _status_parses(world: World) -> WeightCacheStatus:
    return WeightCacheStatus.model_validate(world.body["status"])


def test_the_status_of_each_pass_from_creation_to_a_failover_and_a_spec_change_parses_as_weightcachestatus() -> None:
    world = World()
    world.run(apply=True)
    assert _status_parses(world).phase == "Pending"

    serving(world)
    assert _status_parses(world).phase == "Ready"

    failed = world.api.stored("Pod", "tiny-0-00001")
    failed["status"]["phase"] = "Failed"
    world.api.put("Pod", failed)
    world.run()
    failover = _status_parses(world).last_failover
    assert failover is not None and failover.from_ == "tiny-0-00001"

    world.change_spec(**{"engine.args": ["--max-model-len", "512"]})
    world.run(apply=True)
    assert _status_parses(world).observed_generation == world.body["metadata"]["generation"]
