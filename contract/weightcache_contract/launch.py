"""How the operator launches the data plane's processes, and how they read what it launched them with.

Both sides of the process boundary build from these definitions: the operator renders a daemon's
command from ``DaemonArgs.to_argv`` and an engine's environment from ``EngineEnv.to_env``; the daemon
builds its parser from ``add_daemon_arguments`` and the reference engine reads its environment under
``ENGINE_ENV_PREFIX``. A test parses every rendered command with that parser, so a flag one side
renders and the other does not know fails there, not in a pod. Standard library only.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import get_args, get_type_hints

LOAD_FORMAT = "weightcache"
"""The model loader the weightcache plug-in registers with vLLM (entry point vllm.general_plugins)."""
REFERENCE_PROFILE = "reference"
"""The daemon's own loader, for the reference engine and transformers."""
VLLM_PROFILE = "vllm"
"""The daemon's load profile whose arenas hold vLLM's post-processed parameters."""
PROFILES = (REFERENCE_PROFILE, VLLM_PROFILE)
"""The load profiles the data plane builds in; ``--profile`` takes any the daemon has registered
(``weightcache.profiles``), which refuses an unknown name with the known ones."""
LOAD_WORKERS = 4
"""``--load-workers``' default: threads a daemon rank reads and post-processes tensors with."""
CHECKPOINT_POLL_SECONDS = 5.0
"""``--checkpoint-poll-seconds``' default: how often a daemon rank stats its checkpoint."""
ENGINE_ENV_PREFIX = "WEIGHTCACHE_ENGINE_"
"""Every engine setting in the environment is ``ENGINE_ENV_PREFIX`` + its flag, upper case, ``_`` for ``-``."""


def engine_env_name(flag: str) -> str:
    """``tp-size`` (or ``tp_size``) → ``WEIGHTCACHE_ENGINE_TP_SIZE``."""
    return ENGINE_ENV_PREFIX + flag.upper().replace("-", "_")


def block(text: str) -> tuple[int, int]:
    """``--weight-block-size``: two integers, ``128,128`` or ``128x128``."""
    parts = [int(p) for p in text.replace("x", ",").split(",")]
    if len(parts) != 2:
        raise argparse.ArgumentTypeError("weight block size is two integers, e.g. 128,128")
    return parts[0], parts[1]


def ranks(text: str) -> list[int]:
    """A rank list: ``0-3``, ``0,2`` or both (``0-1,4``)."""
    found: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            found.extend(range(int(lo), int(hi) + 1))
        elif part:
            found.append(int(part))
    return found


def format_ranks(listed: tuple[int, ...] | list[int]) -> str:
    """The ``--ranks`` text ``ranks`` parses back: ``0-2`` for a run, ``0,2`` otherwise."""
    if len(listed) > 1 and list(listed) == list(range(listed[0], listed[-1] + 1)):
        return f"{listed[0]}-{listed[-1]}"
    return ",".join(str(r) for r in listed)


def add_checkpoint_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        p.add_argument("--model", required=True, help="checkpoint directory (Hugging Face layout)"),
        p.add_argument("--dtype", default="auto", help="auto (from config.json), bfloat16, float16 or float32"),
        p.add_argument("--quantization", default="none", help="none or fp8 (block-wise)"),
        p.add_argument("--weight-block-size", type=block, default=None, help="fp8 block, default 128,128"),
    ]


def add_model_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        *add_checkpoint_args(p),
        p.add_argument("--revision", default="", help="model revision recorded in the fingerprint"),
        p.add_argument(
            "--backend",
            default=None,
            help="arena backend: cpu-shm, cuda-vmm or cuda-ipc (default: cuda-vmm with a GPU, else cpu-shm)",
        ),
        p.add_argument("--device", type=int, default=0, help="CUDA ordinal of this rank's GPU (GPU backends)"),
    ]


def add_layout_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        p.add_argument("--tp-size", type=int, default=1),
        p.add_argument("--tp-rank", type=int, default=0),
        p.add_argument("--pp-size", type=int, default=1),
        p.add_argument("--pp-rank", type=int, default=0),
        p.add_argument(
            "--ep-size",
            type=int,
            default=1,
            help="expert-parallel size (MoE; divides --tp-size): each run of tp/ep ranks holds 1/ep of the "
            "experts whole instead of a slice of every expert",
        ),
    ]


def add_cache_args(p: argparse.ArgumentParser, socket_dir: str, required: bool) -> list[argparse.Action]:
    return [
        p.add_argument("--socket-dir", default=socket_dir, help="directory holding <name>/rank-N.sock"),
        p.add_argument("--name", required=required, default=None if required else "default", help="the cache's name"),
    ]


def add_peer_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """Who may connect to a socket besides its owner and root (daemon and keeper)."""
    return [
        p.add_argument("--allow-uid", type=int, action="append", default=[], help="extra uid allowed to connect"),
        p.add_argument("--allow-gid", type=int, action="append", default=[], help="extra gid allowed to connect"),
    ]


def add_keeper_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """``weightcache keeper``'s flags (``--socket-dir`` left out: the data plane's default)."""
    return [p.add_argument("--socket-dir", default=None), *add_peer_args(p)]


def add_daemon_arguments(d: argparse.ArgumentParser, socket_dir: str) -> list[argparse.Action]:
    """``weightcache daemon``'s flags; ``socket_dir``: ``--socket-dir``'s default (the data plane's
    ``default_socket_dir``, which reads the environment: the contract does not)."""
    return [
        *add_model_args(d),
        *add_layout_args(d),
        *add_cache_args(d, socket_dir, required=True),
        d.add_argument(
            "--ranks",
            type=ranks,
            default=None,
            help="launch one process per listed global rank (e.g. 0-3) instead of one rank",
        ),
        d.add_argument("--socket-group", default=None, help="group allowed to connect (socket mode 0660)"),
        *add_peer_args(d),
        d.add_argument(
            "--engine-access",
            choices=["read-only", "read-write"],
            default="read-only",
            help="how engines map the arena (read-write: cuda-vmm only, opt-in, part of the fingerprint)",
        ),
        d.add_argument(
            "--keeper",
            choices=["auto", "off"],
            default="auto",
            help="auto: deposit with / re-adopt from <socket-dir>/keeper.sock when a keeper listens",
        ),
        d.add_argument(
            "--load-workers", type=int, default=LOAD_WORKERS, help="threads reading and post-processing tensors"
        ),
        d.add_argument(
            "--checkpoint-poll-seconds",
            type=float,
            default=CHECKPOINT_POLL_SECONDS,
            metavar="S",
            help="how often each rank stats its checkpoint to report (and, for equal bytes under a new file "
            "identity, adopt) a change on disk; inotify wakes it sooner on Linux; 0 turns the watch off",
        ),
        d.add_argument(
            "--status-addr",
            default=None,
            metavar="HOST:PORT",
            help="serve GET /status (JSON) and GET /metrics (Prometheus) for the local ranks here; "
            "off unless given (the operator sets $(POD_IP):9400)",
        ),
        d.add_argument(
            "--gpus-file",
            default=None,
            metavar="FILE",
            help="GPU backends: the GPU holder's grant (gpus.json); local rank i uses its i-th GPU, found "
            "by UUID (waits until a running holder has written it); overrides --device",
        ),
        d.add_argument(
            "--synthetic-fill",
            action="store_true",
            help="benchmarks only (weightcache bench --synthetic): fill the arena with a byte pattern instead "
            "of reading the checkpoint; the fingerprint's revision becomes 'synthetic-fill:<revision>', "
            "so no engine expecting the real weights maps it",
        ),
        d.add_argument(
            "--profile",
            default=REFERENCE_PROFILE,
            metavar="{" + ",".join(PROFILES) + ",...}",
            help="the load profile: reference: weightcache's own loader (engines: the reference engine, transformers); "
            "vllm: vLLM's loader and post-processing for this rank, for engines run with "
            "--load-format " + LOAD_FORMAT + " (needs --vllm-args; see docs/vllm.md)",
        ),
        d.add_argument(
            "--vllm-args",
            default=None,
            metavar="JSON",
            help="--profile vllm: a JSON list of the vLLM engine arguments the engine gets after "
            '`vllm serve MODEL` (e.g. \'["--dtype","bfloat16","--tensor-parallel-size","2"]\'); '
            "the arena's fingerprint comes from them",
        ),
        d.add_argument(
            "--vllm-dist-init",
            default=None,
            metavar="tcp://HOST:PORT",
            help=argparse.SUPPRESS,  # set by the --ranks launcher: the local ranks' gloo rendezvous
        ),
        d.add_argument(
            "--artifact-dir",
            default=None,
            metavar="DIR",
            help="keep the node's engine compile artifacts here: publish what engines run under "
            "`weightcache artifacts-run` staged, evict beyond --artifact-max-bytes, report hits in /status "
            "(docs/vllm.md, Compile artifacts); off unless given",
        ),
        d.add_argument(
            "--artifact-max-bytes",
            type=int,
            default=8 << 30,
            metavar="N",
            help="the bound on --artifact-dir's published entries; least recently used ones go first",
        ),
        d.add_argument("--handoff-state", default=None, help=argparse.SUPPRESS),  # set by handoff.exec_daemon
        d.add_argument(
            "--local-index",
            type=int,
            default=0,
            help="this rank's position among the pod's local ranks, picking its GPU of --gpus-file "
            "(the --ranks launcher sets it)",
        ),
    ]


@dataclass(frozen=True)
class DaemonArgs:
    """What ``weightcache daemon`` is launched with (by the operator, the benchmarks and the reference
    engine's daemon mode), typed; ``to_argv`` renders the flags after ``daemon`` and
    ``from_namespace`` reads them back from what ``add_daemon_arguments`` parsed.

    The ``vllm`` profile takes dtype, quantization, revision and expert parallelism from
    ``vllm_args`` and refuses the reference loader's flags for them: ``to_argv`` leaves those out
    there unless they differ from their defaults (which the daemon then refuses by name)."""

    model: str
    name: str
    socket_dir: str
    backend: str | None = None
    tp_size: int = 1
    pp_size: int = 1
    ep_size: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    dtype: str = "auto"
    quantization: str = "none"
    weight_block_size: tuple[int, int] | None = None
    revision: str = ""
    ranks: tuple[int, ...] | None = None
    keeper: str = "auto"
    status_addr: str | None = None
    gpus_file: str | None = None
    profile: str = REFERENCE_PROFILE
    vllm_args: tuple[str, ...] | None = None
    artifact_dir: str | None = None
    artifact_max_bytes: int | None = None
    load_workers: int = LOAD_WORKERS
    synthetic_fill: bool = False
    socket_group: str | None = None
    checkpoint_poll_seconds: float = CHECKPOINT_POLL_SECONDS

    def to_argv(self) -> list[str]:
        reference = self.profile == REFERENCE_PROFILE
        argv = ["--model", self.model]
        if reference or self.dtype != "auto":
            argv += ["--dtype", self.dtype]
        if reference or self.quantization != "none":
            argv += ["--quantization", self.quantization]
        if self.weight_block_size is not None:
            argv += ["--weight-block-size", ",".join(str(n) for n in self.weight_block_size)]
        if self.revision:
            argv += ["--revision", self.revision]
        if self.backend is not None:  # left out: the daemon picks cuda-vmm with a GPU, else cpu-shm
            argv += ["--backend", self.backend]
        argv += ["--tp-size", str(self.tp_size), "--pp-size", str(self.pp_size)]
        # A single rank's position (without ``--ranks``); the operator launches by ``--ranks`` only.
        if self.tp_rank != 0:
            argv += ["--tp-rank", str(self.tp_rank)]
        if self.pp_rank != 0:
            argv += ["--pp-rank", str(self.pp_rank)]
        # Only when used, so that the DaemonSets of caches without experts do not change (and roll).
        if self.ep_size != 1:
            argv += ["--ep-size", str(self.ep_size)]
        if self.ranks is not None:
            argv += ["--ranks", format_ranks(self.ranks)]
        argv += ["--socket-dir", self.socket_dir, "--name", self.name, "--keeper", self.keeper]
        if self.status_addr is not None:
            argv += ["--status-addr", self.status_addr]
        if self.gpus_file is not None:
            argv += ["--gpus-file", self.gpus_file]
        if not reference:
            argv += ["--profile", self.profile]
        if self.vllm_args is not None:
            argv += ["--vllm-args", json.dumps(list(self.vllm_args))]
        if self.artifact_dir is not None:
            argv += ["--artifact-dir", self.artifact_dir]
        if self.artifact_max_bytes is not None:
            argv += ["--artifact-max-bytes", str(self.artifact_max_bytes)]
        if self.load_workers != LOAD_WORKERS:
            argv += ["--load-workers", str(self.load_workers)]
        if self.synthetic_fill:
            argv.append("--synthetic-fill")
        if self.socket_group is not None:
            argv += ["--socket-group", self.socket_group]
        if self.checkpoint_poll_seconds != CHECKPOINT_POLL_SECONDS:
            argv += ["--checkpoint-poll-seconds", str(self.checkpoint_poll_seconds)]
        return argv

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> DaemonArgs:
        """The typed values of a parsed ``daemon`` command (``--artifact-max-bytes`` bounds only an
        ``--artifact-dir``: without one it reads as not given)."""
        vllm_args = json.loads(args.vllm_args) if args.vllm_args is not None else None
        if vllm_args is not None and not (isinstance(vllm_args, list) and all(isinstance(a, str) for a in vllm_args)):
            raise ValueError('--vllm-args is a JSON list of strings, e.g. ["--dtype", "bfloat16"]')
        return cls(
            model=args.model,
            name=args.name,
            socket_dir=args.socket_dir,
            backend=args.backend,
            tp_size=args.tp_size,
            pp_size=args.pp_size,
            ep_size=args.ep_size,
            tp_rank=args.tp_rank,
            pp_rank=args.pp_rank,
            dtype=args.dtype,
            quantization=args.quantization,
            weight_block_size=args.weight_block_size,
            revision=args.revision,
            ranks=tuple(args.ranks) if args.ranks is not None else None,
            keeper=args.keeper,
            status_addr=args.status_addr,
            gpus_file=args.gpus_file,
            profile=args.profile,
            vllm_args=tuple(vllm_args) if vllm_args is not None else None,
            artifact_dir=args.artifact_dir,
            artifact_max_bytes=args.artifact_max_bytes if args.artifact_dir is not None else None,
            load_workers=args.load_workers,
            synthetic_fill=args.synthetic_fill,
            socket_group=args.socket_group,
            checkpoint_poll_seconds=args.checkpoint_poll_seconds,
        )


@dataclass(frozen=True)
class KeeperArgs:
    """``weightcache keeper``'s flags as the operator renders them."""

    socket_dir: str

    def to_argv(self) -> list[str]:
        return ["--socket-dir", self.socket_dir]

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> KeeperArgs:
        return cls(socket_dir=args.socket_dir)


@dataclass(frozen=True)
class EngineEnv:
    """What an engine pod's environment says about the cache it maps and how to serve it, under one
    name per value: ``engine_env_name`` of the field (``tp_size`` → ``WEIGHTCACHE_ENGINE_TP_SIZE``),
    which is the reference engine's flag of that name read from the environment. Optional values
    left ``None`` are not rendered, so that pods of caches that do not use them do not change."""

    socket_dir: str
    name: str
    model: str
    tp_size: int
    pp_size: int
    dtype: str
    quantization: str
    weight_cache_mode: str
    weight_cache_fallback: str
    backend: str
    port: int
    served_model_name: str
    host: str
    ep_size: int | None = None
    revision: str | None = None
    weight_block_size: tuple[int, int] | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    dist_addr: str | None = None

    def to_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            env[engine_env_name(field.name)] = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EngineEnv:
        """The values ``to_env`` wrote; a required one missing or a number that does not parse is a
        ``ValueError`` that names the variable."""
        values: dict[str, object] = {}
        hints = get_type_hints(cls)
        for field in fields(cls):
            key = engine_env_name(field.name)
            if key not in env:
                if field.default is MISSING:
                    raise ValueError(f"{key} is not set: the operator renders it into every engine pod")
                continue
            text = env[key]
            kinds = {hints[field.name], *get_args(hints[field.name])}
            try:
                if int in kinds:
                    values[field.name] = int(text)
                elif tuple[int, int] in kinds:
                    values[field.name] = block(text)
                else:
                    values[field.name] = text
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise ValueError(f"{key}={text!r}: {exc}") from None
        return cls(**values)  # type: ignore[arg-type]
