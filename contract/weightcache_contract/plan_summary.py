"""What the daemon pod's ``plan`` init container tells the operator: the summary of the plan it
checked, as its termination message (``weightcache plan --verdict``).

The init container runs where the checkpoint is mounted, which the operator cannot read; the
operator already reads the pods, so the pod's ``status.initContainerStatuses[].state.terminated``
carries the verdict without any new permission: exit code 0 and this model as JSON when every
rank can be planned and fits, exit code 2 and the refusal (one line, with the fix) otherwise.
Small on purpose: a termination message is cut to a few KiB, so it is a summary, never a row per
rank.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PLAN_CONTAINER = "plan"
"""The init container's name in the daemon pod."""


class PlanSummary(BaseModel):
    """The plan of the whole world (every rank of tensor × pipeline) and of this node's ranks."""

    # A newer daemon image may say more; an older operator reads the rest.
    model_config = ConfigDict(extra="ignore", frozen=True)

    ranks: int = Field(ge=0)
    """Ranks in the world (tensor × pipeline)."""
    max_rank_bytes: int = Field(ge=0)
    """The largest rank's arena."""
    total_bytes: int = Field(ge=0)
    """Every rank's arena together: one copy of the model as the ranks hold it."""
    node_bytes: int = Field(ge=0)
    """This node's ranks' arenas together."""
    limit_bytes: int | None = Field(default=None, ge=0)
    """What the node's ranks were checked against (per rank on a GPU, together on the host); null
    when the planner could not learn a limit (``limit`` says why)."""
    limit: str | None = None
    """What ``limit_bytes`` is, or why there is none, in words."""
