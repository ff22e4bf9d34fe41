"""Termination messages, as the real kubelet handles them.

Each start of a container gets a fresh, empty host file bind-mounted at its
``terminationMessagePath`` (default ``/dev/termination-log``); when the container exits, the
kubelet reads it into ``state.terminated.message`` (and, after a restart, ``lastState``). With
``terminationMessagePolicy: FallbackToLogsOnError`` an empty file of a container that failed is
replaced by the tail of its log: at most 80 lines and 2048 bytes. A message is cut to 4096 bytes,
and all containers of a pod share 12 KiB (divided equally), as in the kubelet's
``kuberuntime`` package.

Without mount namespaces (not root) the file cannot appear at the container's path: only the log
fallback works there.
"""

from __future__ import annotations

from pathlib import Path

from ..rest import Object

DEFAULT_PATH = "/dev/termination-log"
MAX_BYTES = 4096
MAX_POD_BYTES = 12 * 1024
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048


def message_path(spec: Object) -> str:
    return spec.get("terminationMessagePath") or DEFAULT_PATH


def budget(pod_spec: Object) -> int:
    """Bytes each container's message may have: 4096, or less when the pod has more than three containers."""
    count = len(pod_spec.get("containers") or []) + len(pod_spec.get("initContainers") or [])
    return min(MAX_BYTES, MAX_POD_BYTES // max(count, 1))


def fresh_file(path: Path) -> Path:
    """The host file for one start of a container: created empty (a restart starts with no message)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    path.chmod(0o666)
    return path


def read_message(spec: Object, message_file: Path | None, log_file: Path, exit_code: int, limit: int) -> str | None:
    """What ``state.terminated.message`` says for a container that exited with ``exit_code``."""
    data = b""
    if message_file is not None:
        try:
            with open(message_file, "rb") as file:
                data = file.read(limit)
        except OSError:
            data = b""
    if not data.strip() and exit_code != 0 and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        data = _log_tail(log_file, min(limit, FALLBACK_BYTES))
    text = data[:limit].decode(errors="replace")
    return text if text.strip() else None


def _log_tail(log_file: Path, limit: int) -> bytes:
    try:
        with open(log_file, "rb") as file:
            file.seek(0, 2)
            size = file.tell()
            file.seek(max(0, size - limit))
            tail = file.read()
    except OSError:
        return b""
    return b"".join(tail.splitlines(keepends=True)[-FALLBACK_LINES:])
