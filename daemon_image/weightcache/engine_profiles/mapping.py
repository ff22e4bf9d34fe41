"""An engine's side of the cache, the same for every engine's load format: the options the engine
passes its ``weightcache`` loader (``--model-loader-extra-config``, which vLLM and SGLang both
spell so), and the rank mapped by fingerprint or, when that fails, the reason and its fix for the
``fallback`` the options ask for (``disk``: the engine loads from disk and logs why; ``error``:
the engine stops)."""

from __future__ import annotations

import dataclasses
from typing import Any

from weightcache_contract.errors import CacheUnavailable, FingerprintMismatch, ProtocolError, WeightCacheError
from weightcache_contract.launch import ENGINE_ARGS

from ..client.weights import Weights, map_fingerprint
from ..wire.fingerprint import Fingerprint
from ..wire.rankfiles import RankFiles, default_socket_dir

OPTIONS = ("name", "socket_dir", "fallback", "timeout_s")
EXTRA_CONFIG = "--model-loader-extra-config"


@dataclasses.dataclass(frozen=True)
class Options:
    name: str
    socket_dir: str
    fallback: str = "disk"
    timeout_s: float = 10.0

    @classmethod
    def parse(cls, extra: dict[str, Any] | None) -> Options:
        extra = dict(extra or {})
        unknown = sorted(extra.keys() - set(OPTIONS))
        if unknown:
            raise ValueError(
                f"{EXTRA_CONFIG} has unknown key(s) {unknown} for --load-format weightcache; known: {', '.join(OPTIONS)}"
            )
        if not extra.get("name"):
            raise ValueError(
                f"--load-format weightcache needs the cache's name: {EXTRA_CONFIG} "
                '\'{"name": "<WeightCache name>"}\''
            )
        fallback = extra.get("fallback", "disk")
        if fallback not in ("disk", "error"):
            raise ValueError(f"weightcache fallback must be 'disk' or 'error', got {fallback!r}")
        return cls(
            name=str(extra["name"]),
            socket_dir=str(extra.get("socket_dir") or default_socket_dir()),
            fallback=fallback,
            timeout_s=float(extra.get("timeout_s", 10.0)),
        )


def map_or_reason(
    options: Options,
    profile: str,
    fingerprint: Fingerprint,
    rank: int,
    backend: str,
    gpu_uuid: str | None = None,
) -> Weights | str:
    """The rank mapped read-only, or why not (with its fix) when the engine may load from disk;
    raises that reason instead under ``fallback: error``."""
    try:
        return map_fingerprint(
            fingerprint,
            rank,
            options.socket_dir,
            options.name,
            backend=backend,
            timeout_s=options.timeout_s,
            gpu_uuid=gpu_uuid,
        )
    except (CacheUnavailable, FingerprintMismatch, ProtocolError) as exc:
        fix = unmapped_fix(exc, RankFiles(options.socket_dir, options.name, rank), profile)
        reason = f"weightcache {options.name!r} rank {rank}: {exc}" + (f"; {fix}" if fix else "")
        if options.fallback == "error":
            raise WeightCacheError(
                f'{reason}, or set "fallback": "disk" in {EXTRA_CONFIG} to load from disk instead'
            ) from None
        return reason


def unmapped_fix(exc: WeightCacheError, files: RankFiles, profile: str) -> str | None:
    """What to do about a rank the engine could not map, beyond what ``exc`` says."""
    if isinstance(exc, FingerprintMismatch):
        if {"engine", "engine.engine", "engine.load_profile"} & set(exc.fields):
            return (
                f"that daemon publishes another load profile than this engine's post-processed layout: start it "
                f"with `weightcache daemon --profile {profile} {ENGINE_ARGS.flag} '<this engine's arguments as JSON>'`"
            )
        return None  # the mismatch names the fix for each differing field (fingerprint.mismatch_fix)
    if isinstance(exc, CacheUnavailable) and files.socket.exists():
        ready = files.read_ready()
        dead = f" (pid {ready.pid}, its ready file says)" if ready is not None else ""
        return (
            f"the socket file is left behind by a daemon that no longer runs{dead}: restart the daemon "
            f"(weightcache daemon --profile {profile} with the same --name and --socket-dir), which claims the rank "
            "and replaces the stale files"
        )
    return f"start its daemon (weightcache daemon --profile {profile})"
