"""Why a node's daemon or an engine is not ready, in the words of the process that knows, for the
conditions, the events and ``kubectl get wc``. Pure: pods and reports in, lines out.

A node's reason, most telling first:

1. a container of its daemon pod (daemon, keeper, the ``plan`` init container) that exited with
   an error: its termination message (the weightcache CLI writes its error there; other crashes
   leave their log's tail);
2. a container of the node's GPU holder pod that exited with an error (the daemons wait for its
   grant, so its error is theirs);
3. the daemon's own status report: what its first unready rank says it is doing or waiting for.

1 and 2 are *refusals* when the process exited with code 2, the weightcache CLI's code for an
error in input, configuration or environment: it gave up on this spec, and will again. A process
killed (137, 143) or one that crashed on a bug (1) is a reason but no refusal. When every node
refuses the spec for the same reason, retrying will not help, and the phase says Failed (status.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from weightcache_contract.daemon_report import DaemonReport

from weightcache_operator.objects import Object, pod_ready
from weightcache_operator.spec import Condition

REFUSED_EXIT = 2
"""The weightcache CLI's exit code for errors in input, configuration or environment (cli.py)."""
MAX_REASON = 512
"""Characters of one reason kept in a condition message (a log tail can be 2 KiB)."""
FAILING_REASONS = frozenset({"DaemonsFailing", "Refused", "EnginesFailing", "FilesChanged", "Reloading"})
"""Reasons of DaemonsReady and EnginesReady whose message names failed processes, and of
CheckpointChanged whose message names changed files: each new message is also an Event (the
phase's own Event says the summary)."""
EVENT_CONDITIONS = frozenset({"DaemonsReady", "EnginesReady", "CheckpointChanged"})


@dataclass(frozen=True)
class Reason:
    text: str
    refusal: bool
    """True when a process gave up on the spec (exit code 2): waiting will not get it further."""
    exited: bool = True
    """True when a process exited with an error; False for what a running daemon reports."""


def statuses(pod: Object) -> list[dict[str, Any]]:
    """The pod's container statuses, then those of its init containers that have not completed (the
    daemon pod's ``plan`` refuses a spec before any container runs: render/plan.py). An init
    container that succeeded after failing — the checkpoint was fixed — is past its failure, though
    its ``lastState`` still shows it."""
    status = pod.get("status") or {}
    pending = [
        s
        for s in status.get("initContainerStatuses") or []
        if ((s.get("state") or {}).get("terminated") or {}).get("exitCode", 1) != 0
    ]
    return [*(status.get("containerStatuses") or []), *pending]


def exit_reason(pod: Object) -> Reason | None:
    """``<container> exited with code N: <message>`` for the pod's failed container (its current
    state, else its last one), or None when no container failed."""
    for status in statuses(pod):
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            ended = state.get("terminated") or {}
            if ended.get("exitCode", 0) != 0:
                message = one_line(ended.get("message") or "")
                code = f"{status.get('name')} exited with code {ended['exitCode']}"
                text = f"{code}: {message}" if message else f"{code} ({ended.get('reason') or 'no message'})"
                return Reason(text, refusal=ended["exitCode"] == REFUSED_EXIT)
    return None


def one_line(text: str) -> str:
    """The line that says it: a message's last non-empty line (a traceback's tail names the
    error), cut to ``MAX_REASON`` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= MAX_REASON else last[: MAX_REASON - 1] + "…"


def report_reason(report: DaemonReport | str | None) -> str | None:
    """What the first unready rank of a daemon's report says (``rank N: …``), with how many more
    ranks are not ready; None for a ready report or none at all."""
    if not isinstance(report, DaemonReport):
        return None
    unready = [r for r in report.ranks if not r.ready]
    if not unready:
        return None
    first = one_line(unready[0].problem or f"rank {unready[0].rank}: not ready")
    more = len(unready) - 1
    return f"{first} (and {more} more rank{'s' if more > 1 else ''} not ready)" if more else first


def node_reason(daemon_pod: Object, holder_pod: Object | None, report: DaemonReport | str | None) -> Reason | None:
    """Why a node whose daemon is not ready is not (see the module's order), or None when nothing says."""
    if (failed := exit_reason(daemon_pod)) is not None:
        return failed
    if holder_pod is not None and (failed := exit_reason(holder_pod)) is not None:
        return failed
    if (said := report_reason(report)) is not None:
        return Reason(said, refusal=False, exited=False)
    return None


def grouped(reasons: dict[str, Reason]) -> str:
    """``node-1, node-2: <reason>; node-3: <other reason>``: nodes with one reason named together."""
    by_text: dict[str, list[str]] = {}
    for node, reason in sorted(reasons.items()):
        by_text.setdefault(reason.text, []).append(node)
    return "; ".join(f"{', '.join(nodes)}: {text}" for text, nodes in by_text.items())


def common_refusal(reasons: dict[str, Reason], desired: int) -> str | None:
    """The one reason every one of ``desired`` nodes refuses the spec for; None when some node has
    not refused (yet), or nodes refuse for different reasons (then it may be the nodes, not the spec)."""
    texts = {r.text for r in reasons.values() if r.refusal}
    refusing = sum(r.refusal for r in reasons.values())
    if desired > 0 and refusing >= desired and len(texts) == 1:
        return texts.pop()
    return None


def engine_reasons(engine_pods: list[Object]) -> dict[str, Reason]:
    """Engine pod name → why it failed, for engines that are not Ready and had a container fail."""
    found = {}
    for pod in engine_pods:
        if pod["metadata"].get("deletionTimestamp") or pod_ready(pod):
            continue
        if (failed := exit_reason(pod)) is not None:
            found[pod["metadata"]["name"]] = failed
    return found


def failure_events(previous: Sequence[Condition], current: Sequence[Condition]) -> list[tuple[str, str]]:
    """(reason, message) of an Event for each condition that now names failed processes and did not
    say exactly this before: one Event per change, not one per pass."""
    before = {c.type: (c.reason, c.message) for c in previous}
    return [
        (c.reason, c.message or "")
        for c in current
        if c.type in EVENT_CONDITIONS
        and c.reason is not None
        and c.reason in FAILING_REASONS
        and before.get(c.type) != (c.reason, c.message)
    ]
