"""The daemon watches its checkpoint on disk and says when it no longer holds what the arena does.

A rank serves the bytes it read at load time, under a fingerprint that stamps each shard file
(fingerprint.py). When a shard's stamp changes on disk, one of two things happened:

- its bytes changed: the arena is stale for anyone reading the checkpoint now. Engines started
  from now on refuse it (their stamps differ); the daemon cannot fix that without loading again,
  so it reports ``changed`` (status, log line, metric) and keeps serving engines already mapped.
- only its file identity changed (``cp`` over it, rsync's temporary file + rename, a re-sync):
  the daemon re-reads the slices this rank reads of it (content.py, at disk speed, one 16 MiB
  buffer; the whole file where the arena's digest is a whole-file one, as the vLLM profile's are)
  and, when the content digest equals the one taken at load time, adopts the new stamps:
  its fingerprint, ready file and keeper deposit change, so engines stamping the files as they
  are now map the arena again. Nothing is adopted unless the digest was read from the very file
  (inode, size, mtime, ctime) the new stamp describes, unchanged from before to after the read.

A file whose stamp is still moving (a copy in progress) is judged only once two looks in a row
agree; until then the state is ``verifying``. While it re-reads, ``verifying`` carries the bytes it
reads and has read: an engine started meanwhile waits for the verdict (client/weights.py,
``await_verdict``) and, when its timeout runs out first, says how long the verdict takes. inotify on the checkpoint directory wakes the
watch early on Linux; the stat poll runs regardless (a symlinked shard's target, e.g. in a
Hugging Face cache, lives outside the watched directory).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weightcache_contract.daemon_report import CheckpointWatch
from weightcache_contract.errors import WeightCacheError

from ..checkpoints.checkpoint import CONFIG_FILE, INDEX_FILE, ShardFile, TensorInfo, shard_names, stamp_file
from ..checkpoints.content import DigestCache, current_digest, is_whole_file
from ..checkpoints.read_tasks import ReadTask
from ..wire.fingerprint import Fingerprint, ShardStamp
from .serving import Served

log = logging.getLogger("weightcache.daemon")

Plan = Callable[[], tuple[list[ReadTask], dict[str, TensorInfo]]]
"""The rank's read tasks and the checkpoint's tensors, planned from the files as they are now."""

RESTART_FIX = "restart the daemon so it loads the checkpoint as it is now"


class CheckpointWatcher:
    def __init__(
        self,
        served: Served,
        poll_s: float,
        adopt: Callable[[Fingerprint], None],
        plan: Plan | None,
        cache: DigestCache | None,
        fields: dict[str, Any],
    ) -> None:
        self.served = served
        self.poll_s = poll_s
        self._adopt = adopt
        self._plan = plan
        self._planned: tuple[list[ReadTask], dict[str, TensorInfo]] | None = None
        self._cache = cache
        self._fields = fields
        self._stop = threading.Event()
        # Written by stop(): wakes a watch waiting on inotify, which an Event cannot.
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._seen: dict[str, ShardStamp | str] = {}  # what the last look saw of each differing file
        self._judged: dict[str, tuple[ShardStamp, bool]] = {}  # file → (identity read, same bytes?)
        self._logged_changed: tuple[str, ...] = ()
        self._logged_error = ""
        self._index: tuple[tuple[int, int, int, int] | None, list[str]] | None = None  # (its stat, names)
        served.checkpoint = CheckpointWatch()
        self._thread = threading.Thread(target=self._run, name="checkpoint-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        if self._thread.is_alive():  # a look still reading the checkpoint: the exit does not wait for it
            log.warning("checkpoint watch still busy at stop; not waiting for it", extra={"fields": self._fields})
            return
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        notify = _Inotify.open(Path(self.served.fingerprint.model_path))
        try:
            while not self._stop.is_set():
                try:
                    self.check()
                    self._logged_error = ""
                except Exception as exc:  # noqa: BLE001 - the watch must outlive any one bad look
                    if repr(exc) != self._logged_error:  # once per kind of failure, not once per look
                        self._logged_error = repr(exc)
                        log.exception("checkpoint watch failed; trying again", extra={"fields": self._fields})
                if notify is None:
                    self._stop.wait(self.poll_s)
                elif notify.wait(self.poll_s, self._wake_r):
                    self._stop.wait(0.1)  # a burst of writes wakes the watch once, not per write
                    notify.drain()
        finally:
            if notify is not None:
                notify.close()

    def check(self) -> None:
        """One look at the checkpoint; updates ``served.checkpoint``, logs, adopts."""
        fingerprint, manifest = self.served.identity()
        root = Path(fingerprint.model_path)
        changed: dict[str, str] = {}
        settling: list[str] = []
        to_verify: dict[str, ShardStamp] = {}
        same: dict[str, ShardStamp] = {}
        config = _config_look(root / CONFIG_FILE)
        if config == fingerprint.config_sha256:
            self._seen.pop(CONFIG_FILE, None)
        else:
            settled = self._seen.get(CONFIG_FILE) == config
            self._seen[CONFIG_FILE] = config
            if not settled:
                settling.append(CONFIG_FILE)
            elif config.startswith("it "):
                changed[CONFIG_FILE] = config
            else:
                changed[CONFIG_FILE] = "its bytes differ"
        for name in self._new_shards(root, fingerprint):
            changed[name] = "it is a shard the checkpoint did not have when the arena was loaded"
        for old in fingerprint.shards:
            now = _look(root / old.name, old)
            if now == old:
                self._seen.pop(old.name, None)
                self._judged.pop(old.name, None)
                continue
            settled = self._seen.get(old.name) == now
            self._seen[old.name] = now
            if not settled:
                settling.append(old.name)
            elif isinstance(now, str):
                changed[old.name] = now
            elif (now.size, now.header_sha256) != (old.size, old.header_sha256):
                changed[old.name] = "its size or safetensors header differ"
            elif old.name in self._judged and self._judged[old.name][0] == now:
                if self._judged[old.name][1]:
                    same[old.name] = now
                else:
                    changed[old.name] = "its bytes differ"
            else:
                to_verify[old.name] = now

        # Another shard's header or the config changing changes the plan: verify against a steady one.
        if to_verify and not changed and CONFIG_FILE not in settling:
            unverifiable = [name for name in to_verify if not self._can_verify(manifest.shard_digests.get(name))]
            if unverifiable:
                changed.update(
                    dict.fromkeys(
                        unverifiable,
                        "it was rewritten, and this arena has no content digest to tell whether its bytes changed",
                    )
                )
            else:
                progress = self._progress(to_verify, manifest.shard_digests)
                for name, stamp in to_verify.items():
                    if self._stop.is_set():
                        return
                    equal = self._verify(root, name, stamp, manifest.shard_digests.get(name), progress)
                    if equal is None:
                        settling.append(name)  # it moved during the read
                    elif equal:
                        same[name] = stamp
                    else:
                        changed[name] = "its bytes differ"

        if changed:
            self._report_changed(changed)
        elif settling or to_verify.keys() - same.keys():
            files = sorted({*settling, *to_verify})
            self._publish("verifying", files, f"re-reading {', '.join(files)} to tell whether their bytes changed")
        elif same:
            adopted = fingerprint.model_copy(update={"shards": tuple(same.get(s.name, s) for s in fingerprint.shards)})
            self._adopt(adopted)
            for name in same:
                self._seen.pop(name, None)
                self._judged.pop(name, None)
            log.info(
                "same bytes under a new file identity; serving them under the new fingerprint",
                extra={"fields": {**self._fields, "files": ",".join(sorted(same)), "fingerprint": adopted.digest[:16]}},
            )
            self._publish("unchanged", [], None)
        else:
            self._publish("unchanged", [], None)

    def _can_verify(self, loaded: str | None) -> bool:
        """A whole-file digest needs nothing but the file; a sliced one needs the rank's plan."""
        return loaded is not None and (is_whole_file(loaded) or self._plan is not None)

    def _progress(self, to_verify: dict[str, ShardStamp], loaded: dict[str, str]) -> Callable[[int], None]:
        """Publish ``verifying`` with the bytes the re-read of ``to_verify`` takes; the callback
        counts the bytes read and publishes them, so that an engine started meanwhile can say how
        long the verdict takes (a file the digest cache knows is counted but not read)."""
        files = sorted(to_verify)
        detail = f"re-reading {', '.join(files)} to tell whether their bytes changed"
        total: int | None = 0
        try:
            for name, stamp in to_verify.items():
                if is_whole_file(loaded.get(name)):
                    total = (total or 0) + stamp.size
                else:
                    tasks, tensors = self._tasks()
                    total = (total or 0) + sum(t.read_bytes for t in tasks if tensors[t.source].file == name)
        except (OSError, WeightCacheError):
            total = None  # the headers are in flux: _verify finds so too, and looks again later
        started = time.monotonic()
        read = 0

        def publish(n: int) -> None:
            nonlocal read
            read += n
            self._publish(
                "verifying",
                files,
                detail,
                verify_bytes=total,
                verified_bytes=None if total is None else read,
                verify_seconds=None if total is None else time.monotonic() - started,
            )

        publish(0)
        return publish

    def _verify(
        self, root: Path, name: str, stamp: ShardStamp, loaded: str | None, progress: Callable[[int], None]
    ) -> bool | None:
        """Whether the file ``stamp`` describes holds the bytes the arena was loaded from; None
        when it changed while being read."""
        log.info(  # once per file identity: a judged one is not verified again
            "checkpoint file rewritten; verifying its content",
            extra={"fields": {**self._fields, "file": name, "inode": stamp.inode, "ctime_ns": stamp.ctime_ns}},
        )
        tasks: list[ReadTask] | None = None  # a whole-file digest: the whole file again, no plan
        tensors: dict[str, TensorInfo] = {}
        if not is_whole_file(loaded):
            try:
                tasks, tensors = self._tasks()
            except (OSError, WeightCacheError):
                return None  # the headers are in flux (another file being copied): look again later
        shard = ShardFile(**stamp.model_dump())
        digest, _ = current_digest(root / name, shard, tensors, tasks, self._cache, self._stop.is_set, progress)
        if digest is None:
            return None
        equal = digest == loaded
        self._judged[name] = (stamp, equal)
        return equal

    def _new_shards(self, root: Path, fingerprint: Fingerprint) -> list[str]:
        """Shard files the checkpoint lists now that the arena was not loaded from (a new revision
        with more shards). The index is parsed again only when its stat changed."""
        try:
            st = os.stat(root / INDEX_FILE)
            key: tuple[int, int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except FileNotFoundError:
            key = None  # no index: the directory's *.safetensors, listed on every look
        if self._index is None or key is None or self._index[0] != key:
            try:
                self._index = (key, shard_names(root))
            except WeightCacheError:
                return []  # an index being rewritten: the next look reads it again
        served = {s.name for s in fingerprint.shards}
        return [name for name in self._index[1] if name not in served]

    def _tasks(self) -> tuple[list[ReadTask], dict[str, TensorInfo]]:
        if self._planned is None:
            assert self._plan is not None
            self._planned = self._plan()
        return self._planned

    def _report_changed(self, changed: dict[str, str]) -> None:
        files = sorted(changed)
        why = "; ".join(f"{name}: {changed[name]}" for name in files)
        detail = (
            f"the checkpoint changed on disk after this daemon loaded it ({why}); the arena still serves "
            f"the bytes it loaded, which engines started now refuse: {RESTART_FIX}"
        )
        if tuple(files) != self._logged_changed:
            self._logged_changed = tuple(files)
            log.warning(
                "checkpoint changed on disk; the arena keeps serving the bytes it loaded",
                extra={"fields": {**self._fields, "files": ",".join(files), "why": why, "fix": RESTART_FIX}},
            )
        self._publish("changed", files, detail)

    def _publish(self, state: str, files: list[str], detail: str | None, **progress: Any) -> None:
        """``progress``: CheckpointWatch's verify_* fields, while ``verifying`` re-reads files."""
        if state != "changed":
            self._logged_changed = ()
        self.served.checkpoint = CheckpointWatch(state=state, changed_files=files, detail=detail, **progress)  # type: ignore[arg-type]


def _config_look(path: Path) -> str:
    """SHA-256 of config.json now, or why there is none (a sentence starting with "it ")."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return "it is missing"
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"


def _look(path: Path, served: ShardStamp) -> ShardStamp | str:
    """The file's stamp now, or why there is none. A file whose stat matches ``served`` has not been
    written since (any write sets the ctime), so its header is not read again: a look at a
    checkpoint of hundreds of shards costs a ``stat`` each."""
    try:
        st = os.stat(path)
        if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (
            served.inode,
            served.size,
            served.mtime_ns,
            served.ctime_ns,
        ):
            return served
        return ShardStamp(**vars(stamp_file(path)))
    except FileNotFoundError:
        return "it is missing"
    except (OSError, WeightCacheError) as exc:
        return f"it cannot be read as a shard ({exc})"


class _Inotify:
    """inotify on one directory, through libc (no dependency): wakes the watch when a file in it
    is written, has its attributes changed, or is created, deleted or renamed."""

    _MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800  # MODIFY … MOVE_SELF
    _FLAGS = 0o4000 | 0o2000000  # IN_NONBLOCK | IN_CLOEXEC

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, directory: Path) -> _Inotify | None:
        """None where inotify is not available (not Linux, no libc symbol, no watches left)."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(cls._FLAGS)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(directory), cls._MASK) < 0:
            os.close(fd)
            return None
        return cls(fd)

    def wait(self, timeout_s: float, wake_fd: int) -> bool:
        """True when an event arrived within ``timeout_s``; returns early when ``wake_fd`` is readable."""
        readable, _, _ = select.select([self.fd, wake_fd], [], [], timeout_s)
        return self.fd in readable

    def drain(self) -> None:
        try:
            while os.read(self.fd, 65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.fd)
