"""``weightcache artifacts-run --dir DIR --health URL -- vllm serve …``: an engine on the node's
compile-artifact directory.

The wrapper makes the engine's private staging directory (store.py) and holds its ``alive.lock``,
points the engine's compile caches into it (``VLLM_CACHE_ROOT``, ``TORCHINDUCTOR_CACHE_DIR``,
``TRITON_CACHE_DIR``), and runs the engine as its child. The engine's loader computes the key
from its own parsed configuration and copies a published entry in (``Store.claim``, in the
weightcache loader), before vLLM compiles. Once the engine answers ``URL`` with 200 its compilation
is done: the wrapper marks the staging directory ``READY`` and the daemon publishes it. Signals
are forwarded; the wrapper exits with the engine's code (128 + N after signal N). Torch-free and vLLM-free: it costs the
engine's start a Python start, not an import of the engine.
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

from .store import Store

DIR_ENV = "WEIGHTCACHE_ARTIFACT_DIR"
STAGING_ENV = "WEIGHTCACHE_ARTIFACT_STAGING"
"""Set for the engine: the root (entries read-only) and its own staging directory."""
ENGINE_CACHE_ENV = "VLLM_CACHE_ROOT"
HEALTH_POLL_S = 0.5
# The engine's own address: an HTTP(S)_PROXY in the pod's environment must not route it.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, help="the node's artifact directory (entries/ and staging/)")
    p.add_argument("--health", required=True, metavar="URL", help="the engine's health URL: 200 once it serves")
    p.add_argument("engine", nargs=argparse.REMAINDER, help="-- and the engine's command line")


ENGINE_DEFAULTS = {"VLLM_USE_AOT_COMPILE": "0"}
"""Set unless the engine's environment sets them. vLLM 0.32's ahead-of-time compiled function (its
default with torch ≥ 2.10) does not load back on this CPU build with torch 2.13: every later engine
logs ``Compiling model again due to a load failure …: 'function' object has no attribute
'finalize_loading'`` and compiles again, with or without ``VLLM_USE_MEGA_AOT_ARTIFACT``. Without
it vLLM traces with Dynamo (seconds) and loads Inductor's compiled graphs from its cache by keys
relative to the cache directory, so a copied entry works from any staging directory."""


def engine_env(staging: Path, root: str, environ: dict[str, str]) -> dict[str, str]:
    """Every compile cache of the engine under its staging data. vLLM moves Inductor's and
    Triton's caches under ``VLLM_CACHE_ROOT`` only where its own compile cache is used; without the
    AOT function (``ENGINE_DEFAULTS``), vLLM's CPU build compiles through Inductor's FX graph and
    AOTAutograd caches in ``TORCHINDUCTOR_CACHE_DIR`` (seen: nothing but ``modelinfos/`` under
    ``VLLM_CACHE_ROOT`` otherwise), so they are pointed there too."""
    data = staging / "data"
    defaults = {k: v for k, v in ENGINE_DEFAULTS.items() if k not in environ}
    return {
        **defaults,
        DIR_ENV: root,
        STAGING_ENV: str(staging),
        ENGINE_CACHE_ENV: str(data),
        "TORCHINDUCTOR_CACHE_DIR": str(data / "inductor"),
        "TRITON_CACHE_DIR": str(data / "triton"),
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
    store = Store(args.dir)
    if not store.staging.is_dir():
        raise WeightCacheError(
            f"{store.staging} does not exist: the node's daemon creates the artifact directory (--artifact-dir); "
            "mount the same host directory, or start the daemon first"
        )
    staging, alive = store.stage()
    child = subprocess.Popen(argv, env={**os.environ, **engine_env(staging, args.dir, dict(os.environ))}, pass_fds=())

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
