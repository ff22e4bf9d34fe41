"""Two vLLM engines mapping one daemon's arena, and the daemon, hold one copy of the weights between
them: each engine's worker has the arena's pages it touched resident as shared memory (RssShmem:
all but the embedding rows no prompt looked up), the fair shares of that shared memory
(Pss_Shmem) of all three add up to one engine's RssShmem, not two, and neither engine's private
(anonymous) memory holds a copy: it is about one arena smaller than that of the same engine
loading from disk. The checkpoint is ~65 MB, so one copy more or less is unambiguous."""

from pathlib import Path

from vllm_harness import Engine, assert_zero_copy, cache_config, qwen3_checkpoint, start_daemon, vllm_args
from weightcache.engine_profiles.report import memory_kib

MIB = 2**20
SIZES = {"hidden_size": 512, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 2048, "vocab_size": 16384}


def test_two_engines_and_the_daemon_share_one_copy_of_the_weights(tmp_path: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3", **SIZES), vllm_args()
    with Engine(model, args, log=tmp_path / "engine-disk.log") as engine:
        expected = engine.generate()
        (disk,) = engine.report()
    daemon = start_daemon(model, tmp_path / "sockets", "qwen3", args, logs=tmp_path)
    try:
        daemon.wait_ready()
        ready = daemon.files(0).read_ready()
        assert ready is not None
        arena_kib = ready.arena_bytes // 1024
        assert ready.arena_bytes > 60 * MIB
        cache = cache_config(daemon)
        with Engine(model, args, cache=cache, log=tmp_path / "engine-a.log") as a:
            with Engine(model, args, cache=cache, log=tmp_path / "engine-b.log") as b:
                assert a.generate() == expected and b.generate() == expected  # every weight page touched
                reports = [a.report()[0], b.report()[0]]
                held = memory_kib(ready.pid)
        for report in reports:
            assert_zero_copy([report], tp=1)
        engines = [r["memory_kib"] for r in reports]
        shared = sum(m["Pss_Shmem"] for m in [*engines, held])
        print(f"\narena {arena_kib} KiB; disk engine {disk['memory_kib']}")
        print(f"daemon {held}\nengine a {engines[0]}\nengine b {engines[1]}\nPss_Shmem total {shared} KiB")
        for m in engines:  # the weights each engine read (the embedding only the rows it looked up)...
            assert 0.7 * arena_kib <= m["RssShmem"] <= arena_kib
        assert abs(shared - max(m["RssShmem"] for m in engines)) <= 0.02 * arena_kib  # ...held once by all three
        for m in engines:  # and no engine holds a private copy
            assert disk["memory_kib"]["RssAnon"] - m["RssAnon"] >= 0.8 * arena_kib
    finally:
        daemon.stop()
