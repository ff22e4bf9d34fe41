"""Which node holds which ranks when an engine spans ``parallelism.nodes`` nodes.

The mapping (also in docs/operator.md):

1. The *selected* nodes are those the placement admits (``selected``): nodeSelector, the
   required node-affinity terms, and NoSchedule/NoExecute taints against the tolerations (not
   the cordon's, which DaemonSet pods tolerate: a node being drained keeps its slot).
2. They are sorted by name and cut into groups of ``nodes``; group ``g`` is nodes
   ``[g·nodes, (g+1)·nodes)``. A trailing incomplete group is idle (no daemon runs there).
3. Node ``k`` of a group has *slot* ``k`` and holds global ranks ``[k·rpn, (k+1)·rpn)``, with
   ranks per node ``rpn = tensor × pipeline / nodes`` (ranks numbered ``pp_rank × tensor + tp_rank``).

An engine pod running slot ``k``'s ranks may run on any node of slot ``k`` (they hold the same
ranks); the engine's pods need not come from one group. Adding a node whose name sorts before
others shifts the slots of those after it: their daemons move, like any change of daemon spec.
Here the selection only decides the *assignment*; the slot's DaemonSet still carries the
placement, so a node this module admits wrongly stays empty rather than running a daemon.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weightcache_operator.spec import Placement

HOSTNAME_LABEL = "kubernetes.io/hostname"
CORDON_TAINT = "node.kubernetes.io/unschedulable"
"""The taint a cordoned node gets. Every DaemonSet pod tolerates it (the DaemonSet controller adds
the toleration), so a cordon moves no daemon: a node being drained keeps its slot and its ranks."""


@dataclass(frozen=True)
class Topology:
    """``slots[k]``: the nodes holding slot ``k``'s ranks; ``idle``: selected nodes left over."""

    slots: list[list[str]]
    idle: list[str] = field(default_factory=list)

    def slot_of(self, node: str) -> int | None:
        return next((k for k, nodes in enumerate(self.slots) if node in nodes), None)


def assign_slots(nodes: list[str], per_group: int) -> Topology:
    """Sorted by name, cut into groups of ``per_group``; node ``k`` of each group gets slot ``k``."""
    ordered = sorted(set(nodes))
    complete = len(ordered) - len(ordered) % per_group
    slots: list[list[str]] = [ordered[k:complete:per_group] for k in range(per_group)]
    return Topology(slots=slots, idle=ordered[complete:])


def selected(placement: Placement, node: dict[str, Any]) -> bool:
    """Whether a node object (as the API returns it) is admitted by ``placement``."""
    labels = {**((node.get("metadata") or {}).get("labels") or {}), HOSTNAME_LABEL: node["metadata"]["name"]}
    if any(labels.get(k) != v for k, v in (placement.node_selector or {}).items()):
        return False
    node_affinity = (placement.affinity or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(_term_matches(term, labels) for term in terms):
        return False
    taints = (node.get("spec") or {}).get("taints") or []
    return all(
        _tolerated(taint, placement.tolerations or [])
        for taint in taints
        if taint.get("effect") in ("NoSchedule", "NoExecute") and taint.get("key") != CORDON_TAINT
    )


def _term_matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])


def _expression_matches(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expression.get("key", ""), expression.get("operator"), expression.get("values") or []
    value = labels.get(key)
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and value is not None and value.lstrip("-").isdigit() and values:
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    return False


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False
