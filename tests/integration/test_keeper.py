"""The keeper makes a cache outlive its daemon: re-adoption without disk reads, re-deposit, release."""

import signal
import time

import torch
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import DaemonConnection, expect, load_from_disk, load_weights
from weightcache.daemon.keeper import KeeperClient, keeper_socket


def wait_for(condition, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def status(daemon):
    with DaemonConnection(daemon.files[0].socket) as conn:
        return conn.status()


def holdings(socket_dir: str):
    with KeeperClient(keeper_socket(socket_dir)) as keeper:
        return keeper.holdings()


def test_restarted_daemon_readopts_from_the_keeper_without_reading_disk(llama, start_keeper, start_daemon) -> None:
    ckpt = llama
    original = load_from_disk(expect(str(ckpt), Layout(), dtype="bfloat16")).tensors
    start_keeper()
    first = start_daemon(ckpt, dtype="bfloat16")
    wait_for(lambda: status(first).deposited, what="deposit")
    assert status(first).disk_bytes_read > 0 and not status(first).adopted
    [held] = holdings(first.socket_dir)
    assert (held.name, held.rank, held.fingerprint_digest) == (
        first.name,
        0,
        first.files[0].read_ready().fingerprint_digest,
    )

    engine = load_weights(
        str(ckpt), Layout(), socket_dir=first.socket_dir, name=first.name, fallback="error", dtype="bfloat16"
    )
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    second = start_daemon(ckpt, dtype="bfloat16")
    st = status(second)
    assert st.adopted and st.disk_bytes_read == 0
    assert second.files[0].read_ready().adopted
    fresh = load_weights(
        str(ckpt), Layout(), socket_dir=second.socket_dir, name=second.name, fallback="error", dtype="bfloat16"
    )
    for name, tensor in original.items():
        assert torch.equal(fresh.tensors[name], tensor), name
        assert torch.equal(engine.tensors[name], tensor), name  # the old engine never noticed


def test_readoption_never_imports_torch_or_numpy(llama, start_keeper, start_daemon, lean_env) -> None:
    """The sub-second restart rests on this: a daemon that re-adopts serves without importing
    torch or numpy. Its second start runs where both imports raise, and must still become ready
    and serve; the keeper runs there from the start (it never needs them either)."""
    start_keeper(env=lean_env)
    first = start_daemon(llama, dtype="bfloat16")
    wait_for(lambda: status(first).deposited, what="deposit")
    reference = load_weights(
        str(llama), Layout(), socket_dir=first.socket_dir, name=first.name, fallback="error", dtype="bfloat16"
    ).tensors
    first.stop(signal.SIGKILL)

    env = lean_env
    second = start_daemon(llama, dtype="bfloat16", env=env)
    st = status(second)
    assert st.adopted and st.disk_bytes_read == 0, second.output()
    fresh = load_weights(
        str(llama), Layout(), socket_dir=second.socket_dir, name=second.name, fallback="error", dtype="bfloat16"
    ).tensors
    assert fresh.keys() == reference.keys()
    assert all(torch.equal(fresh[n], reference[n]) for n in reference)

    # The same poisoned start without a keeper holding the arena must load, so it must fail loudly.
    second.stop(signal.SIGTERM)
    with KeeperClient(keeper_socket(second.socket_dir)) as keeper:
        keeper.release(second.name)
    third = start_daemon(llama, dtype="bfloat16", env=env, wait=False)
    assert third.proc.wait(timeout=60) != 0
    assert "imported on a lean path" in third.output()


def test_a_restarted_keeper_gets_the_arena_again(llama, start_keeper, start_daemon) -> None:
    keeper = start_keeper()
    daemon = start_daemon(llama, dtype="bfloat16")
    wait_for(lambda: status(daemon).deposited, what="deposit")
    keeper.kill()
    keeper.wait()
    wait_for(lambda: not status(daemon).deposited, what="the daemon noticing the keeper's death")
    start_keeper()
    wait_for(lambda: status(daemon).deposited, what="re-deposit")
    assert [h.name for h in holdings(daemon.socket_dir)] == [daemon.name]


def test_a_new_fingerprint_releases_the_old_arena(llama, start_keeper, start_daemon) -> None:
    start_keeper()
    old = start_daemon(llama, dtype="bfloat16", revision="v1")
    wait_for(lambda: status(old).deposited, what="deposit")
    old_digest = old.files[0].read_ready().fingerprint_digest
    assert old.stop(signal.SIGTERM) == 0
    assert [h.fingerprint_digest for h in holdings(old.socket_dir)] == [old_digest]  # kept across a clean stop

    new = start_daemon(llama, dtype="bfloat16", revision="v2")
    assert not status(new).adopted and status(new).disk_bytes_read > 0
    wait_for(lambda: status(new).deposited, what="deposit")
    assert [h.fingerprint_digest for h in holdings(new.socket_dir)] == [new.files[0].read_ready().fingerprint_digest]
    assert "keeper holds another fingerprint; releasing it" in new.output()


def test_release_when_told(llama, start_keeper, start_daemon) -> None:
    start_keeper()
    daemon = start_daemon(llama, dtype="bfloat16")
    wait_for(lambda: status(daemon).deposited, what="deposit")
    daemon.stop(signal.SIGTERM)
    with KeeperClient(keeper_socket(daemon.socket_dir)) as keeper:
        assert keeper.release("someone-else") == 0
        assert keeper.release(daemon.name) == 1
        assert keeper.holdings() == []


def test_keeper_refuses_a_deposit_without_an_fd(llama, start_keeper, start_daemon) -> None:
    from weightcache.checkpoints.manifest import Manifest
    from weightcache.wire.protocol import Deposit, KeeperAck
    from weightcache_contract.errors import ProtocolError

    start_keeper()
    daemon = start_daemon(llama, dtype="bfloat16", keeper="off")
    with DaemonConnection(keeper_socket(daemon.socket_dir)) as conn:
        try:
            conn.request(
                Deposit(
                    name="x",
                    rank=0,
                    fingerprint_digest="0",
                    backend="cpu-shm",
                    mapping_bytes=256,
                    manifest=Manifest.build("0", 256, []),
                ),
                KeeperAck,
            )
        except ProtocolError as exc:
            assert "exactly one fd" in str(exc)
        else:
            raise AssertionError("deposit without an fd was accepted")
    assert holdings(daemon.socket_dir) == []
    assert not status(daemon).deposited  # --keeper off: never deposited
