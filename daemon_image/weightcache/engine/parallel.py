"""Tensor-parallel communication: one process per rank, torch.distributed underneath.

``Group`` is what the model and the scheduler see. With one rank it does nothing at all, so
the single-rank engine needs neither torch.distributed nor a rendezvous. With several it holds
three process groups, because three kinds of traffic want different things:

- **compute** (``all_reduce``, ``all_gather``): the model's partial sums and logits, on the
  device the weights live on — gloo for CPU tensors, nccl for CUDA tensors;
- **control** (``exchange``, ``broadcast_tokens``): rank 0's step headers and token ids, always
  small CPU int64 tensors over gloo, with the short ``--dist-timeout`` so that a hung peer
  surfaces quickly (rank 0 also sends heartbeats while idle, see ``scheduler``);
- **start-up** (``gather_json``): the default group, with the long ``--startup-timeout``,
  because the first collective after loading waits for the slowest rank's shards.

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

    def __init__(self, rank: int = 0, size: int = 1, control: Any = None, compute: Any = None) -> None:
        self.rank = rank
        self.size = size
        self.control = control
        self.compute = compute

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum partial results of a row-parallel linear across ranks."""
        if self.size == 1:
            return tensor
        import torch.distributed as dist

        # Reduce in float32: gloo's half-precision support varies by build, and summing partials in
        # float32 keeps TP=N within rounding of TP=1.
        if tensor.dtype in (torch.bfloat16, torch.float16):
            wide = tensor.float()
            dist.all_reduce(wide, group=self.compute)
            return wide.to(tensor.dtype)
        dist.all_reduce(tensor, group=self.compute)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's equally shaped part along ``dim`` (vocab-parallel logits)."""
        if self.size == 1:
            return tensor
        return torch.cat(self._gather(tensor, self.compute), dim=dim)

    def exchange(self, header: torch.Tensor) -> torch.Tensor:
        """Rank 0's int64 header to everyone, as an all-reduce (others contribute zeros).

        An all-reduce needs every peer to answer, so a dead or hung rank turns into an exception on
        *every* side — including a rank 0 that is only sending heartbeats. A broadcast would not:
        its sender can finish before a receiver is found missing.
        """
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(header, group=self.control)
        return header

    def broadcast_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Rank 0's CPU int64 token ids into every rank's ``tokens`` (same length everywhere)."""
        if self.size > 1:
            import torch.distributed as dist

            dist.broadcast(tokens, src=0, group=self.control)
        return tokens

    def gather_json(self, value: Any) -> list[Any]:
        """Every rank's JSON-serialisable value, on every rank; JSON, not pickle, on the wire."""
        if self.size == 1:
            return [value]
        data = torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)
        sizes = torch.cat(self._gather(torch.tensor([data.numel()], dtype=torch.int64), None))
        padded = torch.zeros(int(sizes.max()), dtype=torch.uint8)
        padded[: data.numel()] = data
        parts = self._gather(padded, None)
        return [json.loads(bytes(parts[r][: int(sizes[r])].tolist()).decode()) for r in range(self.size)]

    def _gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return parts

    def close(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def init_group(
    rank: int,
    size: int,
    dist_addr: str,
    device: str = "cpu",
    timeout_s: float = 30.0,
    startup_timeout_s: float = 1800.0,
) -> Group:
    """Join the rendezvous at ``host:port`` (rank 0 listens there); one rank needs none.

    ``device`` is where the weights (and so the activations) live: "cpu" or "cuda[:n]"; it picks
    the compute backend. ``startup_timeout_s`` bounds the rendezvous and the wait for the slowest
    rank's weights; ``timeout_s`` bounds every collective while serving.
    """
    if size == 1:
        return Group()
    import torch.distributed as dist

    host, _, port = dist_addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--dist-addr must be host:port, got {dist_addr!r}")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=startup_timeout_s),
    )
    short = datetime.timedelta(seconds=timeout_s)
    ranks = list(range(size))
    control = dist.new_group(ranks, timeout=short, backend="gloo")
    compute_backend = "nccl" if device.startswith("cuda") else "gloo"
    compute = dist.new_group(ranks, timeout=short, backend=compute_backend)
    log.info(
        "distributed group joined",
        extra={
            "fields": {"rank": rank, "size": size, "compute": compute_backend, "control": "gloo", "addr": dist_addr}
        },
    )
    return Group(rank, size, control, compute)
