"""The engine side: connect to a rank's daemon, check the fingerprint, map the arena read-only.

``load_weights`` is what an engine calls. It computes the fingerprint it expects from its own
arguments, asks the daemon what it holds, and maps the arena only if the two agree. Otherwise
(or with no daemon at all) the policy decides: ``fallback="disk"`` loads the same tensors from
disk with the daemon's own loader and says why; ``fallback="error"`` raises. The mapping stays
valid if the daemon dies: the engine holds its own reference to the memory.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.daemon_report import CheckpointWatch
from weightcache_contract.errors import (
    CacheUnavailable,
    DaemonBusy,
    FingerprintMismatch,
    ProtocolError,
    WeightCacheError,
)

from ..arenas.arena import Access, MappedArena, map_arena
from ..checkpoints.checkpoint import Checkpoint, open_checkpoint, with_headers
from ..checkpoints.loader import load_to_memory
from ..checkpoints.manifest import Manifest, tensor_views
from ..checkpoints.pipeline import plan_rank, resolve_dtype
from ..checkpoints.quantization import QuantConfig, resolve
from ..checkpoints.sharding import Layout
from ..gpu.gpu_identity import gpu_count
from ..wire.fingerprint import Fingerprint, compute, mismatch_fix
from ..wire.protocol import (
    MAX_REPLY_BYTES,
    REPLY,
    SUPPORTED_VERSIONS,
    ConfigReply,
    ErrorReply,
    Fetch,
    FetchReply,
    Hello,
    HelloReply,
    Ping,
    Pong,
    QueryConfig,
    Status,
    StatusReply,
    decode,
    recv_frame,
    send_frame,
)
from ..wire.rankfiles import RankFiles

if TYPE_CHECKING:  # the connection and protocol parts serve the torch-free daemon and keeper too
    import torch

Fallback = Literal["disk", "error"]
log = logging.getLogger("weightcache.client")

# How often an engine asks a daemon that is verifying rewritten checkpoint files for its verdict.
_VERDICT_POLL_S = 0.1
# What a verification's duration is estimated at before the daemon has read a byte: a disk's pace
# (the daemon re-reads at disk speed with one buffer, content.py), to be replaced by its own pace.
_ASSUMED_READ_BYTES_PER_S = 1e9


# Pauses between attempts on a busy daemon: short at first (slots free as other clients finish, in
# milliseconds), doubling to a second, jittered so that clients refused together do not return together.
_BUSY_FIRST_PAUSE_S = 0.02
_BUSY_MAX_PAUSE_S = 1.0


ReplyT = TypeVar("ReplyT")


class DaemonConnection:
    """One connection to one rank's daemon. Use as a context manager.

    A daemon whose connection slots are taken (``DaemonBusy``) is asked again, with backoff, until
    ``timeout_s`` has passed since the first attempt; then its own busy text is raised. With
    ``retry_busy=False`` the first refusal is raised at once (a caller with its own retry policy)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        timeout_s: float = 10.0,
        client: str = "weightcache-client",
        retry_busy: bool = True,
    ) -> None:
        self.path = str(path)
        deadline = time.monotonic() + timeout_s
        pause = _BUSY_FIRST_PAUSE_S
        while True:
            self._sock = self._connect(max(deadline - time.monotonic(), 0.05))
            try:
                hello = Hello(versions=list(SUPPORTED_VERSIONS), client=client)
                self.hello_reply: HelloReply = self.request(hello, HelloReply)
                return
            except DaemonBusy as exc:
                self._sock.close()
                left = deadline - time.monotonic()
                if not retry_busy:
                    raise
                if left <= 0:
                    raise DaemonBusy(
                        f"{exc} (still busy after {timeout_s:.1f} s of retries; give the client a longer timeout, "
                        "or find what holds the daemon's connections: it logs each refusal with the peer's pid)"
                    ) from None
                time.sleep(min(pause * random.uniform(0.5, 1.0), left))
                pause = min(pause * 2, _BUSY_MAX_PAUSE_S)
            except BaseException:
                self._sock.close()
                raise

    def _connect(self, timeout_s: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise CacheUnavailable(f"no daemon listens on {self.path} ({exc.strerror})") from None
        except OSError as exc:
            sock.close()
            raise CacheUnavailable(f"cannot connect to {self.path}: {exc}") from None
        return sock

    def __enter__(self) -> DaemonConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def query_config(self) -> ConfigReply:
        return self.request(QueryConfig(), ConfigReply)

    def status(self) -> StatusReply:
        return self.request(Status(), StatusReply)

    def ping(self) -> Pong:
        return self.request(Ping(), Pong)

    def fetch(self, digest: str) -> tuple[FetchReply, int | None]:
        """The manifest and, for fd backends, the arena fd (the caller closes it)."""
        fds: list[int] = []
        reply = self.request(Fetch(fingerprint_digest=digest), FetchReply, fds)
        expected = 0 if reply.ipc is not None else 1
        if len(fds) != expected:
            for fd in fds:
                os.close(fd)
            raise ProtocolError(f"fetch reply carried {len(fds)} file descriptors, expected {expected}")
        return reply, (fds[0] if fds else None)

    def request(
        self, message: Any, expect: type[ReplyT], fds: list[int] | None = None, send_fds: list[int] | None = None
    ) -> ReplyT:
        """Send one request (with fds attached, if any), return the reply; errors become exceptions."""
        sent: OSError | None = None
        try:
            send_frame(self._sock, message, send_fds)
        except TimeoutError as exc:  # alive but not reading: no answer is coming
            raise CacheUnavailable(f"daemon at {self.path} stopped answering: {exc}") from None
        except OSError as exc:
            # A daemon refusing a connection (busy, forbidden) writes its reason and closes before it
            # reads a byte, so the send can fail with a broken pipe or a reset while the reason waits
            # in this socket's receive buffer: the reason is what the caller needs to see. A closed
            # peer's end of stream follows at once, so this read does not wait.
            sent = exc
        try:
            reply = decode(REPLY, recv_frame(self._sock, MAX_REPLY_BYTES, fds))
        except (OSError, ProtocolError) as exc:
            if sent is None and not isinstance(exc, OSError):
                raise
            raise CacheUnavailable(f"daemon at {self.path} stopped answering: {sent or exc}") from None
        if isinstance(reply, ErrorReply):
            if reply.code == "busy":
                raise DaemonBusy(f"daemon at {self.path} is busy: {reply.message}")
            if reply.code == "fingerprint_mismatch":
                raise FingerprintMismatch(reply.message, reply.fields)
            raise ProtocolError(f"daemon refused {message.type}: [{reply.code}] {reply.message}")
        if not isinstance(reply, expect):
            raise ProtocolError(f"daemon answered {message.type} with {reply.type}")
        return reply


@dataclass
class Expected:
    """What an engine expects a rank's cache to hold, derived from its own arguments."""

    checkpoint: Checkpoint
    layout: Layout
    quant: QuantConfig
    dtype: str
    fingerprint: Fingerprint
    backend: str = "cpu-shm"
    device: int = 0
    access: Access = "read-only"


def expect(
    model: str,
    layout: Layout,
    *,
    dtype: str = "auto",
    quantization: str = "none",
    weight_block_size: tuple[int, int] | None = None,
    revision: str = "",
    backend: str = "cpu-shm",
    device: int = 0,
    access: Access = "read-only",
) -> Expected:
    """What this engine expects to map; ``device`` is the engine's own GPU ordinal (GPU backends)."""
    resolve(quantization, None, weight_block_size)  # allowlist first: before any file or socket I/O
    if backend in GPU_BACKENDS and not gpu_count():
        raise CacheUnavailable(
            f"backend {backend} needs a GPU but this process sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
        )
    # Stamps only: the fingerprint needs no tensor headers, and parsing 100,000 of them would cost an
    # engine seconds on every start; the disk fallback opens them (load_from_disk).
    checkpoint = open_checkpoint(model, stamps_only=True)
    quant = resolve(quantization, checkpoint.quantization_config, weight_block_size)
    resolved = resolve_dtype(dtype, checkpoint)
    fp = compute(checkpoint, layout, quant, resolved, revision=revision, backend=backend, device=device, access=access)
    return Expected(checkpoint, layout, quant, resolved, fp, backend, device, access)


@dataclass
class Weights:
    """Name → tensor for one rank, and how they were obtained.

    From the cache, ``tensors`` is a ``TensorIndex``: every name, shape and dtype is known at once
    and each view is made on its first lookup; from the disk, a plain dict of views.
    """

    tensors: Mapping[str, torch.Tensor]
    aliases: dict[str, str]
    mode: Literal["cache", "disk"]
    fingerprint: Fingerprint
    seconds: float
    bytes_mapped: int = 0
    bytes_loaded: int = 0
    fallback_reason: str | None = None
    device_uuid: str | None = None  # the GPU the mapped bytes live on (GPU backends)
    arena: MappedArena | None = field(default=None, repr=False)  # keeps the mapping alive
    manifest: Manifest | None = field(default=None, repr=False)  # mapped weights: each tensor's kind and offset

    def report(self) -> dict[str, Any]:
        """Per-rank weight report; ``bytes_mapped`` is memory the engine must not count as its own free memory."""
        return {
            "mode": self.mode,
            "fallback_reason": self.fallback_reason,
            "bytes_mapped": self.bytes_mapped,
            "bytes_loaded": self.bytes_loaded,
            "seconds": round(self.seconds, 6),
            "tensors": len(self.tensors),
            "device_uuid": self.device_uuid,
        }


def map_weights(expected: Expected, socket_dir: str, name: str, timeout_s: float = 10.0) -> Weights:
    """Map a rank's arena from its daemon; raises CacheUnavailable or FingerprintMismatch."""
    return map_fingerprint(
        expected.fingerprint,
        expected.layout.rank,
        socket_dir,
        name,
        backend=expected.backend,
        access=expected.access,
        timeout_s=timeout_s,
    )


def map_fingerprint(
    want: Fingerprint,
    rank: int,
    socket_dir: str,
    name: str,
    *,
    backend: str = "cpu-shm",
    access: Access = "read-only",
    timeout_s: float = 10.0,
    gpu_uuid: str | None = None,
) -> Weights:
    """Map rank ``rank``'s arena if its daemon holds exactly ``want``, whatever the load profile
    (the vLLM loader computes its fingerprint from vLLM's config, not from an ``Expected``).
    ``gpu_uuid``: the GPU the engine computes on; an arena on another GPU is refused before mapping."""
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    files = RankFiles(socket_dir, name, rank)
    with DaemonConnection(files.socket, timeout_s) as conn:
        held = await_verdict(conn, want, name, rank, deadline, timeout_s)
        if gpu_uuid is not None and held.device_uuid != gpu_uuid:
            raise CacheUnavailable(
                f"daemon for cache {name!r} rank {rank} holds its arena on GPU {held.device_uuid}, this engine "
                f"computes on {gpu_uuid}; give the engine the daemon's GPU for this rank"
            )
        reply, fd = conn.fetch(want.digest)
    try:
        manifest: Manifest = reply.manifest
        if manifest.fingerprint_digest != want.digest or reply.backend != backend:
            raise FingerprintMismatch("the fetched manifest belongs to another fingerprint", ["digest"])
        manifest.validate_bounds()
        if reply.mapping_bytes < manifest.arena_bytes:
            raise ProtocolError(
                f"mapping of {reply.mapping_bytes} bytes cannot hold a {manifest.arena_bytes}-byte arena"
            )
        arena = map_arena(
            reply.backend, manifest.arena_bytes, reply.mapping_bytes, fd, reply.ipc, reply.device_uuid, access
        )
    finally:
        if fd is not None:
            os.close(fd)  # the mapping holds its own reference to the memory
    tensors = manifest.index(arena.buffer)  # views are made as the engine looks them up
    return Weights(
        tensors=tensors,
        aliases=dict(manifest.aliases),
        mode="cache",
        fingerprint=want,
        seconds=time.perf_counter() - started,
        bytes_mapped=reply.mapping_bytes,
        device_uuid=reply.device_uuid,
        arena=arena,
        manifest=manifest,
    )


def held_bytes(want: Fingerprint, rank: int, socket_dir: str, name: str, *, timeout_s: float = 10.0) -> int:
    """Bytes rank ``rank``'s daemon has allocated for exactly ``want`` (what an engine mapping it
    must not count as its own memory); 0 when no daemon answers or it holds other weights. A daemon
    verifying rewritten checkpoint files is waited for as ``map_fingerprint`` waits for it, so the
    two agree on whether the engine maps."""
    deadline = time.monotonic() + timeout_s
    try:
        with DaemonConnection(RankFiles(socket_dir, name, rank).socket, timeout_s) as conn:
            await_verdict(conn, want, name, rank, deadline, timeout_s)
            status = conn.status()
    except (CacheUnavailable, FingerprintMismatch, ProtocolError):
        return 0
    return status.arena_bytes if status.fingerprint_digest == want.digest else 0


def await_verdict(
    conn: DaemonConnection, want: Fingerprint, name: str, rank: int, deadline: float, timeout_s: float
) -> ConfigReply:
    """What the daemon holds, once it holds ``want``; raises FingerprintMismatch when it does not.

    A checkpoint file rewritten with the same size and header (``cp`` over it, rsync, a re-sync) has
    new stamps before the daemon's checkpoint watch has re-read it (daemon/watch.py): until then the
    daemon serves the old stamps, and telling the engine to restart the daemon would be wrong when
    the bytes are equal, as they usually are. So while the watch has not ruled (``verifying``, or
    ``unchanged`` before its next look) the engine asks again until ``deadline``: it maps the arena
    once the daemon adopts the new stamps, gets the restart advice once the watch finds the bytes
    changed, and at the deadline is told what the daemon is doing and how long that takes."""
    held = conn.query_config()
    if _holds(held, want):
        return held
    rewritten = rewritten_only(want, held.fingerprint)
    if rewritten is None:
        raise _mismatch(want, held, name, rank)
    announced = False
    while True:
        watch = conn.status().checkpoint
        held = conn.query_config()
        if _holds(held, want):
            return held
        if rewritten_only(want, held.fingerprint) is None or watch is None or watch.state == "changed":
            raise _mismatch(want, held, name, rank, watch)  # no watch, or its verdict: the bytes changed
        left = deadline - time.monotonic()
        if left <= 0:
            raise FingerprintMismatch(
                verifying_message(name, rank, rewritten, want, watch, timeout_s),
                want.differences(held.fingerprint) or ["digest"],
            )
        if not announced:
            announced = True
            log.info(
                "daemon for cache %r rank %d has not yet verified the rewritten checkpoint file(s) %s; "
                "waiting for its verdict (up to %.1f s)",
                name,
                rank,
                ", ".join(rewritten),
                left,
            )
        time.sleep(min(_VERDICT_POLL_S, left))


def _holds(held: ConfigReply, want: Fingerprint) -> bool:
    return held.fingerprint.digest == want.digest and held.fingerprint_digest == want.digest


def _mismatch(
    want: Fingerprint, held: ConfigReply, name: str, rank: int, watch: CheckpointWatch | None = None
) -> FingerprintMismatch:
    fields = want.differences(held.fingerprint) or ["digest"]
    found = (
        f"; its checkpoint watch re-read {', '.join(watch.changed_files)} and found them changed"
        if watch is not None and watch.state == "changed" and watch.changed_files
        else ""
    )
    return FingerprintMismatch(
        f"daemon for cache {name!r} rank {rank} holds different weights (differs in: {', '.join(fields)}{found}); "
        f"{mismatch_fix(fields)}",
        fields,
    )


def rewritten_only(want: Fingerprint, held: Fingerprint) -> list[str] | None:
    """The shards whose file identity alone (inode, ctime, mtime) differs between ``want`` and
    ``held``, which the daemon's checkpoint watch re-reads and may adopt; None when anything else
    differs (config, a shard's size or header, any argument): no re-read can reconcile those."""
    if want.differences(held) != ["shards"] or [s.name for s in want.shards] != [s.name for s in held.shards]:
        return None
    names = []
    for ours, theirs in zip(want.shards, held.shards, strict=True):
        if ours == theirs:
            continue
        if (ours.size, ours.header_sha256) != (theirs.size, theirs.header_sha256):
            return None
        names.append(ours.name)
    return names


def verifying_message(
    name: str, rank: int, rewritten: list[str], want: Fingerprint, watch: CheckpointWatch, timeout_s: float
) -> str:
    """What an engine that stopped waiting for the daemon's verdict says: what the daemon is doing,
    and about how long it takes, from the bytes it re-reads (and, once it reads, from its pace)."""
    files = ", ".join(rewritten)
    left: float | None = None
    if watch.state != "verifying":
        doing = "it has not looked at them since (it looks every --checkpoint-poll-seconds)"
    elif watch.verify_bytes is None:
        upper = sum(s.size for s in want.shards if s.name in rewritten)
        doing = (
            f"it waits for them to stop changing (two looks in a row must agree), then re-reads up to "
            f"{_size(upper)} of them, {_about(upper / _ASSUMED_READ_BYTES_PER_S)} at 1 GB/s"
        )
    elif watch.verified_bytes and watch.verify_seconds:
        left = (watch.verify_bytes - watch.verified_bytes) * watch.verify_seconds / watch.verified_bytes
        doing = (
            f"it has re-read {_size(watch.verified_bytes)} of {_size(watch.verify_bytes)} in "
            f"{watch.verify_seconds:.1f} s, {_about(left)} left"
        )
    else:
        left = watch.verify_bytes / _ASSUMED_READ_BYTES_PER_S
        doing = f"it re-reads {_size(watch.verify_bytes)} of them, {_about(left)} at 1 GB/s"
    when = f"in {_about(left)}" if left is not None else "in a few seconds"
    return (
        f"daemon for cache {name!r} rank {rank} is verifying the rewritten checkpoint file(s) {files} "
        f"(differs in: shards: new file identity, same size and header): {doing}. It serves them under "
        "their new stamps once their bytes prove equal, and `weightcache status` reports them changed if not; "
        f"this engine stopped waiting for that verdict after its timeout of {timeout_s:g} s: start it again "
        f"{when}, or give it a longer timeout (timeout_s) to wait for the verdict"
    )


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _about(seconds: float) -> str:
    return "under a second" if seconds < 1 else f"about {seconds:.0f} s"


def load_from_disk(expected: Expected, reason: str | None = None) -> Weights:
    """The same tensors, read and post-processed by this process, onto the engine's own device."""
    started = time.perf_counter()
    checkpoint = with_headers(expected.checkpoint)
    plan = plan_rank(checkpoint, expected.layout, expected.quant, expected.dtype)
    device = f"cuda:{expected.device}" if expected.backend in GPU_BACKENDS else "cpu"
    buffer, entries = load_to_memory(checkpoint, plan, expected.quant.weight_block_size, device=device)
    checkpoint.close()
    return Weights(
        tensors=tensor_views(buffer, entries),
        aliases=dict(plan.aliases),
        mode="disk",
        fingerprint=expected.fingerprint,
        seconds=time.perf_counter() - started,
        bytes_loaded=plan.read_bytes,
        fallback_reason=reason,
    )


def load_weights(
    model: str,
    layout: Layout,
    *,
    socket_dir: str | None,
    name: str | None,
    fallback: Fallback = "disk",
    dtype: str = "auto",
    quantization: str = "none",
    weight_block_size: tuple[int, int] | None = None,
    revision: str = "",
    backend: str = "cpu-shm",
    device: int = 0,
    access: Access = "read-only",
    timeout_s: float = 10.0,
) -> Weights:
    """Weights for one rank: mapped from the cache when it holds exactly these, else per ``fallback``."""
    if fallback not in ("disk", "error"):
        raise WeightCacheError(f"fallback must be 'disk' or 'error', got {fallback!r}")
    expected = expect(
        model,
        layout,
        dtype=dtype,
        quantization=quantization,
        weight_block_size=weight_block_size,
        revision=revision,
        backend=backend,
        device=device,
        access=access,
    )
    if socket_dir is None or name is None:
        return load_from_disk(expected, "no cache configured")
    try:
        return map_weights(expected, socket_dir, name, timeout_s)
    except (CacheUnavailable, FingerprintMismatch, ProtocolError) as exc:
        if fallback == "error":
            raise
        return load_from_disk(expected, f"{type(exc).__name__}: {exc}")
