"""Tensor-parallel communication: one process per rank, torch.distributed underneath.

``Group`` is what the model and the scheduler see: rank, size, all-reduce, all-gather and
broadcast. With one rank it does nothing at all, so the single-rank engine needs neither
torch.distributed nor a rendezvous. Every collective has a timeout (the process group's), so a
dead peer surfaces as an exception, never as a hang; rank 0 also sends heartbeats while idle
(see ``scheduler``) so that timeout can stay short.

Nothing here uses ``broadcast_object_list`` or any other object collective: those pickle, and
a pickle is code execution for whoever can write to the socket. Work is sent as int64 tensors;
the few structured messages (weight reports) travel as JSON bytes in uint8 tensors.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

import torch

log = logging.getLogger("weightcache.engine.parallel")


class Group:
    """The tensor-parallel group of this process."""

    def __init__(self, rank: int = 0, size: int = 1, serving: Any = None) -> None:
        self.rank = rank
        self.size = size
        # Serving collectives go through a group with a short timeout: a hung peer must surface
        # quickly. Start-up (rendezvous, the report exchange after loading) uses the default group,
        # whose long timeout tolerates ranks that load their shards at different speeds.
        self.serving = serving

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum partial results of a row-parallel linear across ranks (in place when possible)."""
        if self.size == 1:
            return tensor
        import torch.distributed as dist

        # Reduce in float32: gloo's half-precision support varies by build, and summing partials in
        # float32 keeps TP=N within rounding of TP=1.
        if tensor.dtype in (torch.bfloat16, torch.float16):
            wide = tensor.float()
            dist.all_reduce(wide, group=self.serving)
            return wide.to(tensor.dtype)
        dist.all_reduce(tensor, group=self.serving)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1, startup: bool = False) -> torch.Tensor:
        """Concatenate every rank's equally shaped part along ``dim`` (vocab-parallel logits)."""
        if self.size == 1:
            return tensor
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor.contiguous(), group=None if startup else self.serving)
        return torch.cat(parts, dim=dim)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's tensor into every rank's ``tensor`` (same shape and dtype everywhere)."""
        if self.size > 1:
            import torch.distributed as dist

            dist.broadcast(tensor, src=0, group=self.serving)
        return tensor

    def gather_json(self, value: Any) -> list[Any]:
        """Every rank's JSON-serialisable value, on every rank; JSON, not pickle, on the wire.

        Runs on the start-up group: it is the first collective after each rank has loaded its
        weights, so it waits as long as the slowest rank's load.
        """
        if self.size == 1:
            return [value]
        data = torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)
        sizes = self.all_gather(torch.tensor([data.numel()], dtype=torch.int64), dim=0, startup=True)
        padded = torch.zeros(int(sizes.max()), dtype=torch.uint8)
        padded[: data.numel()] = data
        joined = self.all_gather(padded, dim=0, startup=True).view(self.size, -1)
        return [json.loads(bytes(joined[r, : int(sizes[r])].tolist()).decode()) for r in range(self.size)]

    def close(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def init_group(rank: int, size: int, dist_addr: str, backend: str = "gloo", timeout_s: float = 30.0,
               startup_timeout_s: float = 1800.0) -> Group:
    """Join the rendezvous at ``host:port`` (rank 0 listens there); one rank needs none.

    ``startup_timeout_s`` bounds the rendezvous and the wait for the slowest rank's weights;
    ``timeout_s`` bounds every collective while serving.
    """
    if size == 1:
        return Group()
    import torch.distributed as dist

    if backend == "auto":
        backend = "gloo"  # the engine computes on CPU tensors; see docs/engine.md for the GPU plan
    host, _, port = dist_addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--dist-addr must be host:port, got {dist_addr!r}")
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=startup_timeout_s))
    serving = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=timeout_s), backend=backend)
    log.info("distributed group joined", extra={"fields": {"rank": rank, "size": size, "backend": backend,
                                                            "addr": dist_addr}})
    return Group(rank, size, serving)
