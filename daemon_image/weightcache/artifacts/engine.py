"""``weightcache artifacts-run --dir DIR --health URL --profile NAME -- <engine command>``: an
engine on the node's compile-artifact directory.

The wrapper makes the engine's private staging directory (store.py) and holds its ``alive.lock``,
points the engine's compile caches into it (torch's ``TORCHINDUCTOR_CACHE_DIR`` and
``TRITON_CACHE_DIR``, and whatever the engine's profile adds: ``LoadProfile.compile_env``), and
runs the engine as its child. The engine's loader computes the key from its own parsed
configuration and copies a published entry in (``Store.claim``, in the weightcache loader),
before the engine compiles. Once the engine answers ``URL`` with 200 its compilation
is done: the wrapper marks the staging directory ``READY`` and the daemon publishes it. Signals
are forwarded; the wrapper exits with the engine's code (128 + N after signal N). Torch-free and engine-free: it costs
the engine's start a Python start, not an import of the engine.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import urllib.request
from pathlib import Path

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import ArtifactsRunArgs, add_artifacts_run_arguments

from ..profiles import get_profile
from .store import Store

DIR_ENV = "WEIGHTCACHE_ARTIFACT_DIR"
STAGING_ENV = "WEIGHTCACHE_ARTIFACT_STAGING"
"""Set for the engine: the root (entries read-only) and its own staging directory."""
HEALTH_POLL_S = 0.5
# The engine's own address: an HTTP(S)_PROXY in the pod's environment must not route it.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_artifacts_run_arguments(p)
    p.add_argument("engine", nargs=argparse.REMAINDER, help="-- and the engine's command line")


def engine_env(staging: Path, root: str, profile: str, environ: dict[str, str]) -> dict[str, str]:
    """Every compile cache of the engine under its staging data: torch's Inductor and Triton
    caches, and the engine's own (its profile's ``compile_env``, which may also set defaults the
    engine's environment does not override)."""
    data = staging / "data"
    return {
        DIR_ENV: root,
        STAGING_ENV: str(staging),
        "TORCHINDUCTOR_CACHE_DIR": str(data / "inductor"),
        "TRITON_CACHE_DIR": str(data / "triton"),
        **get_profile(profile).compile_env(data, environ),
    }


def healthy(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=2) as response:
            return int(response.status) == 200
    except (OSError, ValueError):
        return False


def run(args: argparse.Namespace) -> int:
    argv = args.engine[1:] if args.engine[:1] == ["--"] else args.engine
    if not argv:
        raise WeightCacheError("artifacts-run needs the engine's command after --, e.g. -- vllm serve MODEL")
    given = ArtifactsRunArgs.from_namespace(args)
    get_profile(given.profile)  # an unknown profile is refused before anything is staged
    store = Store(args.dir)
    if not store.staging.is_dir():
        raise WeightCacheError(
            f"{store.staging} does not exist: the node's daemon creates the artifact directory (--artifact-dir); "
            "mount the same host directory, or start the daemon first"
        )
    staging, alive = store.stage()
    environment = engine_env(staging, given.dir, given.profile, dict(os.environ))
    child = subprocess.Popen(argv, env={**os.environ, **environment}, pass_fds=())

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(HEALTH_POLL_S):
            if healthy(args.health):
                Store.mark_ready(staging)
                return

    threading.Thread(target=watch, name="artifact-ready", daemon=True).start()
    try:
        code = child.wait()
        return code if code >= 0 else 128 - code  # a shell's convention: 143 after SIGTERM
    finally:
        stop.set()
        os.close(alive)  # the daemon removes the staging directory once nobody holds it
