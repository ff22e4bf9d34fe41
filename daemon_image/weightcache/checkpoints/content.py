"""Content identity of a checkpoint's shards, as far as one rank's arena depends on them.

A shard's stat stamp (fingerprint.py) changes whenever its file is written or replaced, even with
the same bytes (``cp``, rsync, a re-sync from object storage). To tell such a rewrite from a real
change the daemon keeps a content digest per shard, taken while it reads the shard anyway.

What a digest covers: the bytes this rank reads of the shard, nothing else. A rank of a
tensor-parallel layout reads only its slices, and hashing the rest would be a second read of
every shard on every node. Each ``ReadTask`` of the plan is hashed over the C-contiguous bytes of
its source slice as stored in the file (before any cast or quantization): the loader hashes them
as it reads them, whichever way it reads (a ``pread`` straight into the arena, a staging buffer, or
safetensors' ``get_slice``), and ``digest_shard`` reads exactly those slices again to verify a
rewritten file. A shard's digest is SHA-256 over its tasks' keys and digests, so it is the same
however the loader split, ordered or threaded its reads. Equal digests mean the arena holds what
the file holds now; bytes of the shard the rank does not read may differ, and do not matter to it.
A shard the rank reads nothing of has the digest of no tasks: only its stamp's size and header
are compared. The header itself is in the stamp (``header_sha256``).

Whole-file digests: an arena another loader filled (the vLLM profile: vLLM's loader reads every
shard whole, and which bytes end up in which entry is vLLM's business) is described by SHA-256 over
each shard's whole file, written ``sha256-file:<hex>`` (``WHOLE_FILE``) so that it cannot be taken
for a sliced digest (``sha256:<hex>``): ``tasks=None`` asks ``digest_shard`` and
``current_digest`` for this kind, and ``is_whole_file`` tells which kind a recorded digest is.

SHA-256 because it is the fastest hash in ``hashlib`` here (OpenSSL uses the CPU's SHA
instructions; ``benchmarks/digest.py`` measures it against BLAKE2b) and needs no dependency.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from weightcache_contract.errors import CheckpointError

from .checkpoint import Checkpoint, ShardFile, TensorInfo
from .dtypes import itemsize
from .read_tasks import ReadTask

HASH = "sha256"
WHOLE_FILE = f"{HASH}-file"
"""Prefix of a whole-file digest (``tasks=None``); a sliced one starts with ``HASH + ":"``."""
CHUNK_BYTES = 16 * 2**20
"""What ``digest_shard`` reads at a time: a verification holds one such buffer, never a shard."""


def new_hash() -> hashlib._Hash:
    return hashlib.new(HASH)


def task_key(task: ReadTask) -> str:
    """A task's identity in a shard digest: its source slice and the entries it fills."""
    return f"{task.source}|{task.dim}|{task.start}|{task.stop}|{','.join(task.outputs)}"


def is_whole_file(digest: str | None) -> bool:
    return digest is not None and digest.startswith(WHOLE_FILE + ":")


def combine(entries: Iterable[tuple[str, str]]) -> str:
    """A shard's digest from its tasks' (key, digest) pairs, in any order."""
    h = hashlib.sha256()
    for key, digest in sorted(entries):
        h.update(f"{key}={digest}\n".encode())
    return f"{HASH}:{h.hexdigest()}"


class ReadDigests:
    """Digests of the task slices the loader read, collected from its threads."""

    def __init__(self) -> None:
        self._digests: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, task: ReadTask, digest: str) -> None:
        with self._lock:
            self._digests[task_key(task)] = digest

    def by_shard(self, checkpoint: Checkpoint, tasks: list[ReadTask]) -> dict[str, str]:
        """Every shard's digest (shards this rank reads nothing of included); refuses a plan that
        was not read in full, whose digests would say nothing."""
        per_file: dict[str, list[tuple[str, str]]] = {shard.name: [] for shard in checkpoint.shards}
        with self._lock:
            for task in tasks:
                key = task_key(task)
                if key not in self._digests:
                    raise CheckpointError(f"the loader read no digest for {key}; the plan was not read in full")
                per_file[checkpoint.tensors[task.source].file].append((key, self._digests[key]))
        return {name: combine(entries) for name, entries in per_file.items()}


def slice_layout(info: TensorInfo, task: ReadTask) -> tuple[int, int, int, int]:
    """(rows, row_bytes, skip, take): the task's slice is ``take`` bytes at ``skip`` into each of
    ``rows`` rows of ``row_bytes`` starting at the tensor's first byte. A slice along dim ``d``
    is contiguous per index of the dims before it."""
    size = itemsize(info.dtype)
    if task.dim is None or not info.shape:
        return 1, size * math.prod(info.shape), 0, size * math.prod(info.shape)
    d = task.dim
    outer = math.prod(info.shape[:d])
    inner = size * math.prod(info.shape[d + 1 :])
    return outer, info.shape[d] * inner, task.start * inner, (task.stop - task.start) * inner


def _slice_chunks(fd: int, info: TensorInfo, task: ReadTask, buffer: bytearray) -> Iterator[memoryview]:
    """The task's slice bytes in file order, read ``len(buffer)`` bytes (or one row) at a time."""
    rows, row_bytes, skip, take = slice_layout(info, task)
    view = memoryview(buffer)
    if rows == 1 or take == row_bytes:  # contiguous (rows of dim 0, or a whole tensor): just the slice
        yield from _pread_chunks(fd, info.data_start + skip, rows * take, view)
        return
    per_read = max(1, len(buffer) // row_bytes)  # whole rows at a time; one row may exceed the buffer
    for first in range(0, rows, per_read):
        count = min(per_read, rows - first)
        if count * row_bytes > len(view):
            view = memoryview(bytearray(count * row_bytes))
        for chunk in _pread_chunks(fd, info.data_start + first * row_bytes, count * row_bytes, view):
            for r in range(count):
                yield chunk[r * row_bytes + skip : r * row_bytes + skip + take]


def _pread_chunks(fd: int, offset: int, length: int, view: memoryview) -> Iterator[memoryview]:
    """``length`` bytes at ``offset`` as chunks of at most ``len(view)`` bytes (or all of them
    in one when the caller sized ``view`` for whole rows)."""
    done = 0
    while done < length:
        want = min(len(view), length - done)
        if done + want < length:  # the kernel reads the next chunk while the caller hashes this one
            os.posix_fadvise(fd, offset + done + want, min(len(view), length - done - want), os.POSIX_FADV_WILLNEED)
        got = 0
        while got < want:
            n = os.preadv(fd, [view[got:want]], offset + done + got)
            if n == 0:
                raise CheckpointError(f"shard ended at byte {offset + done + got}; it was truncated")
            got += n
        yield view[:want]
        done += want


def digest_shard(
    path: Path,
    stamp: ShardFile,
    tensors: dict[str, TensorInfo],
    tasks: list[ReadTask] | None,
    stop: Callable[[], bool] = lambda: False,
    progress: Callable[[int], None] = lambda _n: None,
) -> str | None:
    """The shard's digest read from ``path``, which must still be the file ``stamp`` describes
    before and after the read (else None: it changed meanwhile, and the digest would describe
    neither version). ``tasks``: the rank's plan; those whose source is in this shard are read.
    ``tasks=None``: the whole file, as one slice from its first byte to its last (``WHOLE_FILE``).
    None too when ``stop()`` turns true between tasks (between chunks of a whole file).
    ``progress(n)``: ``n`` more bytes were read, after each task (each chunk of a whole file)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if not _is(os.fstat(fd), stamp):
            return None
        buffer = bytearray(CHUNK_BYTES)
        if tasks is None:
            h = new_hash()
            for chunk in _pread_chunks(fd, 0, stamp.size, memoryview(buffer)):
                if stop():
                    return None
                h.update(chunk)
                progress(len(chunk))
            digest = f"{WHOLE_FILE}:{h.hexdigest()}"
        else:
            entries = []
            mine = [t for t in tasks if tensors[t.source].file == stamp.name]
            for task in sorted(mine, key=lambda t: (tensors[t.source].data_start, task_key(t))):
                if stop():
                    return None
                h = new_hash()
                for chunk in _slice_chunks(fd, tensors[task.source], task, buffer):
                    h.update(chunk)
                entries.append((task_key(task), h.hexdigest()))
                progress(task.read_bytes)
            digest = combine(entries)
        # A write during the read sets the ctime; a replaced path names another inode.
        if not (_is(os.fstat(fd), stamp) and _is(os.stat(path), stamp)):
            return None
        return digest
    finally:
        os.close(fd)


def current_digest(
    path: Path,
    stamp: ShardFile,
    tensors: dict[str, TensorInfo],
    tasks: list[ReadTask] | None,
    cache: DigestCache | None,
    stop: Callable[[], bool] = lambda: False,
    progress: Callable[[int], None] = lambda _n: None,
) -> tuple[str | None, int]:
    """The digest of the file ``stamp`` describes, from the node's digest cache or else read (and
    then cached); with the bytes read for it (0 from the cache). None: it changed meanwhile.
    ``tasks=None``: the whole file's digest (``WHOLE_FILE``)."""
    key = DigestCache.key(path, stamp, tasks, tensors) if cache is not None else None
    if cache is not None and key is not None and (known := cache.get(key)) is not None:
        return known, 0
    digest = digest_shard(path, stamp, tensors, tasks, stop, progress)
    if digest is not None and cache is not None and key is not None:
        cache.put({key: digest})
    if digest is None:
        return None, 0
    if tasks is None:
        return digest, stamp.size
    return digest, sum(t.read_bytes for t in tasks if tensors[t.source].file == stamp.name)


def _is(st: os.stat_result, stamp: ShardFile) -> bool:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (
        stamp.inode,
        stamp.size,
        stamp.mtime_ns,
        stamp.ctime_ns,
    )


class DigestCache:
    """Shard digests already computed on this node, keyed by the file's stat identity (device,
    inode, size, mtime, ctime) and the set of slices hashed: a JSON file in the socket directory,
    shared by the node's daemons, replaced atomically under an ``flock``. A daemon that meets a
    file identity some daemon already hashed takes the digest from here instead of reading again."""

    FILE = "checkpoint-digests.json"
    MAX_ENTRIES = 512

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / self.FILE
        self._lock_path = Path(directory) / (self.FILE + ".lock")

    @staticmethod
    def key(path: Path, stamp: ShardFile, tasks: list[ReadTask] | None, tensors: dict[str, TensorInfo]) -> str:
        """``tasks=None`` (the whole file) has its own read set, ``WHOLE_FILE``: no slice list hashes to it."""
        readset = (
            WHOLE_FILE
            if tasks is None
            else hashlib.sha256(
                "\n".join(sorted(task_key(t) for t in tasks if tensors[t.source].file == stamp.name)).encode()
            ).hexdigest()[:32]
        )
        device = os.stat(path).st_dev  # of the file itself: a symlinked shard may live on another
        return f"{device}:{stamp.inode}:{stamp.size}:{stamp.mtime_ns}:{stamp.ctime_ns}:{readset}"

    def get(self, key: str) -> str | None:
        try:
            entries = json.loads(self.path.read_text())
            return str(entries[key]["digest"]) if isinstance(entries, dict) and key in entries else None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # no cache (or a damaged one) only costs a read

    def put(self, items: dict[str, str]) -> None:
        """Record key → digest; errors are ignored (the cache only ever saves a read)."""
        import fcntl
        import time

        try:
            with open(self._lock_path, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    entries = json.loads(self.path.read_text())
                    if not isinstance(entries, dict):
                        entries = {}
                except (OSError, ValueError):
                    entries = {}
                now = time.time()
                for key, digest in items.items():
                    entries[key] = {"digest": digest, "at": now}
                newest = sorted(entries.items(), key=lambda kv: kv[1].get("at", 0), reverse=True)
                tmp = self.path.with_name(f".{self.FILE}.{os.getpid()}")
                tmp.write_text(json.dumps(dict(newest[: self.MAX_ENTRIES])))
                os.replace(tmp, self.path)
        except OSError:
            pass
