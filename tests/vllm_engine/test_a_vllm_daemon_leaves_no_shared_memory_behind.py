"""A vLLM-profile daemon's start and stop leave nothing of vLLM's in /dev/shm or in vLLM's socket
directory, and nothing in its own socket dir but the ranks' lock files.

While the daemon loads, vLLM's process groups make names on the host: its CPU communicator one
shared-memory segment per rank and tensor- or pipeline-parallel group
(``<VLLM_DIST_IDENT>-tp:0-[0-1]-cpushm_<rank>``, 16 MiB each at TP=2), and each group's message
queue a ring buffer (``psm_*``, 24 MiB) and ZeroMQ sockets in ``VLLM_RPC_BASE_PATH``. The daemon
execs into its vLLM-free serving image, whose exec skips whatever would have removed them.
``VLLM_DIST_IDENT`` and ``VLLM_RPC_BASE_PATH`` are set per test so that only this daemon's names
are looked at: other vLLM processes on the machine make theirs concurrently. The ring buffer's
random name cannot be told apart that way; what the resource tracker finds left of it is in the
daemon's log."""

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_harness import qwen3_checkpoint, start_daemon, vllm_args

SHM = Path("/dev/shm")


@pytest.fixture
def rpc_dir() -> Iterator[Path]:
    """vLLM's ``VLLM_RPC_BASE_PATH``, short: vLLM binds ZeroMQ sockets of 36-character names in it,
    a Unix socket path has at most 107 bytes, and pytest's tmp_path grows with its run counter."""
    with tempfile.TemporaryDirectory(prefix="wc-rpc-") as d:
        yield Path(d)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_started_and_stopped_vllm_daemon_leaves_no_shared_memory_or_socket_files(
    tmp_path: Path, socket_dir: str, rpc_dir: Path, tp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ident = f"wc-test-{uuid.uuid4().hex[:12]}"
    rpc = rpc_dir
    monkeypatch.setenv("VLLM_DIST_IDENT", ident)  # the daemon's processes inherit both
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(rpc))
    model = qwen3_checkpoint(tmp_path / "qwen3")
    sockets = Path(socket_dir)
    daemon = start_daemon(model, sockets, f"tp{tp}", vllm_args(tp=tp), logs=tmp_path, tp=tp)
    try:
        daemon.wait_ready()
        # The serving daemon no longer runs vLLM: nothing would ever remove these.
        assert sorted(p.name for p in SHM.glob(f"{ident}*")) == []
        assert sorted(p.name for p in rpc.iterdir()) == []
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()[-6000:]
    assert sorted(p.name for p in SHM.glob(f"{ident}*")) == []
    assert sorted(p.name for p in rpc.iterdir()) == []
    assert "leaked shared_memory" not in daemon.log.read_text()
    # Only the ranks' lock files stay, by design: unlinking an flock'ed file races with the next
    # daemon opening it (docs/architecture.md, "Files on a node"); and the node's checkpoint digest
    # cache, which a later daemon reuses (checkpoints/content.py, DigestCache).
    locks = [
        "checkpoint-digests.json",
        "checkpoint-digests.json.lock",
        f"tp{tp}",
        *(f"tp{tp}/rank-{r}.lock" for r in range(tp)),
    ]
    assert sorted(str(p.relative_to(sockets)) for p in sockets.rglob("*")) == locks
