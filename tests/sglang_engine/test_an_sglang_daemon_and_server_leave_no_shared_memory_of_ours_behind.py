"""What an ``sglang``-profile daemon and SGLang servers leave in /dev/shm: names that their own
processes held there (``ShmHeld``: other processes on the machine make names there concurrently)
and that still exist after the stop.

The daemon, at TP=2 (where SGLang's process groups make names): nothing, once it serves, nor after
its stop. SGLang's tensor-parallel group makes a message-queue ring buffer (``sgl_shm_mq_<pid>_*``)
that only its destructor unlinks, and the daemon's exec into its SGLang-free serving image runs none
(multiprocessing's resource tracker then removed it, warning of a leaked shared_memory object; a
kill of the process group would leave it): the daemon removes it once every rank has joined. Its
weights are memfds and never have a name.

The servers, stopped by SIGTERM to their own process as a container stop sends it: SGLang's
teardown kills its scheduler with SIGKILL (``kill_process_tree``), which leaves SGLang's load
snapshot file (``sglang_loads_*.shm``) and, at TP>1, its scheduler group's ring buffer
(``sgl_shm_mq_*``, 24 MiB) behind on every run, from disk as from the cache. Those are SGLang's: the
server from the cache leaves nothing that the same server from disk does not. The harness removes
what a server left once it has looked."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sglang_harness import Server, ShmHeld, qwen3_checkpoint, sglang_args, start_daemon

FAMILIES = ("sglang_loads_", "sem.mp-", "sgl_shm_")
"""SGLang's names whose rest is random or a process id; any other name is its own family."""


def kinds(names: list[str]) -> Counter[str]:
    return Counter(next((f for f in FAMILIES if name.startswith(f)), name) for name in names)


def served_and_stopped(model: Path, args: list[str], log: Path, calls: Path, cache: dict[str, str] | None) -> list[str]:
    """The names a server held in /dev/shm that were left after its stop (the harness removes them)."""
    server = Server(model, args, log=log, calls=calls, cache=cache, tp=2)
    try:
        server.wait_healthy()
        assert server.generate()
    finally:
        server.stop()
    return server.left


def test_the_daemon_leaves_nothing_and_a_server_from_the_cache_leaves_no_more_than_from_disk(
    tmp_path: Path, calls: Path
) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), sglang_args(tp=2)
    sockets = tmp_path / "sockets"
    with ShmHeld() as held:
        daemon = start_daemon(model, sockets, "shm", args, logs=tmp_path, calls=calls, tp=2)
        held.watch(daemon.proc)
        try:
            daemon.wait_ready()
            assert held.left() == []  # the serving daemon no longer runs SGLang: nothing would remove them
            cache = {"name": "shm", "socket_dir": str(sockets), "fallback": "error"}
            from_cache = served_and_stopped(model, args, tmp_path / "cache.log", calls, cache)
            assert "Mapping and binding weights took" in (tmp_path / "cache.log").read_text()
        finally:
            assert daemon.stop() == 0, daemon.log.read_text()[-4000:]
    assert held.left() == [], held.names
    assert "leaked shared_memory" not in daemon.log.read_text(), daemon.log.read_text()[-4000:]
    assert any(name.startswith("sgl_shm_mq_") for name in held.names)  # it made one, and removed it
    from_disk = served_and_stopped(model, args, tmp_path / "disk.log", calls, None)
    # SGLang's own, which also shows that the watch sees what a server leaves.
    assert {"sglang_loads_", "sgl_shm_"} <= set(kinds(from_disk)), from_disk
    assert not kinds(from_cache) - kinds(from_disk), (from_cache, from_disk)
