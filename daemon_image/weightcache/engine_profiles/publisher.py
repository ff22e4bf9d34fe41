"""``weightcache daemon --profile <engine>``, one rank: the engine's own loader fills the arena, the
arena is published, then the process execs into the daemon's serving path (``daemon.handoff``).
What differs between engines is an ``EngineRank``; the order, the refusals that are no engine's
business, the keeper, the peers and the hand-over are this module's, the same for every engine.

The arena's backend follows the engine's platform: on the CPU it publishes a ``cpu-shm`` arena,
on a GPU (``--device`` or ``--gpus-file``, as for the reference daemon) a ``cuda-vmm`` arena on
that GPU, whose exported fd carries it across the exec. ``cuda-ipc`` is refused: nothing of it
survives the exec.

Order, as for the reference daemon: everything that can refuse the input (``--engine-args`` as
the engine's own parser reads them, their parallel layout, the engine's config checks, the
checkpoint's files) runs before the rank's lock is taken. Then the rank joins its local world
(an engine's layers read their rank from its process groups while they are built), and withdraws
its arena from the keeper, or copies a Ready peer's published arena of the same weights digest
(``--seed-peers-file``, seeding/client.py: the engine's loading and post-processing are skipped,
and nothing of the checkpoint is read but its config and headers), or loads and publishes one.

Re-adoption computes the fingerprint the same way, with the engine's own config code (it reads
config.json and the shards' headers, no weights) rather than from a torch-free copy of it: the
settings that decide the bytes are the engine's to define and change between versions, and a
second definition here could drift from the engine's. The cost is the engine's import and config
on a restart instead of a fraction of a second; the keeper then hands the arena back without a
weight byte read, and the exec drops the engine again.

Content digests: right after the load, while the checkpoint's pages are still in the page cache,
every shard the fingerprint stamps is hashed whole (``content.digest_shard`` with ``tasks=None``,
one thread per shard up to ``DIGEST_THREADS``) into the manifest's ``shard_digests``, which cross
the exec and the keeper with it. The serving daemon's checkpoint watch then tells a shard
rewritten with equal bytes (new inode, same content) from a changed one, as it does for the
reference loader's sliced digests (daemon/watch.py).
"""

from __future__ import annotations

import argparse
import grp
import logging
import os
import signal
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from torch import nn
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import DTYPE, ENGINE_ARGS, EP_SIZE, QUANTIZATION, DaemonArgs, json_strings
from weightcache_contract.seeding import SeedReport

from ..arenas.arena import create_arena
from ..checkpoints.checkpoint import ShardFile
from ..checkpoints.content import DigestCache, current_digest
from ..checkpoints.sharding import Layout
from ..daemon.command import seeding_fields
from ..daemon.handoff import HandoffState, exec_daemon, handoff_state
from ..daemon.keeper import keeper_socket
from ..daemon.rank import DaemonConfig, adopt_from_keeper, rank_device, verified_rebadge
from ..seeding.client import Expected, SeedResult, seed_rank
from ..wire.fingerprint import Fingerprint, ShardStamp
from ..wire.rankfiles import RankFiles
from .profile import loopback
from .publish import publish

log = logging.getLogger("weightcache.publisher")

MAX_ARENA_RATIO = 4
"""A seed offer for a rank bigger than this many times its whole checkpoint (plus 1 GiB of buffers)
is refused before anything is allocated: a rank holds at most the checkpoint's weights, widened at
most 2x by a dtype (fp16 read as fp32), and its rotary caches."""

DIGEST_THREADS = 8
"""Shards hashed at once after the load (SHA-256 of page-cached bytes runs at ~1-2 GB/s a core)."""


class EngineRank(ABC):
    """What one engine does for one rank of its profile. ``prepare`` runs before the rank's lock
    is taken and refuses what the engine could not serve; ``join`` and ``load`` run under it."""

    profile: ClassVar[str] = ""

    @abstractmethod
    def prepare(self, args: argparse.Namespace, engine_args: list[str], layout: Layout, device: int) -> Fingerprint:
        """Parses ``engine_args`` with the engine's own parser into the configuration the engine
        will run, refuses what the cache cannot serve (naming the fix), and returns the rank's
        fingerprint, computed before any weight is loaded (reads config and headers only)."""

    @abstractmethod
    def join(self, layout: Layout, rendezvous: str, device: int) -> None:
        """Joins the rank's world at ``rendezvous``: an engine's layers read their rank from its
        process groups while they are built, so every rank of the world loads together."""

    @abstractmethod
    def load(self, device: int) -> nn.Module:
        """The rank's model, loaded and post-processed by the engine's own loader, on the arena's
        device; refuses (before a byte is loaded where it can) a model an engine could not map."""


def engine_arguments(args: argparse.Namespace) -> list[str]:
    """``--engine-args`` as a list (JSON checks only; what the list asks for is the engine's parser's)."""
    if args.engine_args is None:
        raise WeightCacheError(
            f"--profile {args.profile} needs {ENGINE_ARGS.flag}: the JSON list of engine arguments the engine "
            "gets after its model, e.g. '[\"--dtype\",\"bfloat16\"]' ('[]' for the engine's defaults)"
        )
    return list(json_strings(args.engine_args))


def run(args: argparse.Namespace, engine: EngineRank) -> int:
    layout = Layout(args.tp_size, args.tp_rank, args.pp_size, args.pp_rank, args.ep_size)
    refuse_reference_only_flags(args)
    world = args.tp_size * args.pp_size
    if world > 1 and not args.dist_init:
        raise WeightCacheError(
            f"--profile {args.profile} with {world} ranks loads them together: start the daemon with --ranks "
            f"0-{world - 1} (one process per rank, joined on a loopback port)"
        )
    listed = engine_arguments(args)
    device = rank_device(_daemon_config(args, layout))
    if device is None:
        return 0  # stopped while waiting for the GPU holder
    args.device = device
    fingerprint = engine.prepare(args, listed, layout, device)
    files = RankFiles(args.socket_dir, args.name, layout.rank)
    fields = {"cache": args.name, "rank": layout.rank, "fingerprint": fingerprint.digest[:16], "profile": args.profile}
    gid = grp.getgrnam(args.socket_group).gr_gid if args.socket_group else None
    files.claim(dir_mode=0o750 if gid is not None else 0o700)
    if gid is not None:
        os.chown(files.dir, -1, gid)  # as the reference daemon does: the group's engines may enter
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop while loading: KeyboardInterrupt
    try:
        engine.join(layout, args.dist_init or loopback(), device)
        state = _withdraw(args, layout, fingerprint, fields)
        if state is None:
            seeded = _seed(args, layout, fingerprint, fields)
            state = (
                _seeded_state(seeded, fingerprint)
                if seeded is not None and seeded.arena is not None
                else _load_and_publish(engine, fingerprint, args, fields, seeded.report if seeded else None)
            )
        assert files.lock_fd is not None
        exec_daemon(state.model_copy(update={"lock_fd": files.lock_fd}), _serving_args(args))
    except KeyboardInterrupt:
        log.info("stopped during load", extra={"fields": fields})
        return 0
    finally:
        files.release()  # reached only when the exec did not happen


def refuse_reference_only_flags(args: argparse.Namespace) -> None:
    """Flags of the reference loader that an engine takes from ``--engine-args`` instead."""
    profile = args.profile
    if args.backend == "cuda-ipc":
        raise WeightCacheError(
            f"--profile {profile} cannot publish cuda-ipc arenas: a legacy CUDA IPC handle names memory of the "
            "publisher's CUDA context, which the exec into the torch-free serving daemon destroys, and the "
            "keeper cannot hold it; use --backend cuda-vmm"
        )
    if args.engine_access != "read-only":
        raise WeightCacheError(
            f"--profile {profile} arenas are mapped read-only (an engine's in-place writes get private copies, "
            f"docs/{profile}.md); drop --engine-access read-write"
        )
    for option, value in (
        (DTYPE, args.dtype),
        (QUANTIZATION, args.quantization),
        (EP_SIZE, args.ep_size),
    ):
        if value != option.default:
            raise WeightCacheError(
                f"{option.flag} {value} is the reference loader's; with --profile {profile} put the engine's own "
                f"flag into {ENGINE_ARGS.flag}"
            )
    if args.synthetic_fill:
        raise WeightCacheError("--synthetic-fill exists for the reference profile only")


def _withdraw(
    args: argparse.Namespace, layout: Layout, fingerprint: Fingerprint, fields: dict[str, Any]
) -> HandoffState | None:
    """This rank's arena back from the keeper when it holds this fingerprint (no weight read)."""
    if args.keeper != "auto":
        return None
    # The keeper may hold these very bytes under older shard stamps (a shard copied over itself
    # while no daemon ran): its whole-file digests are verified against the files as they are now.
    rebadge = (
        verified_rebadge(fingerprint, Path(fingerprint.model_path), {}, None, DigestCache(args.socket_dir), fields)
        if args.checkpoint_poll_seconds > 0
        else None
    )
    adopted = adopt_from_keeper(
        keeper_socket(args.socket_dir), _daemon_config(args, layout), fingerprint.digest, fields, rebadge
    )
    if adopted is None:
        return None
    arena, manifest, seconds = adopted
    return handoff_state(
        arena, manifest, fingerprint, lock_fd=-1, load_seconds=seconds, disk_bytes_read=0, adopted=True
    )


def _seed(
    args: argparse.Namespace, layout: Layout, fingerprint: Fingerprint, fields: dict[str, Any]
) -> SeedResult | None:
    """This rank's published arena copied from a peer (seeding/client.py), the engine's loading and
    post-processing skipped; None when no peer is listed for these weights. Each rank decides
    alone, as for a withdrawal: once the group is joined, a rank's loading needs no other rank.
    The engine's layout is known only after its post-processing, so the offer is bounded instead
    of planned (``Expected`` without a plan)."""
    settings = _daemon_config(args, layout).seed
    if settings is None:
        return None
    rank = layout.rank
    expected = Expected(
        fingerprint, None, None, max_arena_bytes=MAX_ARENA_RATIO * _checkpoint_bytes(args.model) + 2**30
    )
    seeded = seed_rank(
        settings,
        rank,
        expected,
        lambda size: create_arena(args.backend, size, f"{args.name}/rank-{rank}", args.device),
        fields,
    )
    if seeded is not None and seeded.arena is None:
        log.warning(
            "seed fell back to loading with the engine", extra={"fields": {**fields, "why": seeded.report.fallback}}
        )
    return seeded


def _seeded_state(seeded: SeedResult, fingerprint: Fingerprint) -> HandoffState:
    assert seeded.arena is not None and seeded.manifest is not None
    return handoff_state(
        seeded.arena,
        seeded.manifest,
        fingerprint,
        lock_fd=-1,
        load_seconds=seeded.report.seconds,
        disk_bytes_read=0,
        adopted=False,
        seed=seeded.report,
        chunk_digests=seeded.chunk_digests,
    )


def _daemon_config(args: argparse.Namespace, layout: Layout) -> DaemonConfig:
    """The reference daemon's view of this rank: its GPU, what the keeper and the peers are asked
    for (refusing a half-configured seeding before anything is claimed)."""
    return DaemonConfig(
        model=args.model,
        layout=layout,
        socket_dir=args.socket_dir,
        name=args.name,
        backend=args.backend,
        device=args.device,
        gpus_file=args.gpus_file,
        local_index=args.local_index,
        **seeding_fields(args),
    )


def _load_and_publish(
    engine: EngineRank,
    fingerprint: Fingerprint,
    args: argparse.Namespace,
    fields: dict[str, Any],
    seed: SeedReport | None = None,
) -> HandoffState:
    started = time.perf_counter()
    model = engine.load(args.device)
    # --checkpoint-poll-seconds 0 turns the watch off, and with it the hashing (as for the reference loader).
    watched = args.checkpoint_poll_seconds > 0
    digests, hashed_bytes, hash_seconds = (
        shard_digests(fingerprint, DigestCache(args.socket_dir)) if watched else ({}, 0, 0.0)
    )
    rank = fields["rank"]
    published = publish(model, fingerprint.digest, f"{args.name}/rank-{rank}", args.backend, args.device)
    del model  # the arena holds the bytes now; on a GPU the exec frees the loaded copy in any case
    manifest = published.manifest.model_copy(update={"shard_digests": digests})
    seconds = time.perf_counter() - started
    log.info(
        "published",
        extra={
            "fields": {
                **fields,
                "tensors": len(published.manifest),
                "arena_bytes": published.arena.size,
                "seconds": f"{seconds:.2f}",
                "hashed_bytes": hashed_bytes,
                "hash_seconds": f"{hash_seconds:.3f}",
            }
        },
    )
    return handoff_state(
        published.arena,
        manifest,
        fingerprint,
        lock_fd=-1,
        load_seconds=seconds,
        disk_bytes_read=_checkpoint_bytes(args.model),
        adopted=False,
        seed=seed,
    )


def shard_digests(fingerprint: Fingerprint, cache: DigestCache | None) -> tuple[dict[str, str], int, float]:
    """Whole-file content digests of the shards ``fingerprint`` stamps, hashed in parallel threads
    (hashlib releases the GIL); with the bytes read for them and the seconds it took. A shard
    whose file changed since it was stamped gets no digest: the watch then reports it as changed,
    which it is for the engines that will stamp it as it is now."""
    started = time.perf_counter()
    root = Path(fingerprint.model_path)

    def one(stamp: ShardStamp) -> tuple[str, str | None, int]:
        digest, read = current_digest(root / stamp.name, ShardFile(**stamp.model_dump()), {}, None, cache)
        return stamp.name, digest, read

    shards = list(fingerprint.shards)
    with ThreadPoolExecutor(max_workers=max(1, min(DIGEST_THREADS, len(shards))), thread_name_prefix="digest") as pool:
        done = list(pool.map(one, shards))
    digests = {name: digest for name, digest, _ in done if digest is not None}
    return digests, sum(read for _, _, read in done), time.perf_counter() - started


def _checkpoint_bytes(model: str) -> int:
    """What the engine's loader read: every safetensors file of the checkpoint (engines' default
    loaders read them whole)."""
    return sum(e.stat().st_size for e in os.scandir(model) if e.name.endswith(".safetensors"))


def _serving_args(args: argparse.Namespace) -> DaemonArgs:
    """The rank's flags for the serving image: every daemon flag it was given, its layout and its
    resolved GPU included, less the publisher's rendezvous (the serving image joins no world)."""
    return DaemonArgs.from_namespace(args, dist_init=None)
