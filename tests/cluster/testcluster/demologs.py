"""Where ``make demo`` puts everything that is not its narration, and what it shows when it fails.

The terminal gets the narration only: vLLM's, torch's and Python's own lines (progress bars,
``FutureWarning``, NUMA notices) read as errors to someone who does not know them. So every
component writes to a file under the demo's log directory (``<cluster dir>-logs``, which outlives
the cluster directory that ``down`` removes):

- ``demo.log``: the demo process's own stderr (Python warnings, logging, a failure's traceback)
  and that of the tools it runs in the background (``kubectl get wc -w``);
- ``cluster.log``: the local cluster's process, the process kubelet among it;
- ``gen-checkpoint.log``, ``<engine>-from-disk.log``: the checkpoint generator and the engine
  (vLLM, SGLang) from disk;
- ``control-plane/`` and ``pods/<namespace>/<pod>/<container>/<restart>.log``: copied from the
  cluster directory at teardown (``local.copy_logs``); the kubelet writes container output there,
  which is what ``kubectl logs`` serves while the cluster runs.

On a failure the demo names the component that failed (an explicit ``ComponentFailed``, else the
pod whose container crashed, restarted or is not ready, else the operator) and shows the tail of
its log.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TAIL_LINES = 40
OPERATOR_NAMESPACE = "weightcache-system"


def logs_dir(directory: Path) -> Path:
    """The demo's log directory for a cluster in ``directory``: beside it, so that it stays after ``down``."""
    return directory.with_name(directory.name + "-logs")


def fresh_logs(directory: Path) -> Path:
    """The demo's log directory, emptied of a previous run's logs."""
    logs = logs_dir(directory)
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    return logs


@contextmanager
def quiet(log: Path) -> Iterator[None]:
    """This process's file descriptor 2 (so Python's warnings and tracebacks, logging, and the stderr
    of every child that inherits it) goes to ``log`` until the block ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    sink = open(log, "a", buffering=1)  # noqa: SIM115 - closed when the block ends
    os.dup2(sink.fileno(), 2)
    # Warnings and logging to the file itself, not through sys.stderr: that need not be file descriptor 2.
    root = logging.getLogger()
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        root.setLevel(level)
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        sink.close()


class ComponentFailed(RuntimeError):
    """A step failed in a component the demo knows, whose log says why."""

    def __init__(self, component: str, log: Path, message: str) -> None:
        super().__init__(message)
        self.component = component
        self.log = log


@dataclass(frozen=True)
class Suspect:
    """The component to blame for a failure, why, and its log (as it is now, in the cluster directory)."""

    component: str
    why: str
    log: Path | None


def suspect(pods: list[dict[str, Any]], logs: Callable[[dict[str, Any], str], list[Path]]) -> Suspect | None:
    """Among ``pods`` (API objects, every namespace), the container most likely to have failed: one
    that exited with an error or waits to be restarted, then one that restarted, then one not
    ready; pods being deleted are passed over. ``logs(pod, container)`` lists a container's log
    files, one per run, oldest first. None if every container runs and is ready."""
    found: list[tuple[int, str, Suspect]] = []
    for pod in pods:
        metadata = pod["metadata"]
        if metadata.get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        component = (
            "operator"
            if metadata.get("namespace") == OPERATOR_NAMESPACE
            else (metadata.get("labels") or {}).get("weightcache.io/component", "pod")
        )
        for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            state, last = container.get("state") or {}, container.get("lastState") or {}
            restarts = int(container.get("restartCount") or 0)
            exited = (state.get("terminated") or {}).get("exitCode")
            waiting = (state.get("waiting") or {}).get("reason")
            if exited not in (None, 0) or waiting == "CrashLoopBackOff":
                rank, why = 0, f"exited {exited}" if exited is not None else f"waiting: {waiting}"
            elif restarts:
                rank, why = 1, f"restarted {restarts} times"
            elif not container.get("ready") and exited is None:
                rank, why = 2, "not ready"
            else:
                continue
            if restarts and (previous := (last.get("terminated") or {}).get("exitCode")) is not None:
                why += f", last exit {previous}"
            # The latest run that wrote anything: a container just restarted has not yet, its previous run says why.
            runs = logs(pod, container["name"])
            log = next((run for run in reversed(runs) if run.stat().st_size), runs[-1] if runs else None)
            name = f"{metadata.get('namespace')}/{metadata['name']}"
            found.append((rank, name, Suspect(f"{component} (container {container['name']} of pod {name})", why, log)))
    return min(found, key=lambda f: f[:2])[2] if found else None


def tail(log: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of ``log`` (none if it does not exist)."""
    try:
        return log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
