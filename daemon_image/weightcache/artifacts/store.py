"""The per-node artifact directory: published entries, engines' staging, eviction.

```
<root>/entries/<digest>/            published, complete, never modified: meta.json + data/
<root>/staging/<name>/              one engine's own: data/ (its VLLM_CACHE_ROOT), claim.json,
                                    READY (it served), alive.lock (flock'ed while it runs)
<root>/incoming/, <root>/trash/     the publisher's: a copy being built, entries being removed
```

Who writes what: an engine writes only its staging directory; ``entries/`` is mounted read-only
into engine pods, and only the publisher (the daemon, which owns the root) adds to it. So a
buggy or malicious engine can spoil at most what it stages, which the publisher copies file by
file — regular files and directories only, never a symlink, a device or a file beyond the size
bound — and publishes under the key the engine claimed.

Atomicity: an entry appears by one ``rename(2)`` of a complete directory, so a half-written entry
is never visible, and a rename onto an existing entry fails, so two racing publishers of one key
leave exactly one entry. Removal renames an entry into ``trash/`` first, for the same reason.

In use: an engine copying an entry out (``checkout``) holds a shared ``flock`` on the entry's
directory; eviction takes it exclusively without waiting and skips the entry when it cannot.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from weightcache_contract.errors import WeightCacheError

from .key import DIGEST, ArtifactKey, Claim, EntryMeta

STAGING_NAME = re.compile(r"[0-9a-f]{16}")
MAX_JSON_BYTES = 64 << 10
"""claim.json and meta.json are a few hundred bytes; anything near this is not one."""


class ArtifactError(WeightCacheError):
    """A staging directory or an entry that cannot be used as it is."""


@dataclass(frozen=True)
class Entry:
    digest: str
    bytes: int
    last_used: float
    """The entry directory's mtime: set at publication and at every hit the publisher records."""


def eviction_order(entries: list[Entry], max_bytes: int, in_use: frozenset[str] = frozenset()) -> list[str]:
    """The entries to remove, least recently used first, until the rest fit in ``max_bytes``;
    entries in use are kept whatever their age (the rest may then stay above the bound)."""
    total = sum(e.bytes for e in entries)
    victims: list[str] = []
    for entry in sorted(entries, key=lambda e: (e.last_used, e.digest)):
        if total <= max_bytes:
            break
        if entry.digest in in_use:
            continue
        victims.append(entry.digest)
        total -= entry.bytes
    return victims


def read_json_file(path: Path) -> bytes:
    """A small regular file's bytes, never through a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArtifactError(f"{path} is not a regular file")
        data = os.read(fd, MAX_JSON_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_JSON_BYTES:
        raise ArtifactError(f"{path} is larger than {MAX_JSON_BYTES} bytes")
    return data


def write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(partial, path)


def copy_tree(src: Path, dest: Path, max_bytes: int | None = None) -> tuple[int, int]:
    """Copies the regular files and directories under ``src`` into ``dest`` (merged), refusing
    anything else: a symlink could point out of the root (at another engine's files or the
    node's), a device or FIFO is no artifact. Modes are the publisher's own (0644/0755), so no
    set-id or world-writable bit survives. Returns (bytes, files); refuses beyond ``max_bytes``."""
    total = files = 0
    dest.mkdir(mode=0o755, exist_ok=True)
    stack = [(src, dest)]
    while stack:
        here, there = stack.pop()
        with os.scandir(here) as it:
            for item in it:
                target = there / item.name
                st = item.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    target.mkdir(mode=0o755, exist_ok=True)
                    stack.append((Path(item.path), target))
                elif stat.S_ISREG(st.st_mode):
                    total += st.st_size
                    files += 1
                    if max_bytes is not None and total > max_bytes:
                        raise ArtifactError(f"{src} holds more than the bound of {max_bytes} bytes")
                    _copy_file(Path(item.path), target)
                else:
                    raise ArtifactError(
                        f"{item.path} is not a regular file or directory (a symlink or special file); "
                        "compile artifacts are plain files, so the staging directory is not published"
                    )
    return total, files


def _copy_file(src: Path, dest: Path) -> None:
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fout = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fin).st_size
            while size > 0:
                sent = os.sendfile(fout, fin, None, min(size, 1 << 30))
                if sent == 0:
                    break
                size -= sent
        finally:
            os.close(fout)
    finally:
        os.close(fin)


@contextmanager
def _dir_lock(path: Path, exclusive: bool, wait: bool) -> Iterator[bool]:
    """``flock`` on a directory itself (no file to create: engines see entries read-only).
    Yields False when ``wait`` is off and another process holds it incompatibly, or when ``path``
    was replaced (evicted, republished) while this process waited for it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                yield False
                return
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.lstat(path))
        except FileNotFoundError:
            same = False
        yield same
    finally:
        os.close(fd)


class Store:
    """One artifact root. Engines use ``lookup``/``checkout``/``stage``/``claim``; the publisher
    ``publish``, ``record_hit``, ``evict`` and ``sweep``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.entries = self.root / "entries"
        self.staging = self.root / "staging"
        self.incoming = self.root / "incoming"
        self.trash = self.root / "trash"

    # -- publisher (owns the root) --------------------------------------------------------------

    def create(self) -> None:
        """The layout, owner-only except what engines need: they list and read entries and make
        their own staging directory."""
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        for path, mode in ((self.entries, 0o755), (self.staging, 0o755), (self.incoming, 0o700), (self.trash, 0o700)):
            path.mkdir(mode=mode, exist_ok=True)
            os.chmod(path, mode)

    def list_entries(self) -> list[Entry]:
        found = []
        for item in os.scandir(self.entries) if self.entries.is_dir() else []:
            if not DIGEST.fullmatch(item.name) or not item.is_dir(follow_symlinks=False):
                continue
            try:
                meta = EntryMeta.model_validate_json(read_json_file(Path(item.path) / "meta.json"))
            except (OSError, ValueError, ArtifactError):
                continue  # not one of ours: never counted, never reused (lookup checks the same way)
            found.append(Entry(item.name, meta.bytes, item.stat(follow_symlinks=False).st_mtime))
        return found

    def publish(self, staging: Path, claim: Claim, max_bytes: int) -> bool:
        """Copies ``staging``'s data into a new entry under ``claim.key``. False when the entry
        exists already (another engine's publication won); raises ``ArtifactError`` for a staging
        directory that cannot be published (the entry is then not created)."""
        digest = claim.key.digest
        final = self.entries / digest
        if os.path.lexists(final):
            return False
        building = self.incoming / f"{digest}.{secrets.token_hex(4)}"
        building.mkdir(mode=0o755)
        try:
            size, files = copy_tree(staging / "data", building / "data", max_bytes)
            meta = EntryMeta(key=claim.key, bytes=size, files=files, published_at=time.time())
            write_atomically(building / "meta.json", meta.model_dump_json().encode())
            try:
                os.rename(building, final)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    return False  # a racing publisher renamed its copy first
                raise
            return True
        finally:
            if building.exists():
                self._discard(building)

    def record_hit(self, digest: str) -> None:
        """An engine started from the entry: it is recently used now (the LRU clock is the mtime)."""
        try:
            os.utime(self.entries / digest, follow_symlinks=False)
        except FileNotFoundError:
            pass  # evicted since the engine copied it

    def evict(self, max_bytes: int) -> list[str]:
        """Removes least recently used entries until the rest fit in ``max_bytes``; an entry an
        engine is copying out is kept, and the next one in order goes in its place."""
        entries = {e.digest: e for e in self.list_entries()}
        in_use: set[str] = set()
        removed: list[str] = []
        while victims := eviction_order(list(entries.values()), max_bytes, frozenset(in_use)):
            digest = victims[0]
            path = self.entries / digest
            with _dir_lock(path, exclusive=True, wait=False) as free:
                if free:
                    doomed = self.trash / f"{digest}.{secrets.token_hex(4)}"
                    os.rename(path, doomed)
            if not free:
                in_use.add(digest)
                continue
            self._discard(doomed)
            removed.append(digest)
            del entries[digest]
        return removed

    def staged(self) -> list[Path]:
        return [
            Path(item.path)
            for item in (os.scandir(self.staging) if self.staging.is_dir() else [])
            if STAGING_NAME.fullmatch(item.name) and item.is_dir(follow_symlinks=False)
        ]

    def read_claim(self, staging: Path) -> Claim | None:
        try:
            return Claim.model_validate_json(read_json_file(staging / "claim.json"))
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            raise ArtifactError(f"{staging / 'claim.json'} is not a valid claim: {exc}") from None

    def owner_alive(self, staging: Path) -> bool:
        """Whether the engine that made ``staging`` still runs (it holds ``alive.lock``)."""
        try:
            fd = os.open(staging / "alive.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def remove_staging(self, staging: Path) -> None:
        self._discard(staging)

    def _discard(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    # -- engine (entries read-only, its own staging read-write) ---------------------------------

    def lookup(self, key: ArtifactKey) -> str | None:
        """The digest of the entry published under exactly ``key``, or None."""
        path = self.entries / key.digest
        try:
            meta = EntryMeta.model_validate_json(read_json_file(path / "meta.json"))
        except (OSError, ValueError, ArtifactError):
            return None
        if meta.key != key or not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        return key.digest

    def stage(self) -> tuple[Path, int]:
        """A new private staging directory and the descriptor of its held ``alive.lock`` (keep it
        open while the engine runs: the publisher removes staging directories nobody holds)."""
        name = secrets.token_hex(8)
        staging = self.staging / name
        staging.mkdir(mode=0o700)
        (staging / "data").mkdir(mode=0o700)
        fd = os.open(staging / "alive.lock", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return staging, fd

    def claim(self, staging: Path, key: ArtifactKey, prepare: Callable[[Path], object] | None = None) -> Claim:
        """Once per engine (every worker calls it; the first does the work): copy the entry
        published under ``key`` into the staging data, when there is one, and record the claim.
        ``prepare`` runs on the copied data before any worker goes on (the engine's own fix-ups)."""
        # Workers of one engine are separate processes; alive.lock's flock is the wrapper's, so
        # they serialise on a lock of their own.
        lock = os.open(staging / "claim.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            earlier = self.read_claim(staging)
            if earlier is not None:
                if earlier.key != key:
                    raise ArtifactError(
                        f"workers of one engine computed different artifact keys ({earlier.key.digest} and "
                        f"{key.digest}); they must run with one configuration"
                    )
                return earlier
            hit = self.checkout(key, staging / "data")
            if hit is not None and prepare is not None:
                prepare(staging / "data")
            claim = Claim(key=key, hit=hit)
            write_atomically(staging / "claim.json", claim.model_dump_json().encode(), 0o600)
            return claim
        finally:
            os.close(lock)

    def checkout(self, key: ArtifactKey, dest: Path) -> str | None:
        """Copies the entry of ``key`` into ``dest``; its digest, or None on a miss."""
        digest = self.lookup(key)
        if digest is None:
            return None
        path = self.entries / digest
        try:
            with _dir_lock(path, exclusive=False, wait=True) as held:
                if not held or self.lookup(key) != digest:  # evicted (perhaps replaced) before the lock
                    return None
                copy_tree(path / "data", dest)
        except FileNotFoundError:
            return None
        return digest

    @staticmethod
    def mark_ready(staging: Path) -> None:
        """The engine served: its staging data is complete enough to publish."""
        write_atomically(staging / "READY", json.dumps({"at": time.time()}).encode(), 0o600)
