"""Starts and stops the control plane (``kcluster up``) and hands out clients for it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import kubernetes.client
import kubernetes.config

from .binaries import ClientTools, client_tools, control_plane_binary
from .kubelet.podnetwork import api_address

log = logging.getLogger(__name__)


class ControlPlaneError(RuntimeError):
    """The control plane failed to start; the message carries its log tails."""


class ToolFailed(subprocess.CalledProcessError):
    """kubectl or helm failed; unlike CalledProcessError its message shows what they said."""

    def __str__(self) -> str:
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}:\n{self.stderr}{self.stdout}"


class ControlPlane:
    """One running control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

    ``kcluster up`` runs in a session of its own and its components die with it
    (PR_SET_PDEATHSIG), so stopping it, or killing its process group, leaves nothing behind.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        node_monitor_grace_period: float = 6.0,
        environment: dict[str, str] | None = None,
        address: str | None = None,
    ) -> None:
        """``address``: where the API server listens; by default on the nodes' bridge when
        nodes can have networks of their own, else 127.0.0.1 (``podnetwork.api_address``)."""
        self.state_dir = state_dir
        self.address = address
        self.node_monitor_grace_period = node_monitor_grace_period
        self._environment = environment or {}
        self._process: subprocess.Popen[str] | None = None
        self._tools: ClientTools | None = None
        self.info: dict[str, object] = {}
        self.start_seconds: float = 0.0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0, attempts: int = 2) -> None:
        """Starts the control plane; a failed start is retried once on fresh ports, because
        ``kcluster up`` picks free ports and another process may take one before it binds."""
        binary = control_plane_binary()
        self._tools = client_tools()
        if self.address is None:
            self.address = api_address()
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(binary, timeout)
                return
            except ControlPlaneError:
                if attempt == attempts:
                    raise
                log.warning("control plane start failed, retrying:\n%s", self.log_tails())
                shutil.rmtree(self.state_dir, ignore_errors=True)

    def _start_once(self, binary: Path, timeout: float) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        command = [
            str(binary),
            "up",
            "--dir",
            str(self.state_dir),
            f"--node-monitor-grace-period={self.node_monitor_grace_period}s",
            f"--address={self.address}",
        ]
        setpriv = shutil.which("setpriv")
        if setpriv:
            # If the test process dies without a teardown (SIGKILL, a CI timeout), the control
            # plane gets SIGTERM and shuts down; its components follow it (their own pdeathsig).
            command = [setpriv, "--pdeathsig", "TERM", "--", *command]
        with open(self.state_dir / "up.log", "w") as up_log:
            self._process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=up_log,
                text=True,
                start_new_session=True,
                env={**os.environ, **self._environment},
            )
        ready = threading.Event()

        def read_ready_line() -> None:
            assert self._process and self._process.stdout
            for line in self._process.stdout:
                if line.startswith("ready "):
                    ready.set()

        threading.Thread(target=read_ready_line, daemon=True, name="kcluster-stdout").start()
        while not ready.wait(0.1):
            if self._process.poll() is not None or time.monotonic() - started > timeout:
                self.stop()
                raise ControlPlaneError(f"control plane did not start:\n{self.log_tails()}")
        self.info = json.loads((self.state_dir / "cluster.json").read_text())
        self.start_seconds = time.monotonic() - started

    def stop(self, timeout: float = 15.0) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def log_tails(self, lines: int = 20) -> str:
        parts = []
        for log in [self.state_dir / "up.log", *sorted((self.state_dir / "logs").glob("*.log"))]:
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- access ----------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return Path(str(self.info["kubeconfig"]))

    @property
    def server(self) -> str:
        return str(self.info["server"])

    @property
    def port(self) -> int:
        return int(self.server.rsplit(":", 1)[1])

    @property
    def kubelet_serving_cert(self) -> tuple[Path, Path]:
        """Certificate and key for the process kubelet's log endpoint."""
        return Path(str(self.info["kubeletCert"])), Path(str(self.info["kubeletKey"]))

    @property
    def ca_file(self) -> Path:
        return Path(str(self.info["ca"]))

    @property
    def tools(self) -> ClientTools:
        assert self._tools is not None, "start() first"
        return self._tools

    def api_client(self) -> kubernetes.client.ApiClient:
        """A fresh admin client; each thread that watches should have its own."""
        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl as the admin (or with ``kubeconfig``); output is captured as text."""
        return self._run(self.tools.kubectl, args, input, check, kubeconfig, timeout)

    def apply(self, manifest: str, namespace: str | None = None) -> str:
        """Server-side applies YAML (one or more documents) as the admin; returns kubectl's output."""
        args = ["apply", "--server-side", "--field-manager=e2e", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        return self.kubectl(*args, input=manifest).stdout

    def helm(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 180.0,
    ) -> subprocess.CompletedProcess[str]:
        """Runs helm v4 against this cluster, with its caches kept inside the state directory."""
        return self._run(self.tools.helm, args, input, check, kubeconfig, timeout)

    def _run(
        self, tool: Path, args: Sequence[str], input: str | None, check: bool, kubeconfig: Path | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        helm_home = self.state_dir / "helm"
        environment = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }
        result = subprocess.run(
            [str(tool), *args], input=input, capture_output=True, text=True, env=environment, timeout=timeout
        )
        if check and result.returncode != 0:
            raise ToolFailed(result.returncode, result.args, result.stdout, result.stderr)
        return result

    def service_account_kubeconfig(self, namespace: str, service_account: str, expiration_seconds: int = 3600) -> Path:
        """Writes a kubeconfig that authenticates as a ServiceAccount (a TokenRequest token),
        so a test can act as a component and see its RBAC enforced."""
        core = kubernetes.client.CoreV1Api(self.api_client())
        request = kubernetes.client.AuthenticationV1TokenRequest(
            spec=kubernetes.client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
        )
        token = core.create_namespaced_service_account_token(service_account, namespace, request).status.token
        path = self.state_dir / f"sa-{namespace}-{service_account}.kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "c", "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}
                    ],
                    "users": [{"name": service_account, "user": {"token": token}}],
                    "contexts": [
                        {"name": "c", "context": {"cluster": "c", "user": service_account, "namespace": namespace}}
                    ],
                    "current-context": "c",
                }
            )
        )
        path.chmod(0o600)
        return path
