"""SIGKILL of the ``sglang``-profile daemon under a serving SGLang server: the server keeps serving
the same tokens from its mapping, the successor daemon re-adopts the arena from the keeper (no load,
no weight byte read), and a new SGLang server maps it with ``fallback: error``."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from sglang_harness import Server, generated, qwen3_checkpoint, sglang_args, start_daemon
from weightcache.client.weights import DaemonConnection


def test_the_server_keeps_serving_and_a_new_one_maps_the_readopted_arena(
    tmp_path: Path, calls: Path, socket_dir: str, start_keeper: Callable[..., object]
) -> None:
    start_keeper()
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), sglang_args()
    cache = {"name": "qwen3", "socket_dir": socket_dir, "fallback": "error"}
    first = start_daemon(model, Path(socket_dir), "qwen3", args, logs=tmp_path, calls=calls)
    first.wait_ready()
    with DaemonConnection(first.files().socket) as conn:
        assert conn.status().adopted is False
    server = Server(model, args, log=tmp_path / "first.log", calls=calls, cache=cache)
    second = None
    try:
        server.wait_healthy()
        before = server.generate()
        first.stop(signal.SIGKILL)
        assert server.generate() == before  # its mapping outlives the daemon
        second = start_daemon(model, Path(socket_dir), "qwen3", args, logs=tmp_path, calls=calls)
        second.wait_ready()
        with DaemonConnection(second.files().socket) as conn:
            status = conn.status()
        assert (status.adopted, status.disk_bytes_read) == (True, 0)
        assert "msg=published" not in second.log.read_text()
        assert generated(model, args, log=tmp_path / "second.log", calls=calls, cache=cache) == before
        assert "Mapping and binding weights took" in (tmp_path / "second.log").read_text()
    finally:
        server.stop()
        if second is not None:
            assert second.stop() == 0, second.log.read_text()[-4000:]
