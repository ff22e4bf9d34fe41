"""Shared fixtures: generated checkpoints and real daemon processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from weightcache.tools.sample_checkpoints import ModelSpec, write_checkpoint
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.launch import DaemonArgs, KeeperArgs


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Generate (once per session) a checkpoint for a ModelSpec; returns its directory."""
    made: dict[ModelSpec, Path] = {}

    def make(**kwargs: object) -> Path:
        spec = ModelSpec(**kwargs)  # type: ignore[arg-type]
        if spec not in made:
            made[spec] = write_checkpoint(tmp_path_factory.mktemp(f"ckpt-{spec.family}"), spec)
        return made[spec]

    return make


@pytest.fixture(scope="session")
def llama(checkpoint_factory: Callable[..., Path]) -> Path:
    return checkpoint_factory(family="llama")


@dataclass
class DaemonHandle:
    proc: subprocess.Popen[str]
    socket_dir: str
    name: str
    ranks: list[int]
    log: Path
    files: list[RankFiles] = field(default_factory=list)

    def output(self) -> str:
        return self.log.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # Short path: Unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="wc-") as d:
        yield d


@pytest.fixture
def lean_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import torch`` and ``import numpy`` raise: proves a process path
    (probe, keeper, re-adopting daemon) never imports them. ``torch/version.py`` is the real one,
    which the fingerprint reads as text."""
    import torch

    root = tmp_path / "lean"
    for package in ("torch", "numpy"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"raise ImportError('{package} imported on a lean path')\n")
    shutil.copy(Path(torch.__file__).parent / "version.py", root / "torch" / "version.py")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}


@pytest.fixture
def start_keeper(socket_dir: str, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``weightcache keeper`` on the test's socket dir; waits until it answers."""
    from weightcache.daemon.keeper import KeeperClient, keeper_socket
    from weightcache_contract.errors import CacheUnavailable

    procs: list[subprocess.Popen[str]] = []

    def start(env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        log = tmp_path / f"keeper-{len(procs)}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "weightcache", "keeper", *KeeperArgs(socket_dir=socket_dir).to_argv()],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=env,
        )
        procs.append(proc)
        deadline = time.monotonic() + 60
        while True:
            try:
                with KeeperClient(keeper_socket(socket_dir), timeout_s=1) as keeper:
                    keeper.ping()
                return proc
            except CacheUnavailable:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"keeper did not start:\n{log.read_text()}") from None
                time.sleep(0.05)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def start_daemon(socket_dir: str, tmp_path: Path) -> Iterator[Callable[..., DaemonHandle]]:
    """Start ``weightcache daemon`` as a real process; waits for every rank's ready file."""
    handles: list[DaemonHandle] = []

    def start(
        model: Path,
        *,
        name: str = "test",
        ranks: list[int] | None = None,
        wait: bool = True,
        socket_dir_override: str | None = None,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        **launch: Any,
    ) -> DaemonHandle:
        """``launch``: ``DaemonArgs`` fields (the contract renders the argv); ``ranks`` starts the
        ``--ranks`` launcher and waits for each of them, else the one rank 0."""
        sdir = socket_dir_override or socket_dir
        daemon = DaemonArgs(
            model=str(model), socket_dir=sdir, name=name, ranks=tuple(ranks) if ranks else None, **launch
        )
        ranks = ranks or [0]
        log = tmp_path / f"daemon-{name}-{len(handles)}.log"
        argv = [sys.executable, "-m", "weightcache", "daemon", *daemon.to_argv()]
        launched = time.time()
        proc = subprocess.Popen(
            argv, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env
        )
        handle = DaemonHandle(proc, sdir, name, ranks, log, [RankFiles(sdir, name, r) for r in ranks])
        handles.append(handle)
        if wait:
            deadline = time.monotonic() + timeout
            # A stale ready file from a killed daemon may be there already: wait for fresh ones.
            while not all((info := f.read_ready()) is not None and info.started_at >= launched for f in handle.files):
                if proc.poll() is not None:
                    raise AssertionError(f"daemon exited {proc.returncode}:\n{handle.output()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"daemon not ready in {timeout} s:\n{handle.output()}")
                time.sleep(0.02)
        return handle

    yield start
    for h in handles:
        if h.proc.poll() is None:
            try:
                os.killpg(h.proc.pid, signal.SIGTERM)
                h.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                os.killpg(h.proc.pid, signal.SIGKILL)
                h.proc.wait()
