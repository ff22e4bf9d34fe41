"""A vLLM-profile daemon's start and stop leave nothing in /dev/shm, nor in its socket dir but the
ranks' lock files.

While the daemon loads, vLLM's CPU communicator creates one shared-memory segment per rank and
tensor- or pipeline-parallel group (``<VLLM_DIST_IDENT>-tp:0-[0-1]-cpushm_<rank>``, 16 MiB each at
TP=2). The daemon execs into its vLLM-free serving image, which never frees them; each start must
remove its own. ``VLLM_DIST_IDENT`` is set per test so that only this daemon's segments are looked
at: other vLLM processes on the machine create theirs concurrently."""

import uuid
from pathlib import Path

import pytest
from vllm_harness import qwen3_checkpoint, start_daemon, vllm_args

SHM = Path("/dev/shm")


@pytest.mark.parametrize("tp", [1, 2])
def test_a_started_and_stopped_vllm_daemon_leaves_no_shared_memory_or_socket_files(
    tmp_path: Path, socket_dir: str, tp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ident = f"wc-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("VLLM_DIST_IDENT", ident)  # the daemon's processes inherit it
    model = qwen3_checkpoint(tmp_path / "qwen3")
    sockets = Path(socket_dir)
    daemon = start_daemon(model, sockets, f"tp{tp}", vllm_args(tp=tp), logs=tmp_path, tp=tp)
    try:
        daemon.wait_ready()
        assert sorted(p.name for p in SHM.glob(f"{ident}*")) == [], (
            "the serving daemon no longer runs vLLM: nothing would ever remove these"
        )
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()[-6000:]
    assert sorted(p.name for p in SHM.glob(f"{ident}*")) == []
    # Only the ranks' lock files stay, by design: unlinking an flock'ed file races with the next
    # daemon opening it (docs/architecture.md, "Files on a node").
    locks = [f"tp{tp}", *(f"tp{tp}/rank-{r}.lock" for r in range(tp))]
    assert sorted(str(p.relative_to(sockets)) for p in sockets.rglob("*")) == locks
