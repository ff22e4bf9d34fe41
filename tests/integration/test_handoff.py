"""A publisher hands its sealed arena to the serving daemon across ``exec``: the same pid serves it
as an ordinary rank (ready file, lock, mapping by fingerprint, keeper deposit) without torch resident."""

import subprocess
import sys
import time
from pathlib import Path

import torch
from handoff_publisher import fingerprint, leak_probe, model
from proc_files import fd_targets
from weightcache.client.weights import DaemonConnection, held_bytes, map_fingerprint
from weightcache.daemon.keeper import KeeperClient, keeper_socket
from weightcache.wire.rankfiles import RankFiles

HERE = Path(__file__).resolve().parent


def wait_for(condition, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def test_the_handed_over_arena_is_served_by_the_same_pid_without_torch_and_deposited(
    llama: Path, socket_dir: str, start_keeper, tmp_path: Path
) -> None:
    start_keeper()
    log = tmp_path / "publisher.log"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "handoff_publisher.py"), str(llama), socket_dir, "handed"],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        files = RankFiles(socket_dir, "handed", 0)
        ready = wait_for(lambda: files.read_ready() or (proc.poll() is not None and log.read_text()), what="ready")
        assert not isinstance(ready, str), ready
        assert ready.pid == proc.pid and files.lock_is_held()
        assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()  # the exec dropped torch
        fds = fd_targets(proc.pid)  # the daemon's connections may close while they are listed
        assert fds, log.read_text()  # empty only when the daemon is gone
        assert leak_probe(socket_dir) not in fds  # only the arena and the lock cross the exec

        want = fingerprint(str(llama))
        weights = map_fingerprint(want, 0, socket_dir, "handed")
        source = dict(model().named_parameters())
        assert set(weights.tensors) == set(source)
        for name, tensor in source.items():
            assert torch.equal(weights.tensors[name], tensor.detach()), name

        with DaemonConnection(files.socket) as conn:
            wait_for(lambda: conn.status().deposited, what="the keeper deposit")
            status = conn.status()
        assert (status.disk_bytes_read, status.adopted) == (123, False)
        # Watched by stat alone: another loader filled it, so there is no content digest to verify with.
        assert status.checkpoint is not None and status.checkpoint.state == "unchanged"
        # What a vLLM GPU worker takes out of its budget: the allocation for its own fingerprint only.
        assert held_bytes(want, 0, socket_dir, "handed") == status.arena_bytes > 0
        assert held_bytes(want.model_copy(update={"dtype": "bfloat16"}), 0, socket_dir, "handed") == 0
        with KeeperClient(keeper_socket(socket_dir)) as keeper:
            [held] = keeper.holdings()
        assert (held.name, held.fingerprint_digest) == ("handed", want.digest)
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log.read_text()
    assert files.read_ready() is None and not files.lock_is_held()
