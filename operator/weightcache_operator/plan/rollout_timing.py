"""A rollout's time per replica (``status.rollout.replicas``): how long the replica's new engine
took to start, how long the operator then took to promote it, and how long its old engines took
to drain. Pure: the previous list, this pass's rollout plan (rollout/) and the engine pods in,
the new list out; the status carries it from pass to pass, so an operator restart keeps it.

- ``startSeconds``: the new engine's creation → Ready, from its pod (engine_start.py; the API's
  timestamps, whole seconds).
- ``promotedAt``, ``promotionSeconds``: when the pass that relabelled it active began, and how
  long after its Ready that was (a pass runs on the pod's Ready event, so this is the operator's
  reaction, not a wait).
- ``retiredAt``, ``drainSeconds``: when the pass that first deleted one of the replica's old
  engines began, and how long until none of them was left (terminating ones included: a
  draining engine finishes its requests before it goes).

``promotedAt`` and ``retiredAt`` are the operator's clock to the millisecond, so that
``drainSeconds`` is not rounded to the API's whole seconds.
"""

from __future__ import annotations

from datetime import datetime

from weightcache_operator.objects import Object, PodView, truncated
from weightcache_operator.observe.engine_start import engine_start
from weightcache_operator.plan.rollout.decisions import Plan, promoted, retired
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.spec import RolloutReplicaStatus, RolloutStatus


def replica_timings(
    previous: RolloutStatus | None, steps: Plan, want: Desired, engines: list[Object], now: datetime
) -> list[RolloutReplicaStatus]:
    """The replicas' entries after this pass. ``previous``: the last ``status.rollout`` (its
    entries are kept while it rolls out the same engine template and daemon generation);
    ``engines``: the cache's engine pods as the pass left them. An entry has only the fields it
    knows set (``wire`` writes those); a kept one is copied, never changed in place."""
    same = previous is not None and (previous.engine_template_hash, previous.daemon_spec_hash) == (
        want.engine_hash,
        want.daemon_hash,
    )
    entries = {e.replica: e for e in (previous.replicas if previous is not None and same else [])}
    # Times on the wire's millisecond: what the next pass reads back, and computes drains from.
    at = truncated(now, "milliseconds")
    by_name = {PodView(p).name: p for p in engines}
    promoted_now: set[int] = set()
    for name in promoted(steps):
        pod = by_name.get(name)
        replica = PodView(pod).replica if pod is not None else None
        if pod is None or replica is None or replica in promoted_now:
            continue  # a group's head pod comes first and names it
        promoted_now.add(replica)
        entry = RolloutReplicaStatus(replica=replica, engine=name, promoted_at=at)
        start = engine_start(pod)
        if start is not None:
            waited = round(max((now - start.ready_at).total_seconds(), 0.0), 3)
            entry = entry.model_copy(update={"start_seconds": start.total, "promotion_seconds": waited})
        entries[replica] = entry
    drained = {PodView(by_name[n]).replica for n in retired(steps) if n in by_name}
    for replica, entry in entries.items():
        if entry.retired_at is None and replica in drained:
            entry = entries[replica] = entry.model_copy(update={"retired_at": at})
        since = entry.retired_at
        if since is not None and entry.drain_seconds is None and not _old_left(want, engines, replica):
            seconds = round(max((now - since).total_seconds(), 0.0), 3)
            entries[replica] = entry.model_copy(update={"drain_seconds": seconds})
    return [entries[r] for r in sorted(entries)]


def _old_left(want: Desired, engines: list[Object], replica: int) -> bool:
    """Any engine of ``replica`` of another template or generation, terminating ones included."""
    return any(
        view.replica == replica and (view.engine_hash != want.engine_hash or view.spec_hash != want.daemon_hash)
        for view in map(PodView, engines)
    )
