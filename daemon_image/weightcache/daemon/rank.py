"""One daemon process per rank: validate, fingerprint, load once, serve until told to stop.

The order matters. Everything that can be wrong with the input (quantization method,
checkpoint files, parallel layout) is checked before the rank's lock is taken, so a bad
checkpoint never leaves files behind. The ready file appears only after the socket listens,
and disappears first on shutdown, so a reader of the ready file can always connect.
"""

from __future__ import annotations

import dataclasses
import grp
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcache_contract.backends import FD_BACKENDS, GPU_BACKENDS
from weightcache_contract.errors import (
    CacheUnavailable,
    FingerprintMismatch,
    ProtocolError,
    WeightCacheError,
)

from ..arenas.arena import Arena, adopt_arena, create_arena
from ..checkpoints.checkpoint import (
    Checkpoint,
    ShardFile,
    TensorInfo,
    current_stamps,
    open_checkpoint,
    with_headers,
)
from ..checkpoints.content import DigestCache, ReadDigests, current_digest, is_whole_file
from ..checkpoints.loader import SYNTHETIC_REVISION, fill, read_ranges, synthetic_fill
from ..checkpoints.manifest import Manifest
from ..checkpoints.page_cache import available_memory, prefetch
from ..checkpoints.pipeline import LoadPlan, check_layout, plan_rank, resolve_dtype
from ..checkpoints.progress import Progress
from ..checkpoints.quantization import QuantConfig, resolve
from ..checkpoints.read_tasks import ReadTask
from ..checkpoints.sharding import Layout
from ..gpu.gpu_grant import wait_for_grant
from ..gpu.gpu_identity import gpu_count, gpu_facts, ordinal_for_uuid
from ..seeding.client import Expected, SeedResult, SeedSettings, candidates, seed_rank
from ..seeding.server import SeedServer
from ..wire.fingerprint import Fingerprint, compute
from ..wire.protocol import MAX_REQUEST_BYTES, REQUEST, Deposit, Withdrawn
from ..wire.rankfiles import RankFiles, ReadyInfo
from .keeper import KeeperClient, keeper_socket
from .server import FramedServer, PeerPolicy, ServerStats
from .serving import DaemonService, Served
from .watch import CheckpointWatcher, Plan

log = logging.getLogger("weightcache.daemon")


@dataclass
class DaemonConfig:
    model: str
    layout: Layout
    socket_dir: str
    name: str
    dtype: str = "auto"
    quantization: str = "none"
    weight_block_size: tuple[int, int] | None = None
    backend: str = "cpu-shm"
    device: int = 0
    engine_access: str = "read-only"
    keeper: str = "auto"  # auto: use <socket-dir>/keeper.sock when a keeper listens there; off: never
    revision: str = ""
    socket_group: str | None = None
    allow_uids: list[int] = field(default_factory=list)
    allow_gids: list[int] = field(default_factory=list)
    load_workers: int = 4
    gpus_file: str | None = None
    """The GPU holder's grant (gpu_grant.py): when set, ``device`` is the ordinal of its
    ``local_index``-th GPU, found by UUID, and the daemon waits for the grant before anything else."""
    local_index: int = 0
    synthetic_fill: bool = False
    """Benchmarks only: a byte pattern instead of the checkpoint's bytes (loader.synthetic_fill),
    under a revision no real engine expects."""
    handoff_state: str | None = None
    """Set by another load profile's publisher when it execs into this daemon (handoff.py): serve
    the sealed arena it filled or withdrew, under the fingerprint it computed."""
    checkpoint_poll_s: float = 5.0
    """How often the rank stats its checkpoint (watch.py); 0: no watch. inotify wakes it sooner."""
    seed: SeedSettings | None = None
    """Ask these peers for the arena before reading the disk (seeding/client.py); None: never."""
    seed_listen: tuple[str, int] | None = None
    """Serve the arena to starting peers here (seeding/server.py); None: never."""
    seed_credential_file: str | None = None
    seed_max_clients: int = 2
    seed_max_bytes_per_s: float = 0.0


def run(cfg: DaemonConfig) -> int:
    """Load (or re-adopt) and serve one rank; returns the exit code. Input errors raise ``WeightCacheError``."""
    if cfg.handoff_state:
        return _serve_handed_over(cfg)
    if cfg.synthetic_fill:
        cfg = dataclasses.replace(cfg, revision=SYNTHETIC_REVISION + cfg.revision)
        log.warning(
            "SYNTHETIC FILL: this arena will hold a byte pattern, not the checkpoint's weights",
            extra={"fields": {"cache": cfg.name, "revision": cfg.revision}},
        )
    quant = resolve(cfg.quantization, None, cfg.weight_block_size)  # cheap allowlist check before any I/O
    if cfg.engine_access == "read-write" and cfg.backend != "cuda-vmm":
        raise WeightCacheError(
            f"--engine-access read-write exists only for cuda-vmm; {cfg.backend} arenas are read-only"
        )
    device = rank_device(cfg)
    if device is None:
        return 0  # stopped while waiting for the GPU holder
    cfg = dataclasses.replace(cfg, device=device)
    # Stamps first: enough to fingerprint, and all a re-adoption needs (see open_checkpoint).
    checkpoint = open_checkpoint(cfg.model, stamps_only=True)
    quant = resolve(cfg.quantization, checkpoint.quantization_config, cfg.weight_block_size)
    dtype = resolve_dtype(cfg.dtype, checkpoint)
    fingerprint = compute(
        checkpoint,
        cfg.layout,
        quant,
        dtype,
        revision=cfg.revision,
        backend=cfg.backend,
        device=cfg.device,
        access=cfg.engine_access,
    )
    check_layout(checkpoint, cfg.layout)
    rank = cfg.layout.rank
    files = RankFiles(cfg.socket_dir, cfg.name, rank)
    gid = grp.getgrnam(cfg.socket_group).gr_gid if cfg.socket_group else None
    fields = {"cache": cfg.name, "rank": rank, "fingerprint": fingerprint.digest[:16], "backend": cfg.backend}
    keeper_path = keeper_socket(cfg.socket_dir) if cfg.keeper == "auto" and arena_fd_backend(cfg.backend) else None
    plan = None
    overlap = None
    seeding = False
    if keeper_path is None or not _keeper_holds(keeper_path, cfg, fingerprint.digest):
        # Loading: torch's import and the CUDA context (seconds) start now, beside planning, and the
        # disk starts reading the plan's first bytes as soon as it exists (_Overlap).
        overlap = _Overlap(cfg)
        # Everything that can refuse this checkpoint runs before the claim, so a refused one leaves
        # no file behind. Skipped only when the keeper holds this fingerprint: the plan of an
        # adopted arena is its manifest, and planning 20,000 tensors would cost most of its second.
        checkpoint, plan = _plan(cfg, checkpoint, quant, dtype)
        # A peer that holds these weights is asked first; the disk is not touched meanwhile (no
        # prefetch), so a seeded rank reads no checkpoint byte beyond the headers.
        seeding = cfg.seed is not None and not cfg.synthetic_fill and bool(candidates(cfg.seed, rank, fingerprint))
        if not cfg.synthetic_fill and not seeding:
            overlap.prefetch(read_ranges(checkpoint, plan))

    files.claim(dir_mode=0o750 if gid is not None else 0o700)
    if gid is not None:
        os.chown(files.dir, -1, gid)
    stop_requested = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True
        raise KeyboardInterrupt  # interrupts loading; serving installs its own handler below

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    arena = None
    try:
        # Planned (the keeper held no arena for this fingerprint when asked): the keeper may still
        # hold these very bytes under older shard stamps, which the rank verifies for less than a load.
        rebadge = (
            verified_rebadge(
                fingerprint, checkpoint.path, checkpoint.tensors, plan.tasks, DigestCache(cfg.socket_dir), fields
            )
            if plan is not None and cfg.checkpoint_poll_s > 0 and not cfg.synthetic_fill
            else None
        )
        adopted = adopt_from_keeper(keeper_path, cfg, fingerprint.digest, fields, rebadge) if keeper_path else None
        seeded: SeedResult | None = None
        if adopted is None and seeding and plan is not None and cfg.seed is not None:
            if overlap is not None:
                overlap.wait_for_torch()
            seeded = seed_rank(
                cfg.seed,
                rank,
                Expected(fingerprint, plan.entries, plan.arena_bytes),
                lambda size: create_arena(cfg.backend, size, f"{cfg.name}/rank-{rank}", cfg.device),
                fields,
            )
            if seeded is not None and seeded.arena is None:
                log.warning("seed fell back to the disk", extra={"fields": {**fields, "why": seeded.report.fallback}})
        if adopted is not None:
            arena, manifest, load_seconds = adopted
            disk_bytes = 0
        elif seeded is not None and seeded.arena is not None and seeded.manifest is not None:
            arena, manifest, load_seconds = seeded.arena, seeded.manifest, seeded.report.seconds
            disk_bytes = 0
        else:
            if plan is None:  # the keeper let go of the arena between the look and the claim
                checkpoint, plan = _plan(cfg, checkpoint, quant, dtype)
            if overlap is not None:
                overlap.wait_for_torch()
            log.info(
                "loading",
                extra={
                    "fields": {
                        **fields,
                        "tensors": len(plan.entries),
                        "arena_bytes": plan.arena_bytes,
                        "read_bytes": plan.read_bytes,
                    }
                },
            )
            arena = create_arena(cfg.backend, plan.arena_bytes, f"{cfg.name}/rank-{rank}", cfg.device)
            progress = Progress(plan.read_bytes, f"{cfg.name}/rank-{rank}")
            # The digests serve only the checkpoint watch; without it they would cost CPU for nothing.
            digests = None if cfg.synthetic_fill or cfg.checkpoint_poll_s <= 0 else ReadDigests()
            if cfg.synthetic_fill:
                entries = synthetic_fill(plan, arena.buffer())
            else:
                entries = fill(
                    checkpoint,
                    plan,
                    arena.buffer(),
                    quant.weight_block_size,
                    progress,
                    workers=cfg.load_workers,
                    digests=digests,
                )
            load_seconds = progress.finish()
            if current_stamps(checkpoint) != checkpoint.shards:
                # The bytes may mix the old and the new files; the fingerprint names neither.
                raise WeightCacheError(
                    f"{cfg.model} changed while the daemon read it; the arena is discarded. "
                    "Start the daemon again once the checkpoint is complete"
                )
            arena.seal()
            shard_digests = digests.by_shard(checkpoint, plan.tasks) if digests is not None else {}
            manifest = Manifest.build(fingerprint.digest, arena.size, entries, plan.aliases, shard_digests)
            disk_bytes = checkpoint.bytes_read
            if shard_digests:
                _remember_digests(DigestCache(cfg.socket_dir), checkpoint, plan, shard_digests)
        checkpoint.close()
        served = Served(
            name=cfg.name,
            rank=rank,
            arena=arena,
            manifest=manifest,
            fingerprint=fingerprint,
            load_seconds=load_seconds,
            disk_bytes_read=disk_bytes,
            adopted=adopted is not None,
            seed=seeded.report if seeded is not None else None,
            chunk_digests=seeded.chunk_digests if seeded is not None else None,
        )
        return serve(cfg, files, gid, served, keeper_path, fields, _watch_plan(cfg, quant, dtype))
    except KeyboardInterrupt:
        if stop_requested:
            log.info("stopped during load", extra={"fields": fields})
            return 0
        raise
    finally:
        files.release()
        if arena is not None:
            arena.close()


def serve(
    cfg: DaemonConfig,
    files: RankFiles,
    gid: int | None,
    served: Served,
    keeper_path: Path | None,
    fields: dict[str, Any],
    watch_plan: Plan | None = None,
) -> int:
    """Serve ``served`` on the rank's socket until SIGTERM/SIGINT: keeper deposit, peer checks,
    ready file, and the checkpoint watch (watch.py; ``watch_plan``: the rank's read tasks, which
    verify a rewritten shard against sliced digests; whole-file ones need no plan, and a shard with
    no digest is reported as changed when rewritten). Every load profile
    ends here, so engines, probes, the status endpoint and the keeper see one kind of daemon. The
    caller holds ``files``' lock and closes the arena."""
    link: KeeperLink | None = None
    watcher: CheckpointWatcher | None = None
    seeds: SeedServer | None = None
    try:
        if keeper_path is not None:
            link = KeeperLink(keeper_path, served)
            link.start()
        policy = PeerPolicy(
            uids=frozenset({os.getuid(), 0, *cfg.allow_uids}),
            gids=frozenset({*cfg.allow_gids, *([gid] if gid is not None else [])}),
        )
        stats = ServerStats()
        server = FramedServer(
            str(files.socket),
            policy,
            REQUEST,
            DaemonService(served, stats),
            stats=stats,
            identity=(cfg.name, served.rank),
            max_request_bytes=MAX_REQUEST_BYTES,
            socket_mode=0o660 if gid is not None else 0o600,
            socket_gid=gid,
        )
        signal.signal(signal.SIGTERM, lambda *_: server.stop())
        signal.signal(signal.SIGINT, lambda *_: server.stop())
        if cfg.seed_listen is not None and cfg.seed_credential_file is not None:
            seeds = SeedServer(
                served,
                cfg.seed_listen,
                cfg.seed_credential_file,
                max_clients=cfg.seed_max_clients,
                max_bytes_per_s=cfg.seed_max_bytes_per_s,
                fields=fields,
            ).start()
        ready = ReadyInfo(
            pid=os.getpid(),
            name=cfg.name,
            rank=served.rank,
            backend=served.arena.backend,
            socket=str(files.socket),
            fingerprint_digest=served.fingerprint.digest,
            fingerprint=served.fingerprint,
            arena_bytes=served.arena.mapping_bytes,
            tensor_count=len(served.manifest),
            load_seconds=served.load_seconds,
            started_at=time.time(),
            device_uuid=served.arena.device_uuid,
            adopted=served.adopted,
        )
        files.write_ready(ready)
        log.info(
            "ready",
            extra={
                "fields": {
                    **fields,
                    "socket": str(files.socket),
                    "load_seconds": f"{served.load_seconds:.3f}",
                    "adopted": served.adopted,
                }
            },
        )
        if cfg.checkpoint_poll_s > 0 and not cfg.synthetic_fill:  # a byte pattern is no checkpoint's

            def adopt(fingerprint: Fingerprint) -> None:
                # Engines see the new identity on the socket first, then in the ready file, and a
                # restarted daemon finds it in the keeper: every place a fingerprint is read.
                served.adopt(fingerprint)
                fields["fingerprint"] = fingerprint.digest[:16]
                files.write_ready(
                    ready.model_copy(update={"fingerprint_digest": fingerprint.digest, "fingerprint": fingerprint})
                )
                if link is not None:
                    link.redeposit()

            watcher = CheckpointWatcher(
                served, cfg.checkpoint_poll_s, adopt, watch_plan, DigestCache(cfg.socket_dir), fields
            )
            watcher.start()
        server.serve_forever()
        log.info("stopped", extra={"fields": fields})
        return 0
    finally:
        if seeds is not None:
            seeds.stop()
        if watcher is not None:
            watcher.stop()
        if link is not None:
            link.stop()


def _serve_handed_over(cfg: DaemonConfig) -> int:
    """Serve the arena a publisher handed over across ``exec`` (handoff.py): its lock and memfd
    are inherited, its manifest and fingerprint come in the state file."""
    from .handoff import read_state

    state = read_state(cfg.handoff_state or "")
    files = RankFiles(cfg.socket_dir, cfg.name, cfg.layout.rank)
    files.adopt_lock(state.lock_fd)
    if state.backend != cfg.backend:
        os.close(state.arena_fd)
        files.release()
        raise WeightCacheError(
            f"the publisher handed over a {state.backend} arena to a daemon started with --backend {cfg.backend}; "
            "pass the serving daemon the publisher's own flags"
        )
    arena = adopt_arena(
        state.backend, state.arena_fd, state.manifest.arena_bytes, state.mapping_bytes, state.device_uuid
    )
    gid = grp.getgrnam(cfg.socket_group).gr_gid if cfg.socket_group else None
    served = Served(
        name=cfg.name,
        rank=files.rank,
        arena=arena,
        manifest=state.manifest,
        fingerprint=state.fingerprint,
        load_seconds=state.load_seconds,
        disk_bytes_read=state.disk_bytes_read,
        adopted=state.adopted,
        seed=state.seed,
        chunk_digests=state.chunk_digests,
    )
    keeper_path = keeper_socket(cfg.socket_dir) if cfg.keeper == "auto" else None
    fields = {"cache": cfg.name, "rank": files.rank, "fingerprint": state.fingerprint.digest[:16], "profile": "handoff"}
    try:
        return serve(cfg, files, gid, served, keeper_path, fields)
    finally:
        files.release()
        arena.close()


def rank_device(cfg: DaemonConfig) -> int | None:
    """The rank's CUDA ordinal: ``cfg.device``, or with ``--gpus-file`` its GPU of the holder's
    grant (waiting for it; None when SIGTERM/SIGINT came first). Refuses a GPU backend without
    that GPU. Every load profile resolves its device here."""
    device = cfg.device
    if cfg.gpus_file:
        granted = _granted_device(cfg)
        if granted is None:
            return None
        device = granted
    if cfg.backend in GPU_BACKENDS and device >= gpu_count():
        # Checked through the driver API, not torch: a re-adopting daemon never imports torch.
        raise WeightCacheError(
            f"backend {cfg.backend} needs a CUDA GPU (device {device}) and {gpu_count()} "
            "are visible; use --backend cpu-shm or give the pod a GPU"
        )
    return device


def _granted_device(cfg: DaemonConfig) -> int | None:
    """This rank's CUDA ordinal for the GPU the holder's grant gives it (waiting for the grant);
    None when SIGTERM/SIGINT came first."""
    if cfg.backend not in GPU_BACKENDS:
        raise WeightCacheError(
            f"--gpus-file names GPUs, but backend {cfg.backend} uses none; drop it or use a GPU backend"
        )
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # KeyboardInterrupt, like SIGINT
    try:
        uuid = wait_for_grant(Path(cfg.gpus_file or ""), cfg.local_index)
    except KeyboardInterrupt:
        log.info(
            "stopped while waiting for the GPU holder", extra={"fields": {"cache": cfg.name, "rank": cfg.layout.rank}}
        )
        return None
    finally:
        signal.signal(signal.SIGTERM, previous)
    ordinal = ordinal_for_uuid(uuid)
    if ordinal is None:
        raise WeightCacheError(
            f"{uuid}, granted to local rank {cfg.local_index} by {cfg.gpus_file}, is not visible to "
            f"this daemon ({gpu_count()} GPUs visible): run it with NVIDIA_VISIBLE_DEVICES=all, no "
            "nvidia.com/gpu request of its own and no CUDA_VISIBLE_DEVICES"
        )
    log.info(
        "using the GPU the holder booked",
        extra={"fields": {"cache": cfg.name, "rank": cfg.layout.rank, "gpu": uuid, "ordinal": ordinal}},
    )
    return ordinal


class _Overlap:
    """What a loading daemon waits for besides the disk, started early so it runs beside it.

    ``import torch`` and a CUDA context take seconds (~3.5 s on an H200 host) and would otherwise
    come between planning and the first read. A thread imports torch (and, for GPU backends,
    creates the device's context) while the main thread stamps, plans and claims, and a second
    thread asks the kernel to read ahead the plan's first bytes (up to ``PREFETCH_MAX_BYTES`` or
    half the available memory) so the disk is busy meanwhile. Neither thread raises: a failure
    shows up again, with its own message, where the main thread needs the result."""

    PREFETCH_MAX_BYTES = 8 * 2**30

    def __init__(self, cfg: DaemonConfig) -> None:
        self._cfg = cfg
        self._warm_thread = threading.Thread(target=self._warm, name="warm-torch", daemon=True)
        self._warm_thread.start()

    def _warm(self) -> None:
        try:
            import torch

            if self._cfg.backend in GPU_BACKENDS and torch.cuda.is_available():
                torch.empty(1, device=f"cuda:{self._cfg.device}")
        except Exception:  # noqa: BLE001 - create_arena reports it with its own message
            pass

    def prefetch(self, ranges: list[tuple[str, int, int]]) -> None:
        budget = min(self.PREFETCH_MAX_BYTES, available_memory() // 2)
        # Not joined: loading reads the same bytes in the same order and meets the read-ahead.
        threading.Thread(target=prefetch, args=(ranges, budget), name="prefetch", daemon=True).start()

    def wait_for_torch(self) -> None:
        self._warm_thread.join()


def _plan(cfg: DaemonConfig, stamped: Checkpoint, quant: QuantConfig, dtype: str) -> tuple[Checkpoint, LoadPlan]:
    """Open every header and plan the rank; refuses a checkpoint that changed since it was fingerprinted."""
    checkpoint = with_headers(stamped)
    return checkpoint, plan_rank(checkpoint, cfg.layout, quant, dtype)


def _watch_plan(cfg: DaemonConfig, quant: QuantConfig, dtype: str) -> Plan:
    """The rank's read tasks planned from the checkpoint's headers as they are now: the watch
    needs them only to verify a rewritten shard, so a re-adopted daemon never plans otherwise."""

    def plan() -> tuple[list[ReadTask], dict[str, TensorInfo]]:
        checkpoint = open_checkpoint(cfg.model)
        return plan_rank(checkpoint, cfg.layout, quant, dtype).tasks, checkpoint.tensors

    return plan


def _remember_digests(cache: DigestCache, checkpoint: Checkpoint, plan: LoadPlan, digests: dict[str, str]) -> None:
    """Record the loaded shards' digests under their file identities (content.DigestCache)."""
    cache.put(
        {
            DigestCache.key(checkpoint.path / shard.name, shard, plan.tasks, checkpoint.tensors): digests[shard.name]
            for shard in checkpoint.shards
        }
    )


def _keeper_holds(keeper_path: Path, cfg: DaemonConfig, digest: str) -> bool:
    """Whether the keeper holds this rank's arena under this fingerprint (a look; nothing changes)."""
    try:
        with KeeperClient(keeper_path) as keeper:
            return any(
                (h.name, h.rank, h.fingerprint_digest) == (cfg.name, cfg.layout.rank, digest) for h in keeper.holdings()
            )
    except (CacheUnavailable, ProtocolError):
        return False


def arena_fd_backend(backend: str) -> bool:
    return backend in FD_BACKENDS


Rebadge = Callable[[Withdrawn], Manifest | None]
"""The withdrawn arena's manifest under this daemon's fingerprint when its bytes are what the
checkpoint holds now under other file stamps (``verified_rebadge``); None when they may not be."""


def adopt_from_keeper(
    keeper_path: Path, cfg: DaemonConfig, digest: str, fields: dict[str, Any], rebadge: Rebadge | None = None
) -> tuple[Arena, Manifest, float] | None:
    """Take the arena back from the keeper if it holds this fingerprint (or, with ``rebadge``, the
    same bytes under older shard stamps); release a stale one."""
    started = time.perf_counter()
    try:
        try:
            with KeeperClient(keeper_path) as keeper:
                got = keeper.withdraw(cfg.name, cfg.layout.rank, digest)
        except FingerprintMismatch as exc:
            # A refused request ends its connection (server.Reject): the rest goes over a new one.
            with KeeperClient(keeper_path) as keeper:
                got = _withdraw_rebadged(keeper, cfg, rebadge) if rebadge is not None else None
                if got is None:
                    log.info(
                        "keeper holds another fingerprint; releasing it",
                        extra={"fields": {**fields, "reason": str(exc)}},
                    )
                    keeper.release(cfg.name, cfg.layout.rank)
                    return None
    except CacheUnavailable:
        return None  # no keeper: load from disk
    if got is None:
        return None
    withdrawn, fd = got
    holding = withdrawn.holding
    own_gpu = gpu_facts(cfg.device).uuid if cfg.backend in GPU_BACKENDS else None
    if holding.device_uuid != own_gpu:
        # Same fingerprint, another GPU (the pod got a different device): this daemon's GPU is the
        # one the scheduler gave it, so the old arena goes and the weights load again.
        os.close(fd)
        log.info(
            "keeper's arena is on another GPU; releasing it",
            extra={"fields": {**fields, "held_on": holding.device_uuid, "own": own_gpu}},
        )
        with KeeperClient(keeper_path) as keeper:
            keeper.release(cfg.name, cfg.layout.rank)
        return None
    try:
        # No validate_bounds here: the daemon never reads through the manifest, and every engine
        # checks it before making a view (client.py); the check would cost this path numpy's import.
        manifest = withdrawn.manifest
        arena = adopt_arena(holding.backend, fd, manifest.arena_bytes, holding.mapping_bytes, holding.device_uuid)
    except BaseException:
        os.close(fd)
        raise
    seconds = time.perf_counter() - started
    log.info("re-adopted from the keeper", extra={"fields": {**fields, "seconds": f"{seconds:.3f}"}})
    return arena, manifest, seconds


def _withdraw_rebadged(keeper: KeeperClient, cfg: DaemonConfig, rebadge: Rebadge) -> tuple[Withdrawn, int] | None:
    """The keeper's arena of this rank, whatever its fingerprint, with its manifest re-badged;
    None (the fd closed) when ``rebadge`` refuses it."""
    held = next((h for h in keeper.holdings() if (h.name, h.rank) == (cfg.name, cfg.layout.rank)), None)
    got = keeper.withdraw(cfg.name, cfg.layout.rank, held.fingerprint_digest) if held is not None else None
    if got is None:
        return None
    withdrawn, fd = got
    try:
        manifest = rebadge(withdrawn)
    except BaseException:
        os.close(fd)
        raise
    if manifest is None:
        os.close(fd)
        return None
    return withdrawn.model_copy(update={"manifest": manifest}), fd


def verified_rebadge(
    fingerprint: Fingerprint,
    root: Path,
    tensors: dict[str, TensorInfo],
    tasks: list[ReadTask] | None,
    cache: DigestCache,
    fields: dict[str, Any],
) -> Rebadge:
    """Accept the keeper's arena for ``fingerprint`` when it was loaded for the same everything but
    some shards' file stamps, and each of those shards, as it is now, has the size, header and
    content digest the arena was loaded from: a shard rewritten with equal bytes (``cp``, rsync)
    while no daemon watched. The digest comes from the node's digest cache or a read: of the slices
    this rank reads (``tasks``, the reference loader's sliced digests) or of the whole file (a
    whole-file digest, the vLLM profile's; ``tasks`` may then be None) (content.py)."""

    def rebadge(withdrawn: Withdrawn) -> Manifest | None:
        old, manifest = withdrawn.fingerprint, withdrawn.manifest
        if old is None or not manifest.shard_digests or old.differences(fingerprint) != ["shards"]:
            return None
        if [s.name for s in old.shards] != [s.name for s in fingerprint.shards]:
            return None
        rewritten = [(was, now) for was, now in zip(old.shards, fingerprint.shards, strict=True) if was != now]
        verified = 0
        for was, now in rewritten:
            if (was.size, was.header_sha256) != (now.size, now.header_sha256):
                return None
            loaded = manifest.shard_digests.get(now.name)
            whole = is_whole_file(loaded)
            if loaded is None or (tasks is None and not whole):
                return None
            shard = ShardFile(**now.model_dump())
            digest, read = current_digest(root / now.name, shard, tensors, None if whole else tasks, cache)
            verified += read
            if digest is None or digest != loaded:
                return None
        log.info(
            "the keeper's arena holds the checkpoint's bytes under older file stamps; re-adopting it under the new ones",
            extra={
                "fields": {**fields, "files": ",".join(now.name for _, now in rewritten), "verified_bytes": verified}
            },
        )
        return manifest.model_copy(update={"fingerprint_digest": fingerprint.digest})

    return rebadge


class KeeperLink:
    """Keeps this daemon's arena deposited with the keeper, re-depositing whenever the keeper restarts.

    A thread holds one connection open and blocks on it; the keeper never speaks first, so the
    read returns only when the keeper goes away — then it reconnects and deposits again.
    """

    RETRY_S = 0.5

    def __init__(self, path: Path, served: Served) -> None:
        self.path = path
        self.served = served
        self._stop = threading.Event()
        self._client: KeeperClient | None = None
        self._thread = threading.Thread(target=self._run, name="keeper-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def redeposit(self) -> None:
        """Deposit again (the served identity changed): dropping the connection makes the thread
        reconnect and deposit what is served now, which replaces the keeper's holding."""
        if self._client is not None:
            try:
                self._client.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._client is not None:
            try:
                self._client.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)

    def _run(self) -> None:
        s = self.served
        while not self._stop.is_set():
            try:
                with KeeperClient(self.path) as client:
                    self._client = client
                    fingerprint, manifest = s.identity()
                    export = s.arena.export()
                    assert export.fd is not None  # a keeper holds fd backends' arenas only (arena_fd_backend)
                    try:
                        client.deposit(
                            Deposit(
                                name=s.name,
                                rank=s.rank,
                                fingerprint_digest=fingerprint.digest,
                                backend=s.arena.backend,
                                mapping_bytes=s.arena.mapping_bytes,
                                device_uuid=s.arena.device_uuid,
                                manifest=manifest,
                                fingerprint=fingerprint,
                            ),
                            export.fd,
                        )
                    finally:
                        if export.fd is not None:
                            os.close(export.fd)
                    s.deposited = True
                    log.info("deposited with the keeper", extra={"fields": {"cache": s.name, "rank": s.rank}})
                    client.sock.settimeout(None)
                    while client.sock.recv(1):  # returns b"" when the keeper goes away
                        pass
            except (CacheUnavailable, ProtocolError, OSError):
                pass
            s.deposited = False
            self._stop.wait(self.RETRY_S)
