"""How our processes launch each other, and how they read what they were launched with.

Every flag of ours is one ``Option`` below, and every command line or environment one of our
processes gives another is a typed dataclass whose fields take those options (``options.py``):

- ``DaemonArgs``: ``weightcache daemon`` — the operator's daemon pods, the ``--ranks`` launcher's
  ranks, a publisher's exec into the serving daemon, the reference engine's daemon mode, benchmarks;
- ``KeeperArgs``: ``weightcache keeper`` — the daemon pod's keeper sidecar;
- ``PlanArgs``: ``weightcache plan`` — the daemon pod's planning init container;
- ``EngineArgs``: ``weightcache engine`` (the reference engine) — the operator's engine pods, as
  ``WEIGHTCACHE_ENGINE_*`` variables, and the engine launcher's ranks;
- ``WarmArgs``: ``weightcache warm`` — the engine pod's warm sidecar.
- ``ArtifactsRunArgs``: ``weightcache artifacts-run`` — an engine on the node's compile artifacts.

The receiving process builds its parser from the dataclass (``add_options``), the producer renders
from that same parser (``to_argv``, ``to_env``), and ``from_namespace`` reads the parse back: a flag
is spelled once, and a test parses every rendered command with the receiving parser. An engine's
own flags (vLLM's) live in that engine's profile, not here. Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.options import Option, add_options, argv, environment, from_namespace, options_of, takes

LOAD_FORMAT = "weightcache"
"""The model loader the weightcache plug-ins register with the engines (``--load-format weightcache``:
vLLM's entry point ``vllm.general_plugins``, SGLang's ``sglang.srt.plugins``)."""
REFERENCE_PROFILE = "reference"
"""The daemon's own loader, for the reference engine and transformers."""
VLLM_PROFILE = "vllm"
"""The daemon's load profile whose arenas hold vLLM's post-processed parameters."""
SGLANG_PROFILE = "sglang"
"""The daemon's load profile whose arenas hold SGLang's post-processed parameters."""
PROFILES = (REFERENCE_PROFILE, SGLANG_PROFILE, VLLM_PROFILE)
"""The load profiles the data plane builds in; ``--profile`` takes any the daemon has registered
(``weightcache.profiles``), which refuses an unknown name with the known ones."""
LOAD_WORKERS = 4
"""``--load-workers``' default: threads a daemon rank reads and post-processes tensors with."""
CHECKPOINT_POLL_SECONDS = 5.0
"""``--checkpoint-poll-seconds``' default: how often a daemon rank stats its checkpoint."""
VLLM_REPLAY_KERNEL_ENV = {"VLLM_USE_DEEP_GEMM": "0"}
"""vLLM's environment under which its block-FP8 post-processing on NVIDIA GPUs only re-wraps the
weights it loaded: without DeepGEMM, CUTLASS's block-FP8 linear kernel and the Triton MoE take them as
they are, where DeepGEMM requantises them in place (UE8M0), which a read-only mapping refuses. vLLM
0.26 replays post-processing on the mapped weights (``weightcache/vllm/versions.py``), so the operator
sets this on the daemons and the engines of every vLLM cache on GPUs, and a quantized model's vLLM
fingerprint carries the kernel environment, so sides that differ never share an arena."""
ENGINE_ENV_PREFIX = "WEIGHTCACHE_ENGINE_"
"""Every engine setting in the environment is ``ENGINE_ENV_PREFIX`` + its flag, upper case, ``_`` for ``-``."""


def engine_env_name(flag: str) -> str:
    """``--tp-size`` (or ``tp-size``, ``tp_size``) → ``WEIGHTCACHE_ENGINE_TP_SIZE``."""
    return ENGINE_ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


ENGINE_IMAGE_ENV = engine_env_name("image")
"""The engine container's image, part of its compile artifacts' key: the operator sets it on engines
of caches with ``artifactCache``, the vLLM plug-in reads it (``vllm/artifacts.py``)."""


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


def json_strings(text: str) -> tuple[str, ...]:
    """``--engine-args``: a JSON list of strings (what the list asks the engine for is its own parser's
    to check, in the daemon's engine profile)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise WeightCacheError(f"{ENGINE_ARGS.flag} is not JSON ({exc}); pass a JSON list of strings") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WeightCacheError(
            f'{ENGINE_ARGS.flag} is a JSON list of strings, e.g. ["--dtype", "bfloat16"]; got {text!r}'
        )
    return tuple(value)


# --- the options ---------------------------------------------------------------------------------

MODEL = Option("--model", required=True, help="checkpoint directory (Hugging Face layout)")
DTYPE = Option("--dtype", default="auto", help="auto (from config.json), bfloat16, float16 or float32")
QUANTIZATION = Option("--quantization", default="none", help="none or fp8 (block-wise)")
WEIGHT_BLOCK_SIZE = Option("--weight-block-size", type=block, help="fp8 block, default 128,128")
REVISION = Option("--revision", default="", help="model revision recorded in the fingerprint")
BACKEND = Option(
    "--backend", help="arena backend: cpu-shm, cuda-vmm or cuda-ipc (default: cuda-vmm with a GPU, else cpu-shm)"
)
DEVICE = Option("--device", type=int, default=0, help="CUDA ordinal of this rank's GPU (GPU backends)")
TP_SIZE = Option("--tp-size", type=int, default=1, help="tensor-parallel size")
TP_RANK = Option("--tp-rank", type=int, default=0, help="this rank's tensor-parallel rank")
PP_SIZE = Option("--pp-size", type=int, default=1, help="pipeline-parallel size")
PP_RANK = Option("--pp-rank", type=int, default=0, help="this rank's pipeline-parallel rank")
EP_SIZE = Option(
    "--ep-size",
    type=int,
    default=1,
    help="expert-parallel size (MoE; divides --tp-size): each run of tp/ep ranks holds 1/ep of the experts "
    "whole instead of a slice of every expert",
)
RANKS = Option("--ranks", type=ranks, show=format_ranks, help="global ranks, e.g. 0-3 or 0,2")
SOCKET_DIR = Option("--socket-dir", help="directory holding <name>/rank-N.sock")
NAME = Option("--name", help="the cache's name")
KEEPER = Option(
    "--keeper",
    default="auto",
    choices=("auto", "off"),
    help="auto: deposit with / re-adopt from <socket-dir>/keeper.sock when a keeper listens",
)
STATUS_ADDR = Option(
    "--status-addr",
    metavar="HOST:PORT",
    help="serve GET /status (JSON) and GET /metrics (Prometheus) for the local ranks here; off unless given "
    "(the operator sets $(POD_IP):9400)",
)
GPUS_FILE = Option(
    "--gpus-file",
    metavar="FILE",
    help="GPU backends: the GPU holder's grant (gpus.json); local rank i uses its i-th GPU, found by UUID "
    "(waits until a running holder has written it); overrides --device",
)
PROFILE = Option(
    "--profile",
    default=REFERENCE_PROFILE,
    metavar="{" + ",".join(PROFILES) + ",...}",
    help="the load profile: reference: weightcache's own loader (engines: the reference engine, transformers); "
    f"vllm: vLLM's loader and post-processing for this rank, for engines run with --load-format {LOAD_FORMAT} "
    "(needs --engine-args; see docs/vllm.md)",
)
ENGINE_ARGS = Option(
    "--engine-args",
    metavar="JSON",
    show=lambda args: json.dumps(list(args)),
    read=json_strings,
    help="engine profiles (--profile vllm): a JSON list of the engine arguments the engine gets after its "
    'model (`vllm serve MODEL <list>`, e.g. \'["--dtype","bfloat16","--tensor-parallel-size","2"]\'), '
    "parsed by the engine's own parser; the arena's fingerprint comes from them",
)
ARTIFACT_DIR = Option(
    "--artifact-dir",
    metavar="DIR",
    help="keep the node's engine compile artifacts here: publish what engines run under `weightcache "
    "artifacts-run` staged, evict beyond --artifact-max-bytes, report hits in /status (docs/vllm.md, "
    "Compile artifacts); off unless given",
)
ARTIFACT_MAX_BYTES = Option(
    "--artifact-max-bytes",
    type=int,
    default=8 << 30,
    metavar="N",
    help="the bound on --artifact-dir's published entries; least recently used ones go first",
)
LOAD_WORKERS_OPTION = Option(
    "--load-workers", type=int, default=LOAD_WORKERS, help="threads reading and post-processing tensors"
)
SYNTHETIC_FILL = Option(
    "--synthetic-fill",
    kind="switch",
    help="benchmarks only (weightcache bench --synthetic): fill the arena with a byte pattern instead of reading "
    "the checkpoint; the fingerprint's revision becomes 'synthetic-fill:<revision>', so no engine expecting the "
    "real weights maps it",
)
SOCKET_GROUP = Option("--socket-group", help="group allowed to connect (socket mode 0660)")
CHECKPOINT_POLL = Option(
    "--checkpoint-poll-seconds",
    type=float,
    default=CHECKPOINT_POLL_SECONDS,
    metavar="S",
    help="how often each rank stats its checkpoint to report (and, for equal bytes under a new file identity, "
    "adopt) a change on disk; inotify wakes it sooner on Linux; 0 turns the watch off",
)
ALLOW_UID = Option("--allow-uid", type=int, kind="append", help="extra uid allowed to connect")
ALLOW_GID = Option("--allow-gid", type=int, kind="append", help="extra gid allowed to connect")
ENGINE_ACCESS = Option(
    "--engine-access",
    default="read-only",
    choices=("read-only", "read-write"),
    help="how engines map the arena (read-write: cuda-vmm only, opt-in, part of the fingerprint)",
)
LOCAL_INDEX = Option(
    "--local-index",
    type=int,
    default=0,
    help="this rank's position among the pod's local ranks, picking its GPU of --gpus-file (the --ranks "
    "launcher sets it)",
)
SEED_LISTEN = Option(
    "--seed-listen",
    metavar="HOST:PORT",
    help="serve this daemon's ranks to starting peers of the same cache (local rank i on PORT+i); needs "
    "--seed-credential-file; off unless given (the operator sets $(POD_IP):9410)",
)
SEED_PEERS_FILE = Option(
    "--seed-peers-file",
    metavar="FILE",
    help="peers to copy this rank from before reading the disk (JSON, weightcache_contract.seeding.SeedPeers; "
    "the operator mounts it from a ConfigMap); needs --seed-credential-file",
)
SEED_CREDENTIAL_FILE = Option(
    "--seed-credential-file",
    metavar="FILE",
    help="the cache's seeding credential (at least 32 bytes; the operator mounts it from a Secret): only "
    "holders may fetch from or serve to this daemon",
)
SEED_MAX_MIB_S = Option(
    "--seed-max-mib-s",
    type=float,
    default=0.0,
    help="cap on the bytes per second this daemon's ranks serve to peers, each (MiB/s; 0: no cap)",
)
SEED_MAX_CLIENTS = Option(
    "--seed-max-clients", type=int, default=2, help="daemons one rank seeds at once; more are told to try later"
)
SEED_STREAMS = Option("--seed-streams", type=int, default=4, help="TCP connections one seed uses in parallel")
SEED_STALL_SECONDS = Option(
    "--seed-stall-seconds",
    type=float,
    default=10.0,
    help="a peer that answers nothing for this long, or sends slower than --seed-min-mib-s over it, is given "
    "up for the next peer or the disk",
)
SEED_MIN_MIB_S = Option(
    "--seed-min-mib-s",
    type=float,
    default=1.0,
    help="the slowest a seeding peer may send (MiB/s) before it is given up",
)
NODE_NAME = Option(
    "--node-name", metavar="NAME", help="this daemon's node: peers on it are not seeds (the operator sets $(NODE_NAME))"
)
DIST_INIT = Option("--dist-init", metavar="tcp://HOST:PORT", hidden=True)
"""Set by the ``--ranks`` launcher for an engine profile that loads a world's ranks together: their
loopback rendezvous (the ``vllm`` profile's gloo world)."""
HANDOFF_STATE = Option("--handoff-state", hidden=True)
"""Set by a publisher's exec into the serving daemon (``daemon.handoff``)."""


def add_checkpoint_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """What a checkpoint is read as, for commands of ours that read one."""
    return [o.add_to(p) for o in (MODEL, DTYPE, QUANTIZATION, WEIGHT_BLOCK_SIZE)]


def add_model_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """``add_checkpoint_args`` and what a fingerprint takes beyond them."""
    return [*add_checkpoint_args(p), *(o.add_to(p) for o in (REVISION, BACKEND, DEVICE))]


def add_cache_args(p: argparse.ArgumentParser, socket_dir: str, required: bool) -> list[argparse.Action]:
    """Which cache: ``--socket-dir`` (default ``socket_dir``) and ``--name``."""
    return [
        SOCKET_DIR.add_to(p, default=socket_dir),
        NAME.add_to(p, required=required, default=None if required else "default"),
    ]


class Launch:
    """One command line of ours, typed: a frozen dataclass whose fields take ``Option``s. ``ALWAYS``
    names fields written even at their defaults (what every such command line names)."""

    ALWAYS: ClassVar[tuple[str, ...]] = ()

    def to_argv(self) -> list[str]:
        return argv(self, always=self.ALWAYS)

    def but(self: L, **changes: Any) -> L:
        """A copy with ``changes`` (another rank's, a child's)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def from_namespace(cls: type[L], args: argparse.Namespace, **overrides: Any) -> L:
        """The typed values of a parse of this command (``overrides``: fields given instead)."""
        return from_namespace(cls, args, **overrides)


L = TypeVar("L", bound=Launch)


# --- weightcache daemon ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DaemonArgs(Launch):
    """``weightcache daemon``'s flags, typed, in the order its command line lists them.

    ``to_argv`` writes what is set and not at the parser's default, plus the flags every daemon
    command names (``ALWAYS``): a cache's pods do not change when an option it does not use is
    added. An engine profile (``vllm``) takes dtype and quantization from ``engine_args`` (the daemon
    refuses the reference loader's flags for them), so only the reference profile always writes those."""

    model: str = takes(MODEL)
    dtype: str = takes(DTYPE)
    quantization: str = takes(QUANTIZATION)
    weight_block_size: tuple[int, int] | None = takes(WEIGHT_BLOCK_SIZE)
    revision: str = takes(REVISION)
    backend: str | None = takes(BACKEND)
    tp_size: int = takes(TP_SIZE)
    pp_size: int = takes(PP_SIZE)
    tp_rank: int = takes(TP_RANK)
    pp_rank: int = takes(PP_RANK)
    ep_size: int = takes(EP_SIZE)
    ranks: tuple[int, ...] | None = takes(
        RANKS, help="launch one process per listed global rank (e.g. 0-3) instead of one rank"
    )
    socket_dir: str = takes(SOCKET_DIR, required=True)
    name: str = takes(NAME, required=True)
    keeper: str = takes(KEEPER)
    status_addr: str | None = takes(STATUS_ADDR)
    gpus_file: str | None = takes(GPUS_FILE)
    profile: str = takes(PROFILE)
    engine_args: tuple[str, ...] | None = takes(ENGINE_ARGS)
    artifact_dir: str | None = takes(ARTIFACT_DIR)
    # Bounds only an --artifact-dir: unset (not written) without one.
    artifact_max_bytes: int | None = takes(ARTIFACT_MAX_BYTES, unset=None)
    load_workers: int = takes(LOAD_WORKERS_OPTION)
    synthetic_fill: bool = takes(SYNTHETIC_FILL)
    socket_group: str | None = takes(SOCKET_GROUP)
    checkpoint_poll_seconds: float = takes(CHECKPOINT_POLL)
    device: int = takes(DEVICE)
    local_index: int = takes(LOCAL_INDEX)
    allow_uid: tuple[int, ...] = takes(ALLOW_UID)
    allow_gid: tuple[int, ...] = takes(ALLOW_GID)
    engine_access: str = takes(ENGINE_ACCESS)
    seed_listen: str | None = takes(SEED_LISTEN)
    seed_peers_file: str | None = takes(SEED_PEERS_FILE)
    seed_credential_file: str | None = takes(SEED_CREDENTIAL_FILE)
    seed_max_mib_s: float = takes(SEED_MAX_MIB_S)
    seed_max_clients: int = takes(SEED_MAX_CLIENTS)
    seed_streams: int = takes(SEED_STREAMS)
    seed_stall_seconds: float = takes(SEED_STALL_SECONDS)
    seed_min_mib_s: float = takes(SEED_MIN_MIB_S)
    node_name: str | None = takes(NODE_NAME)
    dist_init: str | None = takes(DIST_INIT)
    handoff_state: str | None = takes(HANDOFF_STATE)

    ALWAYS = ("model", "tp_size", "pp_size", "socket_dir", "name", "keeper", "artifact_max_bytes")
    """Written even at their defaults (``artifact_max_bytes`` whenever set)."""

    def to_argv(self) -> list[str]:
        always = self.ALWAYS + (("dtype", "quantization") if self.profile == REFERENCE_PROFILE else ())
        return argv(self, always=always)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, **overrides: Any) -> DaemonArgs:
        if "artifact_max_bytes" not in overrides and getattr(args, "artifact_dir", None) is None:
            overrides["artifact_max_bytes"] = None
        return from_namespace(cls, args, **overrides)


def add_daemon_arguments(d: argparse.ArgumentParser, socket_dir: str) -> list[argparse.Action]:
    """``weightcache daemon``'s parser; ``socket_dir``: ``--socket-dir``'s default (the data plane's
    ``default_socket_dir``, which reads the environment: the contract does not)."""
    return add_options(d, DaemonArgs, defaults={"socket_dir": socket_dir})


# --- weightcache keeper ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KeeperArgs(Launch):
    """``weightcache keeper``'s flags (``--socket-dir`` left out: the data plane's default)."""

    socket_dir: str | None = takes(SOCKET_DIR)
    allow_uid: tuple[int, ...] = takes(ALLOW_UID)
    allow_gid: tuple[int, ...] = takes(ALLOW_GID)


def add_keeper_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return add_options(p, KeeperArgs)


# --- weightcache plan ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PlanArgs(Launch):
    """``weightcache plan``: the daemon's planner over a whole world, without loading. The layout
    flags are spelled short here (``--tp-size`` etc. still parse), as people type them at a prompt
    and as the operator's daemon pods have always run them."""

    model: str = takes(MODEL)
    dtype: str = takes(DTYPE)
    quantization: str = takes(QUANTIZATION)
    weight_block_size: tuple[int, int] | None = takes(WEIGHT_BLOCK_SIZE)
    tp_size: int = takes(TP_SIZE, flag="--tp", aliases=("--tp-size",))
    pp_size: int = takes(PP_SIZE, flag="--pp", aliases=("--pp-size",))
    ep_size: int = takes(EP_SIZE, flag="--ep", aliases=("--ep-size",), help="expert-parallel size (MoE; divides --tp)")
    json: bool = takes(Option("--json", kind="switch", help="print the plan as JSON instead of a table"))
    verdict: bool = takes(
        Option(
            "--verdict",
            kind="switch",
            help="the daemon pod's init container: exit 2 with the refusal when a rank is refused or this node's "
            "ranks (--ranks) do not fit (--fit); else write the plan's summary as JSON to the termination message",
        )
    )
    ranks: tuple[int, ...] | None = takes(RANKS, help="with --verdict: this node's ranks (default: all)")
    fit: str | None = takes(
        Option(
            "--fit",
            choices=("gpu", "host"),
            help="with --verdict: check each of this node's ranks against the largest GPU NVML sees here (gpu), or "
            "all of them together against the host's RAM and --memory-limit (host, where cpu-shm arenas live)",
        )
    )
    memory_limit: int | None = takes(
        Option("--memory-limit", type=int, help="with --fit host: the daemon container's memory limit, bytes")
    )

    ALWAYS = ("model", "dtype", "quantization", "tp_size", "pp_size", "ep_size")


def add_plan_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return add_options(p, PlanArgs)


# --- weightcache engine (the reference engine) -------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EngineArgs(Launch):
    """``weightcache engine``'s flags. Each can also come from the environment, as
    ``engine_env_name`` of its flag (``--tp-size`` → ``WEIGHTCACHE_ENGINE_TP_SIZE``); the operator
    renders engine pods' settings that way (``to_env``), and a launcher its ranks' command lines
    (``to_argv``). Without ``tp_rank`` the engine launches all of its node's ranks."""

    socket_dir: str | None = takes(SOCKET_DIR, help="daemon socket directory (default: the daemon's default)")
    name: str | None = takes(NAME)
    model: str | None = takes(MODEL, required=False)
    tp_size: int = takes(TP_SIZE, help="tensor-parallel size: number of rank processes (on all nodes together)")
    dtype: str = takes(DTYPE)
    quantization: str = takes(QUANTIZATION)
    weight_cache_mode: str = takes(
        Option(
            "--weight-cache-mode",
            default="off",
            help="off (disk), client (map from a running daemon) or daemon (spawn daemons)",
        )
    )
    weight_cache_fallback: str = takes(
        Option(
            "--weight-cache-fallback", default="disk", help="client/daemon mode without a matching cache: disk or error"
        )
    )
    backend: str = takes(
        BACKEND,
        default="cpu-shm",
        help="arena backend; with a GPU backend (cuda-vmm, cuda-ipc) the engine computes on the GPU that holds "
        "the weights, one GPU per rank, and all-reduces with nccl",
    )
    port: int = takes(Option("--port", type=int, default=8000, help="HTTP port (rank 0)"))
    served_model_name: str | None = takes(
        Option("--served-model-name", help="model id in the API (default: the checkpoint directory's name)")
    )
    host: str = takes(Option("--host", default="127.0.0.1", help="HTTP listen address (rank 0)"))
    ep_size: int = takes(
        EP_SIZE,
        help="expert-parallel size (MoE; divides tp-size): each run of tp/ep ranks holds 1/ep of the experts "
        "whole; 1 splits every expert over all ranks. Must match the daemon's --ep-size",
    )
    revision: str = takes(REVISION)
    weight_block_size: tuple[int, int] | None = takes(WEIGHT_BLOCK_SIZE)
    nnodes: int = takes(
        Option(
            "--nnodes",
            type=int,
            default=1,
            help="nodes the engine spans; each runs tp-size / nnodes ranks under its own launcher",
        )
    )
    node_rank: int = takes(
        Option(
            "--node-rank",
            type=int,
            default=0,
            help="this node's place: it runs ranks [node-rank·r, (node-rank+1)·r), r = tp-size / nnodes; node 0 "
            "runs rank 0, which serves HTTP",
        )
    )
    dist_addr: str | None = takes(
        Option(
            "--dist-addr",
            help="host:port where rank 0 hosts the rendezvous (default: a free local port; required with "
            "--nnodes > 1: node 0's address, reachable from the other nodes)",
        )
    )
    dist_timeout: float = takes(
        Option(
            "--dist-timeout",
            type=float,
            default=30.0,
            help="seconds a collective may wait for a peer while serving before the engine fails",
        )
    )
    startup_timeout: float = takes(
        Option(
            "--startup-timeout",
            type=float,
            default=1800.0,
            help="seconds ranks may wait for each other at start-up (rendezvous, loading)",
        )
    )
    max_model_len: int | None = takes(
        Option("--max-model-len", type=int, help="context length (default and maximum: max_position_embeddings)")
    )
    max_active: int = takes(
        Option("--max-active", type=int, default=8, help="requests decoded concurrently (interleaved token by token)")
    )
    max_queue: int = takes(
        Option("--max-queue", type=int, default=64, help="requests admitted or waiting before new ones get 429")
    )
    drain_timeout: float = takes(
        Option("--drain-timeout", type=float, default=30.0, help="seconds SIGTERM waits for in-flight requests")
    )
    threads: int | None = takes(
        Option(
            "--threads",
            type=int,
            help="torch threads per rank (default: 1 per rank when tp > 1, else torch's default)",
        )
    )
    daemon_timeout: float = takes(
        Option(
            "--daemon-timeout",
            type=float,
            default=600.0,
            help="daemon mode: seconds to wait for spawned daemons to become ready",
        )
    )
    tp_rank: int | None = takes(TP_RANK, default=None, help="run only this rank (default: launch all ranks)")

    OPERATOR_ALWAYS = (
        "socket_dir",
        "name",
        "model",
        "tp_size",
        "dtype",
        "quantization",
        "weight_cache_mode",
        "weight_cache_fallback",
        "backend",
        "port",
        "served_model_name",
        "host",
    )
    """What every engine pod's environment says, even at an engine default: the cache it maps and how
    it serves it, so that a pod reads the same whatever the engine image's defaults are."""

    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable of a field (``tp_size`` → ``WEIGHTCACHE_ENGINE_TP_SIZE``), for messages."""
        return engine_env_name(next(o.flag for o in options_of(cls) if o.dest == field))

    def to_env(self) -> dict[str, str]:
        """The values set (and ``OPERATOR_ALWAYS``) as ``WEIGHTCACHE_ENGINE_*`` variables; a member
        of an engine spanning nodes names its node, node 0 too."""
        group = ("node_rank",) if self.nnodes > 1 else ()
        return environment(self, engine_env_name, always=self.OPERATOR_ALWAYS + group)

    def to_argv(self) -> list[str]:
        """Every value as a flag: the child's environment must not override what its launcher parsed."""
        return argv(self, every=True)


def add_engine_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """``weightcache engine``'s parser: every flag also read from its ``engine_env_name``."""
    return add_options(p, EngineArgs, env=engine_env_name)


# --- weightcache warm ------------------------------------------------------------------------------

WARM_ENGINE = Option(
    "--engine-url", required=True, metavar="http://HOST:PORT", help="the engine this sidecar warms (its pod's own)"
)
WARM_HEALTH_PATH = Option("--health-path", default="/health", help="the engine's readiness path (GET, 200 when up)")
WARM_REQUEST_PATH = Option("--request-path", default="/v1/completions", help="where the warm request goes (POST)")
WARM_REQUEST = Option(
    "--request",
    default='{"prompt": "warm", "max_tokens": 1, "temperature": 0}',
    help="the warm request's JSON body: what a client sends, one generated token",
)
WARM_HOST = Option("--host", default="127.0.0.1", help="address the sidecar's /ready listens on (the pod's IP)")
WARM_PORT = Option("--port", type=int, default=8009, help="port of the sidecar's /ready")
WARM_EVERY = Option(
    "--every",
    type=float,
    default=30.0,
    help="seconds between keep-warm requests once warm (0: warm once per engine start)",
)
WARM_TIMEOUT = Option("--timeout", type=float, default=60.0, help="seconds one warm request may take")


@dataclass(frozen=True, kw_only=True)
class WarmArgs(Launch):
    """``weightcache warm``: the engine pod's sidecar whose readiness (the pod's, with the engine's
    own) says the engine has answered a real request since it last came up, then keeps it so."""

    engine_url: str = takes(WARM_ENGINE)
    health_path: str = takes(WARM_HEALTH_PATH)
    request_path: str = takes(WARM_REQUEST_PATH)
    request: str = takes(WARM_REQUEST)
    host: str = takes(WARM_HOST)
    port: int = takes(WARM_PORT)
    every: float = takes(WARM_EVERY)
    timeout: float = takes(WARM_TIMEOUT)

    ALWAYS = ("engine_url", "host", "port")


def add_warm_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return add_options(p, WarmArgs)


# --- weightcache artifacts-run ---------------------------------------------------------------------

ARTIFACTS_RUN_DIR = Option("--dir", required=True, help="the node's artifact directory (entries/ and staging/)")
ARTIFACTS_RUN_HEALTH = Option(
    "--health", required=True, metavar="URL", help="the engine's health URL: 200 once it serves"
)


@dataclass(frozen=True, kw_only=True)
class ArtifactsRunArgs(Launch):
    """``weightcache artifacts-run``: the wrapper an engine command runs under, which stages the
    engine's compile caches on the node (the profile's engine decides which caches those are) and
    marks them for publication once the engine is healthy. The engine's command follows ``--``."""

    dir: str = takes(ARTIFACTS_RUN_DIR)
    health: str = takes(ARTIFACTS_RUN_HEALTH)
    profile: str = takes(PROFILE, help="the engine's load profile: whose compile caches are staged")

    ALWAYS = ("dir", "health", "profile")


def add_artifacts_run_arguments(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return add_options(p, ArtifactsRunArgs)
