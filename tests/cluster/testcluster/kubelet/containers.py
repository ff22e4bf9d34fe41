"""One container's life: start, probes, exit, restart with back-off, stop."""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..netns import entered
from ..rest import Object
from . import termination
from .environment import expand
from .hooks import pre_stop, run_pre_stop
from .nodes import now_rfc3339
from .probes import ProbeLoop, ProbeTarget
from .processes import CONTAINER_MARKER, Mount, kill_container_processes, signal_group, start_process

log = logging.getLogger(__name__)


@dataclass
class LaunchSpec:
    """Everything the pod worker resolved for this container before the first start."""

    argv: list[str]
    environment: dict[str, str]
    working_dir: str | None
    mounts: list[Mount]
    log_dir: Path
    pod_ip: str
    isolated: bool
    netns: str | None = None
    """The node's network namespace, where the process starts and probes connect; None: the host's."""
    hostname: str | None = None
    """The pod's hostname (a UTS namespace of its own); None: the host's (hostNetwork)."""
    termination_dir: Path | None = None
    """Where each start's termination-message file lives on the host (termination.py); None: no file."""
    message_limit: int = termination.MAX_BYTES


@dataclass
class Backoff:
    """Crash-loop back-off, doubling from ``base`` to ``cap`` (compressed from 10 s/300 s so
    tests see several restarts in seconds), reset after ``reset_after`` seconds of running."""

    base: float = 1.0
    cap: float = 10.0
    reset_after: float = 60.0
    current: float = field(default=0.0)

    def next_delay(self, ran_for: float) -> float:
        if ran_for >= self.reset_after:
            self.current = 0.0
        self.current = self.base if self.current == 0 else min(self.cap, self.current * 2)
        return self.current


class ContainerRunner:
    """Runs one container according to the pod's restart policy and reports every change.

    Exits are learnt by blocking in ``wait()`` on the child, not by polling, and
    ``on_change`` is called right away so the pod status is patched within milliseconds.
    """

    def __init__(
        self,
        spec: Object,
        launch: LaunchSpec,
        *,
        restart_policy: str,
        init: bool,
        backoff: Backoff,
        on_change: Callable[[], None],
        termination_grace: float = 30.0,
    ) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.launch = launch
        self.restart_policy = restart_policy
        self.init = init
        self.backoff = backoff
        self.on_change = on_change
        self.termination_grace = termination_grace
        # Inherited by everything the container starts; see processes.kill_container_processes.
        self.marker = f"{uuid.uuid4().hex}/{self.name}"
        self.restart_count = 0
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.ready = False
        self.started = False
        self.process: subprocess.Popen[bytes] | None = None
        self._probes: list[ProbeLoop] = []
        self._target: ProbeTarget | None = None
        """Where probes and hooks reach the running process; None before its first start."""
        self._stopping = threading.Event()
        self._killed_by_probe = False
        self._lock = threading.Lock()
        self._began = False
        self.finished = threading.Event()

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> int | None:
        """Runs until the container is done for good; returns the last exit code."""
        exit_code: int | None = None
        with self._lock:
            self._began = True
        try:
            while not self._stopping.is_set():
                began = time.monotonic()
                exit_code = self._run_once()
                if exit_code is None or self._stopping.is_set():
                    break
                if not self._should_restart(exit_code):
                    break
                delay = self.backoff.next_delay(time.monotonic() - began)
                with self._lock:
                    self.last_state = self.state
                    self.state = {
                        "waiting": {
                            "reason": "CrashLoopBackOff",
                            "message": f"back-off {delay:.0f}s restarting failed container",
                        }
                    }
                self.on_change()
                if self._stopping.wait(delay):
                    break
                self.restart_count += 1
        finally:
            self.finished.set()
        return exit_code

    def _should_restart(self, exit_code: int) -> bool:
        if self.init and self.restart_policy == "Always":
            # Init containers of an Always pod are retried only until they succeed.
            return exit_code != 0
        if self.restart_policy == "Always":
            return True
        if self.restart_policy == "OnFailure":
            return exit_code != 0
        return False

    def _run_once(self) -> int | None:
        argv = self.launch.argv
        self.launch.environment[CONTAINER_MARKER] = self.marker
        if not argv:
            self._terminate_state(128, "StartError", "no command: images are ignored, give command/args")
            return 128
        self.launch.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.launch.log_dir / f"{self.restart_count}.log"
        mounts = list(self.launch.mounts)
        message_file = None
        if self.launch.termination_dir is not None and self.launch.isolated:
            message_file = termination.fresh_file(self.launch.termination_dir / str(self.restart_count))
            mounts.append(Mount(message_file, termination.message_path(self.spec)))
        with open(log_path, "ab") as log_file:
            try:
                with entered(self.launch.netns):
                    process = start_process(
                        argv,
                        self.launch.environment,
                        self.launch.working_dir,
                        mounts,
                        log_file,
                        self.launch.isolated,
                        self.launch.hostname,
                    )
            except OSError as error:
                self._terminate_state(128, "StartError", str(error))
                return 128
        with self._lock:
            self.process = process
            stop_now = self._stopping.is_set()
            self._killed_by_probe = False
            self.state = {"running": {"startedAt": now_rfc3339()}}
            self.ready = False
            self.started = "startupProbe" not in self.spec
        if stop_now:
            # stop() ran while this process was being started and could not see it.
            signal_group(process, signal.SIGKILL)
        else:
            self._start_probes(process.pid)
        self.on_change()
        exit_code = process.wait()
        for probe in self._probes:
            probe.stop()
        self._probes = []
        reason = "Completed" if exit_code == 0 else "Error"
        if exit_code < 0:
            exit_code, reason = 128 - exit_code, "Error"
        if self._killed_by_probe:
            reason = "Error"
        message = termination.read_message(self.spec, message_file, log_path, exit_code, self.launch.message_limit)
        self._terminate_state(exit_code, reason, message)
        # Reported first, cleaned up second: the exit must reach the API within milliseconds.
        kill_container_processes(process, self.marker)
        return exit_code

    def _terminate_state(self, exit_code: int, reason: str, message: str | None) -> None:
        with self._lock:
            started_at = self.state.get("running", {}).get("startedAt")
            terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "finishedAt": now_rfc3339()}
            if started_at:
                terminated["startedAt"] = started_at
            if message:
                terminated["message"] = message
            if self.process is not None:
                terminated["containerID"] = f"process://{self.process.pid}"
            self.state = {"terminated": terminated}
            self.ready = False
        self.on_change()

    # -- probes ----------------------------------------------------------------------------------

    def _start_probes(self, pid: int) -> None:
        ports = {p["name"]: int(p["containerPort"]) for p in self.spec.get("ports", []) or [] if p.get("name")}
        target = ProbeTarget(
            self.launch.pod_ip, ports, pid, self.launch.environment, self.launch.isolated, self.launch.netns
        )
        self._target = target
        if "startupProbe" in self.spec:
            self._probes.append(
                ProbeLoop(
                    "startup",
                    self.spec["startupProbe"],
                    target,
                    lambda ok, message: self._on_startup(ok, message, target),
                ).start()
            )
        else:
            self._start_steady_probes(target)
        if "readinessProbe" not in self.spec and self.started:
            self.ready = True

    def _start_steady_probes(self, target: ProbeTarget) -> None:
        if "readinessProbe" in self.spec:
            self._probes.append(ProbeLoop("readiness", self.spec["readinessProbe"], target, self._on_readiness).start())
        if "livenessProbe" in self.spec:
            self._probes.append(ProbeLoop("liveness", self.spec["livenessProbe"], target, self._on_liveness).start())

    def _on_startup(self, ok: bool, message: str, target: ProbeTarget) -> None:
        if ok:
            with self._lock:
                self.started = True
                self.ready = "readinessProbe" not in self.spec
            for probe in [p for p in self._probes if p.kind == "startup"]:
                probe.stop()
            self._start_steady_probes(target)
            self.on_change()
        else:
            log.info("container %s failed its startup probe (%s): restarting", self.name, message)
            self._kill_for_probe()

    def _on_readiness(self, ok: bool, message: str) -> None:
        with self._lock:
            changed = self.ready != ok
            self.ready = ok
        if changed:
            self.on_change()

    def _on_liveness(self, ok: bool, message: str) -> None:
        if not ok:
            log.info("container %s failed its liveness probe (%s): restarting", self.name, message)
            self._kill_for_probe()

    def _kill_for_probe(self) -> None:
        self._killed_by_probe = True
        process = self.process
        if process is not None:
            threading.Thread(target=self._stop_process, args=(process, self._grace()), daemon=True).start()

    def _grace(self) -> float:
        return self.termination_grace

    # -- stopping --------------------------------------------------------------------------------

    def stop(self, grace: float) -> None:
        """The preStop hook if any (hooks.py), SIGTERM to the process group, SIGKILL once ``grace``
        seconds (the hook's time included) have passed; no restart afterwards."""
        with self._lock:
            self._stopping.set()
            process = self.process
            target = self._target
            if not self._began:
                # run() will return at once if it is ever called; nothing to wait for.
                self.finished.set()
        for probe in self._probes:
            probe.stop()
        if process is not None and process.poll() is None:
            hook = pre_stop(self.spec)
            if hook is not None and target is not None and grace > 0:
                grace = run_pre_stop(self.name, hook, target, grace)
            self._stop_process(process, grace)

    def kill(self) -> None:
        """SIGKILL at once, as when a node loses power."""
        with self._lock:
            self._stopping.set()
            process = self.process
        for probe in self._probes:
            probe.stop()
        if process is not None:
            kill_container_processes(process, self.marker)

    @staticmethod
    def _stop_process(process: subprocess.Popen[bytes], grace: float) -> None:
        signal_group(process, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        # Children that outlived the leader still belong to the group.
        signal_group(process, signal.SIGKILL)

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self._lock:
            status: dict[str, Any] = {
                "name": self.name,
                "image": self.spec.get("image", ""),
                "imageID": "",
                "ready": self.ready,
                "started": self.started and "running" in self.state,
                "restartCount": self.restart_count,
                "state": self.state,
                "lastState": self.last_state,
            }
            if self.process is not None:
                status["containerID"] = f"process://{self.process.pid}"
            return status


def resolve_argv(spec: Object, environment: dict[str, str]) -> list[str]:
    """command + args with $(VAR) expansion; without a command the args are the command."""
    command = [expand(part, environment) for part in spec.get("command", []) or []]
    args = [expand(part, environment) for part in spec.get("args", []) or []]
    return command + args
