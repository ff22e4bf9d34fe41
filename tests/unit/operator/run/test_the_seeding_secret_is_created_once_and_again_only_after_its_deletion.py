"""The cache's seeding credential (render/seeding.py): a Secret of random bytes the first full pass
creates, owned by the cache; later passes keep it as it is (the operator may create Secrets, never
read or rewrite them); deleting it rotates it, the next full pass creating new bytes. The bytes
appear nowhere else: not in the status, not in an Event. With seeding off there is no Secret and no
peers file."""

from __future__ import annotations

import base64

from builders import BASE, changed
from pass_world import World
from weightcache_contract.seeding import CREDENTIAL_KEY, CREDENTIAL_MIN_BYTES


def _credential(world: World) -> str:
    return str(world.api.stored("Secret", "tiny-seeding")["data"][CREDENTIAL_KEY])


def test_the_first_pass_creates_an_owned_secret_of_random_bytes() -> None:
    world = World()

    world.run(apply=True)

    secret = world.api.stored("Secret", "tiny-seeding")
    assert secret["type"] == "Opaque"
    assert len(base64.b64decode(secret["data"][CREDENTIAL_KEY])) == CREDENTIAL_MIN_BYTES
    assert [(o["kind"], o["uid"]) for o in secret["metadata"]["ownerReferences"]] == [("WeightCache", "uid-1")]


def test_later_passes_keep_the_secret_and_a_deleted_one_is_created_anew() -> None:
    world = World()
    world.run(apply=True)
    first = _credential(world)
    world.api.forget_writes()

    world.run(apply=True)
    world.run()

    assert _credential(world) == first
    assert ("create", "Secret", "tiny-seeding") not in world.api.steps()

    world.api.remove("Secret", "tiny-seeding")  # a user rotates it
    world.run(apply=True)

    assert ("create", "Secret", "tiny-seeding") in world.api.steps()
    assert _credential(world) != first


def test_the_credential_is_in_no_status_and_no_event() -> None:
    world = World()
    world.run(apply=True)
    world.reconciler.events.flush(5)
    credential = _credential(world)

    assert credential not in str(world.body.get("status"))
    assert all(credential not in str(world.api.stored("Event", n)) for n in world.api.names("Event"))


def test_with_seeding_off_no_secret_and_no_peers_file_are_written() -> None:
    world = World(changed(BASE, **{"daemon.seeding": {"mode": "Off"}}))

    world.run(apply=True)

    assert not world.api.names("Secret") and not world.api.names("ConfigMap")
