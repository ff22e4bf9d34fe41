"""Dry-run planning: what every rank of a layout would hold, from config.json and safetensors headers.

This is the daemon's own planning — the same quantization allowlist, dtype resolution and
``pipeline.plan_rank`` — run for each rank of the world without reading a tensor byte, allocating
an arena or importing torch. It answers "will this fit on my GPUs" before anything is loaded: per
rank, the arena's bytes, its tensor count (FP8 ones among them), what a load would read from disk,
and, for a layout the tables refuse, the refusal and its fix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.plan_summary import PlanSummary

from .checkpoint import open_checkpoint
from .pipeline import plan_rank, resolve_dtype
from .quantization import resolve
from .sharding import Layout


@dataclass(frozen=True)
class RankPlan:
    rank: int
    tp_rank: int
    pp_rank: int
    layers: tuple[int, int] | None = None  # [start, stop) of the decoder layers this rank's stage owns
    tensors: int = 0
    fp8_tensors: int = 0
    arena_bytes: int = 0
    read_bytes: int = 0
    refused: str | None = None  # why the daemon would refuse this rank, with the fix


@dataclass(frozen=True)
class WorldPlan:
    model: str
    architecture: str
    tp_size: int
    pp_size: int
    ep_size: int
    quantization: str
    dtype: str
    checkpoint_bytes: int
    ranks: list[RankPlan] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.refused is None for r in self.ranks)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def plan_world(
    model: str,
    tp_size: int = 1,
    pp_size: int = 1,
    ep_size: int = 1,
    *,
    quantization: str = "none",
    weight_block_size: tuple[int, int] | None = None,
    dtype: str = "auto",
) -> WorldPlan:
    """Plan every rank of a tp × pp world (experts split over ``ep_size`` runs of each TP group); a rank the daemon would refuse carries the reason.

    Raises (instead of returning refused ranks) only for what no layout could fix: an unreadable
    checkpoint, an unsupported quantization or dtype, an impossible layout size.
    """
    # 1. config: the sizes, the quantization allowlist (first, as the daemon does), the checkpoint.
    Layout(tp_size, 0, pp_size, 0, ep_size)  # sizes < 1, and an ep that does not divide tp, are refused here, by name
    resolve(quantization, None, weight_block_size)
    checkpoint = open_checkpoint(model)
    quant = resolve(quantization, checkpoint.quantization_config, weight_block_size)
    resolved = resolve_dtype(dtype, checkpoint)
    ranks = []
    for rank in range(tp_size * pp_size):
        layout = Layout.from_rank(rank, tp_size, pp_size, ep_size)
        try:
            # 2.-4. layout rules, per-tensor parts, the rank's plan (pipeline.py)
            plan = plan_rank(checkpoint, layout, quant, resolved)
        except WeightCacheError as exc:
            ranks.append(RankPlan(rank, layout.tp_rank, layout.pp_rank, refused=str(exc)))
            continue
        ranks.append(
            RankPlan(
                rank,
                layout.tp_rank,
                layout.pp_rank,
                layers=(plan.layers.start, plan.layers.stop),
                tensors=len(plan.entries),
                fp8_tensors=sum(e.dtype == "float8_e4m3fn" for e in plan.entries),
                arena_bytes=plan.arena_bytes,
                read_bytes=plan.read_bytes,
            )
        )
    return WorldPlan(
        model=str(checkpoint.path),
        architecture=checkpoint.architecture,
        tp_size=tp_size,
        pp_size=pp_size,
        ep_size=ep_size,
        quantization=quant.method,
        dtype=resolved,
        checkpoint_bytes=sum(t.nbytes for t in checkpoint.tensors.values()),
        ranks=ranks,
    )


def render(world: WorldPlan) -> str:
    """A table: one row per rank, refusals in place of numbers."""
    gib = 2**30
    lines = [
        f"{world.model}: {world.architecture}, {world.checkpoint_bytes / gib:.2f} GiB of tensors; "
        f"tp={world.tp_size} pp={world.pp_size} ep={world.ep_size} dtype={world.dtype} "
        f"quantization={world.quantization}",
        f"{'rank':>4} {'tp':>3} {'pp':>3} {'layers':>9} {'tensors':>8} {'fp8':>6} {'arena GiB':>10} "
        f"{'reads GiB':>10}  refused",
    ]
    for r in world.ranks:
        if r.refused is not None:
            lines.append(
                f"{r.rank:>4} {r.tp_rank:>3} {r.pp_rank:>3} {'-':>9} {'-':>8} {'-':>6} {'-':>10} {'-':>10}  {r.refused}"
            )
            continue
        layers = f"{r.layers[0]}-{r.layers[1] - 1}" if r.layers and r.layers[1] > r.layers[0] else "-"
        lines.append(
            f"{r.rank:>4} {r.tp_rank:>3} {r.pp_rank:>3} {layers:>9} {r.tensors:>8} {r.fp8_tensors:>6} "
            f"{r.arena_bytes / gib:>10.3f} {r.read_bytes / gib:>10.3f}  no"
        )
    planned = [r for r in world.ranks if r.refused is None]
    if planned:
        lines.append(
            f"largest rank: {max(r.arena_bytes for r in planned) / gib:.3f} GiB; all ranks: "
            f"{sum(r.arena_bytes for r in planned) / gib:.3f} GiB"
        )
    refused = len(world.ranks) - len(planned)
    lines.append(f"{refused} of {len(world.ranks)} ranks refused" if refused else "every rank can be planned")
    return "\n".join(lines)


@dataclass(frozen=True)
class MemoryLimit:
    """What a node's ranks must fit in: each rank alone (``per_rank``: one GPU per rank) or all of
    them together (host memory, where cpu-shm arenas live), and what the number is, in words."""

    bytes: int
    what: str
    per_rank: bool


def _ranks_text(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``ranks 0-2, 5``."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def verdict(
    world: WorldPlan, local_ranks: list[int], limit: MemoryLimit | None, limit_why: str | None = None
) -> PlanSummary:
    """The plan's summary for the operator's status, or ``WeightCacheError`` with the refusal in one
    line: ranks the tables refuse (grouped by reason), then this node's ranks that cannot fit
    ``limit``. ``limit_why``: why there is no limit."""
    gib = 2**30
    refused: dict[str, list[int]] = {}
    for r in world.ranks:
        if r.refused is not None:
            refused.setdefault(r.refused, []).append(r.rank)
    if refused:
        count = sum(len(v) for v in refused.values())
        head = f"{count} of {len(world.ranks)} ranks refused: "
        if len(refused) == 1:
            raise WeightCacheError(head + next(iter(refused)))
        raise WeightCacheError(head + "; ".join(f"{_ranks_text(ranks)}: {why}" for why, ranks in refused.items()))
    by_rank = {r.rank: r.arena_bytes for r in world.ranks}
    mine = [by_rank[rank] for rank in local_ranks if rank in by_rank]
    if limit is not None and limit.per_rank:
        over = [rank for rank in local_ranks if by_rank.get(rank, 0) > limit.bytes]
        if over:
            raise WeightCacheError(
                f"{_ranks_text(over)} {'needs' if len(over) == 1 else 'need up to'} "
                f"{max(by_rank[r] for r in over) / gib:.2f} GiB, more than the {limit.bytes / gib:.2f} GiB of "
                f"{limit.what}; raise parallelism.tensor or parallelism.pipeline so that each rank holds less"
            )
    elif limit is not None and sum(mine) > limit.bytes:
        raise WeightCacheError(
            f"this node's {_ranks_text(local_ranks)} need {sum(mine) / gib:.2f} GiB together, more than "
            f"the {limit.bytes / gib:.2f} GiB of {limit.what}; spread the ranks over more nodes (parallelism.nodes) "
            "or give the node more memory"
        )
    return PlanSummary(
        ranks=len(world.ranks),
        max_rank_bytes=max(by_rank.values(), default=0),
        total_bytes=sum(by_rank.values()),
        node_bytes=sum(mine),
        limit_bytes=limit.bytes if limit is not None else None,
        limit=limit.what if limit is not None else limit_why,
    )
