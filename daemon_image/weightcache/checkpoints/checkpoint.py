"""Reading and validating a Hugging Face checkpoint directory.

Validation happens up front, from the safetensors headers alone, so that a missing shard, a
truncated file or an index that disagrees with its files is reported before a single byte of
weights is read and long before a ready file could be written. Tensor data is then read slice
by slice through safetensors' ``get_slice`` so a rank reads only its own part.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import safe_open
from weightcache_contract.errors import CheckpointError

from .dtypes import SAFETENSORS_DTYPES, itemsize

if TYPE_CHECKING:  # reading headers needs no torch (see dtypes.py); reading tensors imports it
    import torch

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
# A safetensors header is JSON describing tensors; anything near this size is not a real one.
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives on disk, as its file's header says."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    data_start: int = 0  # absolute file offset of the tensor's first byte

    @property
    def nbytes(self) -> int:
        n = itemsize(self.dtype)
        for dim in self.shape:
            n *= dim
        return n


@dataclass(frozen=True)
class ShardFile:
    """Identity of one shard file, as the fingerprint records it.

    ``inode`` and ``ctime_ns`` are what a rewrite cannot restore: any write (and any ``utime``
    that puts the old mtime back) sets the ctime to now, and only changing the system clock could
    set it back; a replaced file (download, copy + rename) has a new inode."""

    name: str
    size: int
    mtime_ns: int
    header_sha256: str
    inode: int
    ctime_ns: int


@dataclass
class Checkpoint:
    path: Path
    config: dict[str, Any]
    config_sha256: str
    shards: list[ShardFile]
    tensors: dict[str, TensorInfo]
    bytes_read: int = 0
    """Tensor bytes actually read from the shard files so far (``read`` and ``pread`` count what
    they return), so "no weight byte came from disk" is a measurement, not a plan."""
    _handles: dict[str, Any] = field(default_factory=dict, repr=False)
    _fds: dict[str, int] = field(default_factory=dict, repr=False)
    _open_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _count_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or []
        if not archs:
            raise CheckpointError(
                f"{self.path / CONFIG_FILE} has no 'architectures' entry; "
                'add e.g. "architectures": ["LlamaForCausalLM"]'
            )
        return str(archs[0])

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        qc = self.config.get("quantization_config")
        return dict(qc) if qc else None

    @property
    def torch_dtype_name(self) -> str | None:
        name = self.config.get("torch_dtype") or self.config.get("dtype")
        return str(name) if name else None

    def read(self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Read one tensor, or only rows/columns [start, stop) along ``dim``, from disk."""
        info = self.tensors[name]
        handle = self._handles.get(info.file)
        if handle is None:
            handle = safe_open(str(self.path / info.file), framework="pt", device="cpu")
            self._handles[info.file] = handle
        tensor: torch.Tensor  # safetensors' handles are untyped
        if dim is None:
            tensor = handle.get_tensor(name)
        else:
            index: list[slice] = [slice(None)] * len(info.shape)
            index[dim] = slice(start, stop)
            tensor = handle.get_slice(name)[tuple(index)]
        self._count(tensor.numel() * tensor.element_size())
        return tensor

    def rows_span(self, name: str, start: int, stop: int) -> tuple[str, int, int]:
        """(file, offset, length) of rows [start, stop) along dim 0: contiguous in the file."""
        info = self.tensors[name]
        if not info.shape:
            return info.file, info.data_start, info.nbytes
        row_bytes = info.nbytes // info.shape[0] if info.shape[0] else 0
        return info.file, info.data_start + start * row_bytes, (stop - start) * row_bytes

    def pread(self, file: str, offset: int, out: memoryview) -> None:
        """Fill ``out`` from ``file`` at ``offset`` with pread: one copy, no GIL held, thread-safe."""
        fd = self._fds.get(file)
        if fd is None:
            with self._open_lock:
                fd = self._fds.get(file)
                if fd is None:
                    fd = self._fds[file] = os.open(self.path / file, os.O_RDONLY | os.O_CLOEXEC)
        done, want = 0, len(out)
        while done < want:
            n = os.preadv(fd, [out[done:]], offset + done)
            if n == 0:
                raise CheckpointError(f"{self.path / file} ended at byte {offset + done}; the file was truncated")
            done += n
            self._count(n)

    def _count(self, nbytes: int) -> None:
        with self._count_lock:  # loader threads read concurrently; += on an attribute is not atomic
            self.bytes_read += nbytes

    def close(self) -> None:
        self._handles.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def open_checkpoint(path: str | os.PathLike[str], *, stamps_only: bool = False) -> Checkpoint:
    """Open and fully validate a checkpoint directory; raise ``CheckpointError`` naming the fix.

    ``stamps_only``: config and shard identities (what a fingerprint needs) without parsing the
    tensor headers: ``tensors`` stays empty. A daemon re-adopting from the keeper needs nothing
    more, and parsing and checking 20,000 header entries would cost it a third of its second.
    The stamps are the same bytes either way, so the fingerprints agree."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist or is not a directory")
    root = root.resolve()
    config_path = root / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{config_path} is missing: a Hugging Face checkpoint needs its config.json")
    config_bytes = config_path.read_bytes()
    try:
        config = json.loads(config_bytes)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} must hold a JSON object")

    weight_map = _read_index(root)
    files = _shard_names(root, weight_map)
    if not files:
        raise CheckpointError(f"no *.safetensors files in {root}")

    shards: list[ShardFile] = []
    tensors: dict[str, TensorInfo] = {}
    if stamps_only:
        shards = [_stamp(root / file_name)[0] for file_name in files]
        return Checkpoint(
            path=root,
            config=config,
            config_sha256=hashlib.sha256(config_bytes).hexdigest(),
            shards=shards,
            tensors=tensors,
        )
    for file_name in files:
        shard, header = _read_header(root / file_name)
        shards.append(shard)
        for name, entry in header.items():
            if name in tensors:
                raise CheckpointError(
                    f"tensor {name!r} appears in both {tensors[name].file} and {file_name}; "
                    f"a checkpoint must store each tensor once"
                )
            tensors[name] = TensorInfo(name, file_name, entry[0], entry[1], entry[2])

    if weight_map is not None:
        for name, file_name in weight_map.items():
            found = tensors.get(name)
            if found is None or found.file != file_name:
                where = f"it is in {found.file}" if found else "no shard contains it"
                raise CheckpointError(
                    f"{INDEX_FILE} maps {name!r} to {file_name} but {where}; "
                    "the index and the shard files disagree (regenerate the index or restore the shard)"
                )
        unindexed = sorted(set(tensors) - set(weight_map))
        if unindexed:
            raise CheckpointError(
                f"{len(unindexed)} tensor(s) are in the shard files but not in {INDEX_FILE}, "
                f"e.g. {unindexed[0]!r}; the index and the shard files disagree"
            )

    return Checkpoint(
        path=root,
        config=config,
        config_sha256=hashlib.sha256(config_bytes).hexdigest(),
        shards=shards,
        tensors=tensors,
    )


def with_headers(checkpoint: Checkpoint) -> Checkpoint:
    """A stamps-only checkpoint opened in full (every header parsed and checked), refusing one whose
    shards changed since the stamps were taken: a fingerprint made from those stamps would lie."""
    if checkpoint.tensors:
        return checkpoint
    full = open_checkpoint(checkpoint.path)
    if full.shards != checkpoint.shards:
        raise CheckpointError(f"{checkpoint.path} changed since this process fingerprinted it; start it again")
    return full


def current_stamps(checkpoint: Checkpoint) -> list[ShardFile]:
    """The shards' identities as they are now (stat + header), to tell whether they changed since opened."""
    return [stamp_file(checkpoint.path / shard.name) for shard in checkpoint.shards]


def stamp_file(path: Path) -> ShardFile:
    """One shard's identity as it is now (stat + header); ``CheckpointError`` or ``OSError`` when
    it is missing, truncated or not a safetensors file."""
    return _stamp(path)[0]


def shard_names(root: Path) -> list[str]:
    """The checkpoint's shard file names as ``open_checkpoint`` finds them now (the index's files,
    or every ``*.safetensors`` without one)."""
    return _shard_names(root, _read_index(root))


def _shard_names(root: Path, weight_map: dict[str, str] | None) -> list[str]:
    if weight_map is not None:
        return sorted(set(weight_map.values()))
    return sorted(p.name for p in root.glob("*.safetensors"))


def _read_index(root: Path) -> dict[str, str] | None:
    index_path = root / INDEX_FILE
    if not index_path.exists():
        return None
    try:
        index = json.loads(index_path.read_bytes())
        weight_map = index["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{index_path} is not a valid safetensors index ({exc!r}); it needs a 'weight_map'"
        ) from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_path}: 'weight_map' must map tensor names to file names")
    for file_name in set(weight_map.values()):
        if "/" in file_name or file_name.startswith("."):
            raise CheckpointError(f"{index_path} names {file_name!r}, which is not a file in the checkpoint directory")
        if not (root / file_name).is_file():
            raise CheckpointError(f"shard {file_name} listed in {INDEX_FILE} is missing from {root}")
    return dict(weight_map)


def _stamp(path: Path) -> tuple[ShardFile, bytes, os.stat_result]:
    """A shard's identity for the fingerprint, with its raw header bytes and its stat."""
    stat = path.stat()
    with path.open("rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path} is truncated: {stat.st_size} bytes is too short for a safetensors header")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_HEADER_BYTES or 8 + header_len > stat.st_size:
            raise CheckpointError(
                f"{path} is truncated or not a safetensors file: header claims {header_len} bytes, "
                f"file has {stat.st_size}"
            )
        header_bytes = fh.read(header_len)
    shard = ShardFile(
        name=path.name,
        size=stat.st_size,
        mtime_ns=stat.st_mtime_ns,
        header_sha256=hashlib.sha256(header_bytes).hexdigest(),
        inode=stat.st_ino,
        ctime_ns=stat.st_ctime_ns,
    )
    return shard, header_bytes, stat


def _read_header(path: Path) -> tuple[ShardFile, dict[str, tuple[str, tuple[int, ...], int]]]:
    """Parse and check one safetensors header; the file size must cover every tensor's bytes."""
    shard, header_bytes, stat = _stamp(path)
    header_len = len(header_bytes)
    try:
        header = json.loads(header_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} has a corrupt safetensors header: {exc}") from None

    parsed: dict[str, tuple[str, tuple[int, ...], int]] = {}
    data_end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except KeyError as exc:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported or missing header field {exc}") from None
        expected = itemsize(dtype)
        for dim in shape:
            expected *= dim
        if end - begin != expected:
            raise CheckpointError(f"{path}: tensor {name!r} spans {end - begin} bytes but its shape needs {expected}")
        data_end = max(data_end, end)
        parsed[name] = (dtype, shape, 8 + header_len + begin)

    if 8 + header_len + data_end != stat.st_size:
        raise CheckpointError(
            f"{path} is truncated or padded: its header needs {8 + header_len + data_end} bytes, "
            f"the file has {stat.st_size}; re-copy this shard"
        )
    return shard, parsed
