"""An engine profile defined in one module (``toy_engine.py``: its parser, config and model) gets
every engine profile's rank from the shared publisher core: refusals before any rank file exists,
publication and the hand-over to the serving daemon, its fingerprint served by that daemon, the
keeper's re-adoption without a load, and its own compile caches under ``artifacts-run``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from testcluster.waiting import wait_for
from toy_engine import LOADS, toy_fingerprint, toy_model
from weightcache.client.weights import DaemonConnection, map_fingerprint
from weightcache.wire.rankfiles import RankFiles

TOY = str(Path(__file__).with_name("toy_engine.py"))


def toy_daemon(llama: Path, socket_dir: str, tmp_path: Path, engine_args: list[str]) -> subprocess.Popen[str]:
    argv = [sys.executable, TOY, "daemon", "--model", str(llama), "--name", "toy", "--socket-dir", socket_dir]
    argv += ["--backend", "cpu-shm", "--profile", "toy", "--engine-args", json.dumps(engine_args)]
    return subprocess.Popen(
        argv,
        stdout=(tmp_path / "toy.log").open("a"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, LOADS: str(tmp_path / "loads")},
    )


def test_what_the_engines_own_parser_refuses_stops_the_rank_before_any_rank_file(
    llama: Path, socket_dir: str, tmp_path: Path
) -> None:
    for engine_args, message in (
        (["--width", "wide"], "the toy's parser refused --engine-args ['--width', 'wide']"),
        (["--draft-model", "/d"], "the toy cannot serve a draft model from the cache; remove --draft-model"),
    ):
        daemon = toy_daemon(llama, socket_dir, tmp_path, engine_args)
        assert daemon.wait(timeout=60) == 2
        assert message in (tmp_path / "toy.log").read_text()
    assert not (Path(socket_dir) / "toy").exists() and not (tmp_path / "loads").exists()


def test_a_toy_rank_is_published_served_by_its_fingerprint_and_readopted_without_a_load(
    llama: Path, socket_dir: str, start_keeper: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    start_keeper()
    files = RankFiles(socket_dir, "toy", 0)
    want = toy_fingerprint(str(llama), 24)
    for expected_loads, adopted in ((1, False), (1, True)):
        daemon = toy_daemon(llama, socket_dir, tmp_path, ["--width", "24"])
        try:
            # The killed rank's ready file stays behind: this rank's names its own pid.
            ready = wait_for(
                lambda d=daemon: (r if (r := files.read_ready()) and r.pid == d.pid else None) or d.poll() is not None,
                describe="the toy rank's ready file",
            )
            assert ready is not True, (tmp_path / "toy.log").read_text()
            assert "libtorch" not in Path(f"/proc/{daemon.pid}/maps").read_text()  # handed over: no torch
            weights = map_fingerprint(want, 0, socket_dir, "toy")
            source = dict(toy_model(24).named_parameters())
            assert set(weights.tensors) == set(source)
            assert all(torch.equal(weights.tensors[n], t.detach()) for n, t in source.items())
            with DaemonConnection(files.socket) as conn:
                wait_for(lambda: conn.status().deposited, describe="the keeper deposit")
                status = conn.status()
            assert status.adopted is adopted and (status.disk_bytes_read == 0) is adopted
            assert (tmp_path / "loads").read_text().count("load") == expected_loads
        finally:
            os.killpg(daemon.pid, signal.SIGKILL)  # as a crash: the keeper keeps the arena
            daemon.wait(timeout=30)
        wait_for(lambda: not files.lock_is_held(), describe="the killed rank's lock")


def test_artifacts_run_stages_the_toys_own_compile_cache(tmp_path: Path) -> None:
    for part in ("entries", "staging"):
        (tmp_path / part).mkdir()
    show = "import json, os; print(json.dumps({k: os.environ[k] for k in ('TOY_CACHE', 'TORCHINDUCTOR_CACHE_DIR')}))"
    argv = [sys.executable, TOY, "artifacts-run", "--dir", str(tmp_path), "--health", "http://127.0.0.1:9/"]
    ran = subprocess.run([*argv, "--profile", "toy", "--", sys.executable, "-c", show], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    env = json.loads(ran.stdout)
    staging = Path(env["TOY_CACHE"]).parent.parent
    assert staging.parent == tmp_path / "staging"
    assert env == {"TOY_CACHE": f"{staging}/data/toy", "TORCHINDUCTOR_CACHE_DIR": f"{staging}/data/inductor"}
