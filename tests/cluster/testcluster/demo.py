"""``make demo``: the operator's main job on a local cluster, narrated step by step.

A fresh detached local cluster (``local.py``: the control plane built from tests/cluster and the
process kubelet, two nodes), the chart installed with helm, the nodes prepared for
examples/weightcache-cpu.yaml (``--engine vllm``: examples/weightcache-vllm-cpu.yaml, ``--engine
sglang``: examples/weightcache-sglang-cpu.yaml, whose completion is compared with the engine's own
from disk), the sample applied; then, with a client sending
completions through the Service: the active engine killed (promotion as the client saw it) and an
engine rolling upgrade (no failed request, no weight byte read from disk). Each step prints the command
it runs, as README's "Try it locally" lists them, so any step can be repeated by hand. Ends with a
teardown, or with the cluster left running (``--keep``) and how to reach it.

The terminal shows the narration only: every component (the cluster, the operator, daemons and
engines, the engine from disk, this process's own warnings) writes to a log file that the demo names at
the end; on a failure it names the component that failed and shows the tail of its log
(``demologs.py``).

``--report FILE`` writes what the demo measured, with every client request, as JSON: the e2e test
checks the printed claims against it and against the cluster.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from .demologs import ComponentFailed, Suspect, fresh_logs, quiet, suspect, tail
from .load import PROMPT, Attempt, OpenLoopLoad
from .local import DEFAULT_DIR, LocalCluster, LocalClusterError, kept_log, pod_log, running, start_detached, stop
from .rest import Kube
from .sample import (
    CHART,
    REPO,
    SAMPLE,
    SGLANG_SAMPLE,
    VLLM_SAMPLE,
    checkpoint_path,
    completion_by_ids,
    container_pid,
    converged,
    daemon_facts,
    daemons_of,
    engines_of,
    generate_checkpoint,
    node_labels,
    place_checkpoint,
    pods,
    sample,
    sglang_disk_token_ids,
    vllm_disk_token_ids,
)
from .serviceproxy import ServiceProxy
from .waiting import wait_for

NAMESPACE = "default"
RELEASE = "weightcache"
OPERATOR_NAMESPACE = "weightcache-system"
CLUSTER_COMPONENT = "local cluster (control plane, process kubelet)"
FAILURE_LINES = 6
"""The lines of a failure's error shown; all of it, with its traceback, is in demo.log."""
log = logging.getLogger(__name__)
HELM_INSTALL = [
    "install",
    RELEASE,
    str(CHART.relative_to(REPO)),
    "--namespace",
    OPERATOR_NAMESPACE,
    "--create-namespace",
    # One operator replica: two only matter for surviving a node's loss.
    "--set",
    "replicaCount=1",
    "--wait",
    "--timeout",
    "180s",
]
UPGRADE_PATCH = [
    {
        "op": "add",
        "path": "/spec/engine/template/spec/containers/0/env/-",
        "value": {"name": "DEMO_REVISION", "value": "2"},
    }
]
VLLM_ENGINE_ARGS = ["--max-num-seqs", "8"]
"""The vLLM demo's upgrade: a serving option, for the engines only (spec.engine.vllm.engineArgs)."""
SGLANG_ENGINE_ARGS = [*sample(SGLANG_SAMPLE)["spec"]["engine"]["sglang"]["engineArgs"], "--max-running-requests", "8"]
"""The SGLang demo's upgrade: a serving option added to the example's, for the engines only
(spec.engine.sglang.engineArgs)."""
# 5 requests/s (Variant.load_interval), each retried once after 0.3 s: below what one engine serves on
# a loaded 2-core machine.
LOAD_INTERVAL, RETRY_DELAY, REQUEST_TIMEOUT = 0.2, 0.3, 10.0


class FromDisk(Protocol):
    def __call__(self, checkpoint: Path, example: Path, log: Path | None = None) -> list[int]: ...


@dataclass(frozen=True)
class Disk:
    """An engine's own load from disk, whose greedy ids the cache's completion must equal."""

    token_ids: FromDisk
    how: str
    """What runs, for the narration."""
    flags: str
    """How it loads, for the comparison's line."""


@dataclass(frozen=True)
class Variant:
    """What the demo runs: which example, how its engines are upgraded, and how long its engines
    may take. vLLM's and SGLang's engines import their engine and build the model (30 to 60 s each
    on a loaded 2-core machine, against 2 s for the reference engine), hence their longer waits."""

    engine: str
    example: Path
    upgrade: list[str]
    """``kubectl patch`` arguments after the cache's name: an engine-only change."""
    ready_timeout: float
    engines_timeout: float
    """For a new standby to be Ready after a failover, and for a rollout to complete."""
    label: str = ""
    """The engine's name in the narration; empty for the reference engine."""
    disk: Disk | None = None
    """The engine from disk to compare the completion with; None: the reference engine's demo
    shows its completion only (the e2e tests compare it)."""
    load_interval: float = LOAD_INTERVAL
    """Seconds between the client's requests."""

    @property
    def disk_log(self) -> str:
        return f"{self.engine}-from-disk.log"

    @property
    def name(self) -> str:
        return str(sample(self.example)["metadata"]["name"])

    @property
    def wc(self) -> str:
        return f"/apis/weightcache.io/v1alpha1/namespaces/{NAMESPACE}/weightcaches/{self.name}"

    @property
    def engines(self) -> str:
        return engines_of(self.name)

    @property
    def daemons(self) -> str:
        return daemons_of(self.name)


VARIANTS = {
    "reference": Variant("reference", SAMPLE, ["--type=json", "-p", json.dumps(UPGRADE_PATCH)], 300, 300),
    "vllm": Variant(
        "vllm",
        VLLM_SAMPLE,
        ["--type=merge", "-p", json.dumps({"spec": {"engine": {"vllm": {"engineArgs": VLLM_ENGINE_ARGS}}}})],
        600,
        420,
        "vLLM",
        Disk(
            vllm_disk_token_ids,
            "tests/vllm_engine/engine_process.py: vLLM's default loader, the arguments the operator renders",
            "--load-format auto, same checkpoint and arguments",
        ),
    ),
    "sglang": Variant(
        "sglang",
        SGLANG_SAMPLE,
        ["--type=merge", "-p", json.dumps({"spec": {"engine": {"sglang": {"engineArgs": SGLANG_ENGINE_ARGS}}}})],
        600,
        420,
        "SGLang",
        Disk(
            sglang_disk_token_ids,
            "python -m sglang.launch_server: SGLang's default loader, the arguments the operator renders",
            "its default loader, same checkpoint and arguments",
        ),
        # 2 requests/s: SGLang's CPU path without AMX runs torch-native attention, slower per request
        # than vLLM's CPU kernels on these 2 cores.
        0.5,
    ),
}
WC = VARIANTS["reference"].wc


@dataclass
class ClientCount:
    """Requests started in a window: ``failed_first`` failed their first attempt, ``retried_ok``
    of those succeeded on the retry, ``failed`` failed both."""

    sent: int
    failed_first: int
    retried_ok: int
    failed: int

    @classmethod
    def of(cls, attempts: list[Attempt], start: float, end: float) -> ClientCount:
        first = [a for a in attempts if not a.retry and start <= a.started < end]
        rescued = {a.request for a in attempts if a.retry and a.ok}
        failed_first = [a for a in first if not a.ok]
        retried_ok = sum(a.request in rescued for a in failed_first)
        return cls(len(first), len(failed_first), retried_ok, len(failed_first) - retried_ok)

    def __str__(self) -> str:
        return (
            f"{self.sent} requests sent, {self.failed_first} failed on the first try, "
            f"{self.retried_ok} of those succeeded on the retry, {self.failed} failed"
        )


@dataclass
class DemoReport:
    cluster_seconds: float = 0.0
    phases: list[tuple[float, str]] = field(default_factory=list)
    """(seconds after the apply, phase) for every phase `kubectl get wc -w` showed."""
    ready_seconds: float = 0.0
    completion: str = ""
    completion_endpoint: str = ""
    served_model: str = ""
    """vLLM and SGLang: the model name the client asked for."""
    completion_token_ids: list[int] = field(default_factory=list)
    disk_token_ids: list[int] = field(default_factory=list)
    """vLLM and SGLang: the greedy ids of the engine loading the checkpoint from disk, for the same
    request."""
    killed_pod: str = ""
    killed_at: float = 0.0
    failover_from: str = ""
    failover_to: str = ""
    detection_seconds: float = 0.0
    promotion_ms: float = 0.0
    client_first_ok_seconds: float = 0.0
    failover_window: tuple[float, float] = (0.0, 0.0)
    failover_client: ClientCount | None = None
    rollout_revision_before: str = ""
    rollout_revision: str = ""
    rollout_seconds: float = 0.0
    rollout_window: tuple[float, float] = (0.0, 0.0)
    rollout_client: ClientCount | None = None
    disk_bytes_read: int = -1
    daemons_replaced: int = -1
    total_seconds: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)


class Narrator:
    """Prints steps, the commands they run and indented detail, with the time since the start."""

    def __init__(self, steps: int) -> None:
        self.started = time.monotonic()
        self.steps = steps
        self.step = 0
        self.current = ""

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def title(self, text: str) -> None:
        self.step += 1
        self.current = text
        print(f"\n[{self.step}/{self.steps}] {text}   (at {self.elapsed():.0f}s)", flush=True)

    def command(self, words: list[str] | str) -> None:
        print(f"  $ {words if isinstance(words, str) else shlex.join(words)}", flush=True)

    def say(self, text: str) -> None:
        for line in text.rstrip("\n").splitlines():
            print(f"    {line}", flush=True)


def tool(
    cluster: LocalCluster,
    name: str,
    args: list[str],
    narrator: Narrator,
    *,
    show: bool = True,
    check: bool = True,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """Runs kubectl or helm from the repository root, printing the command as a user types it."""
    narrator.command([name, *args])
    environment = {**os.environ, "KUBECONFIG": cluster.kubeconfig}
    result = subprocess.run(
        [getattr(cluster, name), *args], cwd=REPO, env=environment, capture_output=True, text=True, timeout=timeout
    )
    if show:
        narrator.say(result.stdout + result.stderr)
    if check and result.returncode != 0:
        raise RuntimeError(f"{name} {shlex.join(args)} exited {result.returncode}:\n{result.stderr}{result.stdout}")
    return result


def start_cluster(directory: Path, narrator: Narrator, logs: Path) -> LocalCluster:
    narrator.command("python -m testcluster up --detach" + ("" if directory == DEFAULT_DIR else f" --dir {directory}"))
    try:
        cluster = start_detached(directory, say=narrator.say, log=logs / "cluster.log")
    except LocalClusterError as error:
        raise ComponentFailed(CLUSTER_COMPONENT, logs / "cluster.log", str(error).splitlines()[0]) from error
    narrator.say(f"local cluster up (pid {cluster.pid}): nodes {', '.join(cluster.nodes)}; logs in {logs}")
    return cluster


def prepare_sample(
    cluster: LocalCluster, narrator: Narrator | None = None, example: Path = SAMPLE, logs: Path | None = None
) -> Path:
    """The operator installed with helm, the nodes labelled as the example selects, and its checkpoint
    at its hostPath on every node: what ``make cluster`` adds to a started cluster. Returns where the
    checkpoint was generated. The generator's output goes to ``logs/gen-checkpoint.log`` if given."""
    narrator = narrator or Narrator(0)
    made = Path(cluster.dir) / "checkpoint" / str(sample(example)["metadata"]["name"])
    generator_log = logs / "gen-checkpoint.log" if logs is not None else None
    with ThreadPoolExecutor(1) as background:
        # Generating imports torch (seconds): done while helm installs.
        generated = background.submit(generate_checkpoint, made, example, generator_log)
        tool(cluster, "helm", HELM_INSTALL, narrator, show=False)
        narrator.say(f"operator Deployment {RELEASE}-operator Ready in namespace {OPERATOR_NAMESPACE}")
        labels = [f"{k}={v}" for k, v in node_labels(example).items()]
        tool(cluster, "kubectl", ["label", "nodes", "--all", "--overwrite", *labels], narrator)
        # What README's Helm section does on a real cluster: the daemons use hostPath.
        tool(
            cluster,
            "kubectl",
            ["label", "namespace", NAMESPACE, "--overwrite", "pod-security.kubernetes.io/enforce=privileged"],
            narrator,
        )
        narrator.command(f"python -m weightcache gen-checkpoint {made}")
        try:
            generated.result()
        except subprocess.CalledProcessError as error:
            if generator_log is None:
                raise
            raise ComponentFailed(
                "checkpoint generator (weightcache gen-checkpoint)", generator_log, str(error)
            ) from error
    roots = [cluster.node_root(node) for node in cluster.nodes]
    for copy in place_checkpoint(made, roots, example):
        narrator.command(f"cp -r {made} {copy}")
    narrator.say(f"each node's hostPath {checkpoint_path(example)} is <node root>{checkpoint_path(example)}")
    return made


def watch_until_ready(cluster: LocalCluster, narrator: Narrator, report: DemoReport, variant: Variant) -> None:
    """`kubectl get wc -w`, printed as it comes (repeats dropped, AGE left out), until the sample
    is Ready with its standby (the phase turns Ready once the active serves)."""
    narrator.command(["kubectl", "get", "wc", "-w"])
    applied = time.monotonic()
    watch = subprocess.Popen(
        [cluster.kubectl, "get", "wc", "-w"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "KUBECONFIG": cluster.kubeconfig},
    )
    ready = threading.Event()

    def follow() -> None:
        assert watch.stdout is not None
        shown: list[str] | None = None
        column: int | None = None
        for line in watch.stdout:
            row = line.split()
            if not row or row[:-1] == shown:
                continue
            shown = row[:-1]  # without AGE
            if row[0] == "NAME":
                # The phase is read by column: a row written before the first status has none.
                column = line.index("PHASE")
                print(f"            {line.rstrip()}", flush=True)
                continue
            at = time.monotonic() - applied
            print(f"    +{at:5.1f}s  {line.rstrip()}", flush=True)
            rest = line[column:] if column is not None else ""
            phase = rest.split()[0] if rest[:1].strip() else ""
            if phase and (not report.phases or report.phases[-1][1] != phase):
                report.phases.append((round(at, 2), phase))
            if phase == "Ready" and converged(cluster.kube().get(variant.wc).get("status") or {}):
                report.ready_seconds = round(at, 2)
                ready.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        # The phase turns Ready once the active serves; the standby may come a moment later, in a
        # status write the watch prints too, or in none if both were Ready at once: ask the API.
        deadline = time.monotonic() + variant.ready_timeout
        while not ready.is_set() and time.monotonic() < deadline:
            if report.phases and report.phases[-1][1] == "Ready" and whole(cluster.kube(), variant):
                report.ready_seconds = report.ready_seconds or round(time.monotonic() - applied, 2)
                ready.set()
            ready.wait(0.5)
        if not ready.is_set():
            raise RuntimeError(
                f"{variant.name} not Ready within {variant.ready_timeout:.0f}s; "
                f"status: {cluster.kube().get(variant.wc).get('status')}"
            )
    finally:
        watch.terminate()
        watch.wait()
    narrator.say(f"Ready {report.ready_seconds:.1f}s after the apply")


def whole(kube: Kube, variant: Variant) -> dict[str, Any] | None:
    """The status once the sample is Ready with its active engine and one Ready standby."""
    status = kube.get(variant.wc).get("status") or {}
    engines = status.get("engines") or [{}]
    return (
        status
        if converged(status) and engines[0].get("active") and len(engines[0].get("standbys") or []) == 1
        else None
    )


def post(proxy: ServiceProxy, body: dict[str, Any], narrator: Narrator) -> dict[str, Any]:
    """POSTs a completion to the Service, printing the curl that sends the same."""
    host, port = proxy.address
    narrator.say(
        f"(kube-proxy's part: the demo forwards {host}:{port} to the Service's ready endpoints, "
        "following its EndpointSlices)"
    )
    narrator.command(
        f"curl -s http://{host}:{port}/v1/completions -H 'Content-Type: application/json' -d '{json.dumps(body)}'"
    )
    request = urllib.request.Request(
        f"http://{host}:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return dict(json.loads(response.read()))


def complete_once(proxy: ServiceProxy, narrator: Narrator, report: DemoReport) -> None:
    started = time.monotonic()
    body = post(proxy, PROMPT, narrator)
    report.completion = body["choices"][0]["text"]
    report.completion_endpoint = proxy.ready_endpoints[0] if proxy.ready_endpoints else ""
    narrator.say(
        f"{report.completion!r} from {report.completion_endpoint} in {(time.monotonic() - started) * 1000:.0f} ms "
        "(seeded random weights: gibberish, the same every time)"
    )


def complete_like_disk(
    proxy: ServiceProxy, narrator: Narrator, report: DemoReport, disk: Future[list[int]], model: str, variant: Variant
) -> None:
    """A greedy completion through the Service, by token ids, against the engine's own from disk."""
    assert variant.disk is not None
    started = time.monotonic()
    body = post(proxy, completion_by_ids(model), narrator)
    report.served_model = model
    report.completion = body["choices"][0]["text"]
    report.completion_token_ids = list(body["choices"][0]["token_ids"])
    report.completion_endpoint = proxy.ready_endpoints[0] if proxy.ready_endpoints else ""
    narrator.say(
        f"model {model!r}: token ids {report.completion_token_ids} ({report.completion!r}) from "
        f"{report.completion_endpoint} in {(time.monotonic() - started) * 1000:.0f} ms"
    )
    report.disk_token_ids = disk.result(timeout=300)
    same = report.completion_token_ids == report.disk_token_ids
    narrator.say(
        f"{variant.label} from disk ({variant.disk.flags}): {report.disk_token_ids}: "
        + ("the same tokens" if same else "DIFFERENT tokens")
    )
    if not same:
        raise RuntimeError(
            f"the cache's engine answered {report.completion_token_ids}, {variant.label} from disk "
            f"{report.disk_token_ids}"
        )


def failover(
    kube: Kube, proxy: ServiceProxy, load: OpenLoopLoad, narrator: Narrator, report: DemoReport, variant: Variant
) -> None:
    status = wait_for(
        lambda: whole(kube, variant),
        variant.engines_timeout,
        interval=0.2,
        describe=lambda: kube.get(variant.wc).get("status"),
    )
    wait_for(lambda: len(proxy.ready_endpoints) == 1, 60)
    time.sleep(2.0)  # the client is served by the active before the kill
    active, standby = status["engines"][0]["active"], status["engines"][0]["standbys"][0]
    pod = kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{active}")
    pid = container_pid(pod, "engine")
    previous = (status.get("lastFailover") or {}).get("time")
    narrator.say(f"active {active} on {pod['spec']['nodeName']}, hot standby {standby}")
    narrator.command(f"kill -KILL -{pid}   # the active engine's processes (containerID process://{pid})")
    report.killed_pod, report.killed_at = active, time.time()
    os.killpg(pid, signal.SIGKILL)
    last = wait_for(
        lambda: (
            (f := (kube.get(variant.wc).get("status") or {}).get("lastFailover")) and f.get("time") != previous and f
        ),
        120,
        interval=0.05,
        describe="no failover recorded in status.lastFailover",
    )
    first = wait_for(
        lambda: min(
            (a for a in load.done() if a.ok and a.started >= report.killed_at), key=lambda a: a.ended, default=None
        ),
        120,
        interval=0.02,
    )
    noticed = datetime.fromisoformat(last["time"].replace("Z", "+00:00")).timestamp()
    report.failover_from, report.failover_to = str(last.get("from", "")), str(last.get("to", ""))
    report.detection_seconds = round(noticed - report.killed_at, 3)
    report.promotion_ms = float(last.get("promotionMs", 0))
    report.client_first_ok_seconds = round(first.ended - report.killed_at, 3)
    narrator.say(
        f"operator: {report.failover_from} → {report.failover_to} promoted; noticed {report.detection_seconds:.2f}s "
        f"after the kill, relabelled {report.promotion_ms:.0f} ms later (status.lastFailover)"
    )
    narrator.say(f"client: first success {report.client_first_ok_seconds:.2f}s after the kill")
    wait_for(
        lambda: whole(kube, variant),
        variant.engines_timeout,
        interval=0.2,
        describe=lambda: kube.get(variant.wc).get("status"),
    )
    end = time.time()
    report.failover_window = (report.killed_at, end)
    settle(load, end)
    report.failover_client = ClientCount.of(load.done(), report.killed_at, end)
    narrator.say(
        f"client, from the kill until a new standby was Ready ({end - report.killed_at:.1f}s): {report.failover_client}"
    )


def rolling_upgrade(
    cluster: LocalCluster, kube: Kube, load: OpenLoopLoad, narrator: Narrator, report: DemoReport, variant: Variant
) -> None:
    before = daemon_facts(kube, NAMESPACE, variant.daemons)
    report.rollout_revision_before = str(
        ((kube.get(variant.wc).get("status") or {}).get("rollout") or {}).get("engineTemplateHash", "")
    )
    started = time.time()
    tool(cluster, "kubectl", ["patch", "wc", variant.name, *variant.upgrade], narrator)

    def complete() -> dict[str, Any] | None:
        rollout = (kube.get(variant.wc).get("status") or {}).get("rollout") or {}
        if rollout.get("phase") == "Stalled":
            raise SystemExit(f"rollout stalled: {rollout}")
        if rollout.get("phase") != "Complete" or rollout.get("engineTemplateHash") in (
            None,
            report.rollout_revision_before,
        ):
            return None
        engines = [p for p in pods(kube, NAMESPACE, variant.engines) if not p["metadata"].get("deletionTimestamp")]
        upgraded = [
            p
            for p in engines
            if p["metadata"]["labels"].get("weightcache.io/engine-hash") == rollout["engineTemplateHash"]
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]
        return rollout if len(engines) == len(upgraded) == 2 else None

    rollout = wait_for(
        complete, variant.engines_timeout, interval=0.2, describe=lambda: kube.get(variant.wc).get("status")
    )
    end = time.time()
    report.rollout_revision, report.rollout_seconds = str(rollout["engineTemplateHash"]), round(end - started, 2)
    report.rollout_window = (started, end)
    settle(load, end)
    report.rollout_client = ClientCount.of(load.done(), started, end)
    after = daemon_facts(kube, NAMESPACE, variant.daemons)
    report.disk_bytes_read = sum(after[p][2] for p in after) - sum(before[p][2] for p in before if p in after)
    report.daemons_replaced = len(set(before) - set(after)) + sum(
        after[p][1] - before[p][1] for p in after if p in before
    )
    narrator.say(
        f"rollout Complete in {report.rollout_seconds:.1f}s (status.rollout, engineTemplateHash {report.rollout_revision}): "
        "a new-version standby mapped the same arena, was promoted, the old engines drained"
    )
    narrator.say(f"client, during the rollout: {report.rollout_client}")
    narrator.say(
        f"requests failed: {report.rollout_client.failed}; weight bytes read from disk: {report.disk_bytes_read}; "
        f"daemon pods replaced or restarted: {report.daemons_replaced}"
    )


def settle(load: OpenLoopLoad, until: float) -> None:
    """Waits until every request started before ``until`` has its outcome, retry included."""
    wait_for(lambda: load.settled(until), 2 * REQUEST_TIMEOUT + RETRY_DELAY + 5, interval=0.05)


def keep_message(cluster: LocalCluster, variant: Variant) -> str:
    return "\n".join(
        [
            "The cluster keeps running. In a shell:",
            *(f"  {line}" for line in cluster.shell_setup().splitlines()),
            f"  (kubectl: {cluster.kubectl}; helm: {cluster.helm})",
            "Three things to try:",
            "  kubectl get wc,pods -o wide",
            "  kubectl delete pod -l weightcache.io/role=active && "
            f"kubectl get wc {variant.name} -o jsonpath='{{.status.lastFailover}}'",
            "  kubectl get events --field-selector involvedObject.kind=WeightCache   # phases, failovers, rollouts",
            f"Stop it with: make cluster-down   (python -m testcluster down --dir {cluster.dir}, from tests/cluster)",
        ]
    )


def run_demo(directory: Path, keep: bool = False, report_path: Path | None = None, engine: str = "reference") -> int:
    if running(directory) is not None:
        print(
            f"error: a local cluster is already running from {directory} (make cluster, make demo KEEP=1); "
            "stop it first: make cluster-down"
        )
        return 1
    logs = fresh_logs(directory)
    with quiet(logs / "demo.log"):
        return narrate(directory, logs, keep, report_path, engine)


def narrate(directory: Path, logs: Path, keep: bool, report_path: Path | None, engine: str) -> int:
    """The demo itself, with this process's stderr going to ``logs/demo.log``: it prints only its narration."""
    variant = VARIANTS[engine]
    example = str(variant.example.relative_to(REPO))
    make = "make demo" + ("" if engine == "reference" else f" ENGINE={engine}")
    narrator = Narrator(steps=7)
    report = DemoReport()
    print(
        "weightcache on a local Kubernetes cluster: a real control plane (kube-apiserver, controller-manager,\n"
        "scheduler, etcd) and a kubelet that runs pods as local processes; 2 nodes, the cpu-shm backend"
        + (f", {variant.label} engines." if variant.label else ".")
    )
    proxy: ServiceProxy | None = None
    load: OpenLoopLoad | None = None
    cluster: LocalCluster | None = None
    background = ThreadPoolExecutor(1)
    disk: Future[list[int]] | None = None
    ok = False
    failure: tuple[str, Suspect] | None = None
    try:
        narrator.title("Start the control plane and the process kubelet (built once, then cached)")
        cluster = start_cluster(directory, narrator, logs)
        report.cluster_seconds = round(narrator.elapsed(), 1)
        kube = cluster.kube()
        narrator.title(f"Install the operator with helm; prepare the nodes for {example}")
        made = prepare_sample(cluster, narrator, variant.example, logs)
        if variant.disk is not None:
            narrator.say(
                f"{variant.label} from disk on the same checkpoint, for the reference tokens, in the background "
                f"({variant.disk.how})"
            )
            disk = background.submit(engine_from_disk, variant, made, logs / variant.disk_log)
        narrator.title("Apply the sample WeightCache and watch it become Ready")
        tool(cluster, "kubectl", ["apply", "-f", example], narrator)
        watch_until_ready(cluster, narrator, report, variant)
        narrator.title(f"A completion through the Service {variant.name}")
        proxy = ServiceProxy(kube, NAMESPACE, variant.name, 8000).start()
        proxy.wait_for_ready(1, timeout=60)
        prompt = dict(PROMPT)
        if disk is not None:
            # Clients ask for the cache's name (spec.engine.servedModelName overrides it): the
            # operator passes it to the engine as --served-model-name and reports it in status.
            model = str(kube.get(variant.wc)["status"]["servedModelName"])
            narrator.say(f"the engines serve the model as {model!r} (status.servedModelName)")
            prompt["model"] = model
            complete_like_disk(proxy, narrator, report, disk, model, variant)
        else:
            complete_once(proxy, narrator, report)
        narrator.title(
            f"Kill the active engine while a client sends {1 / variant.load_interval:.0f} requests/s "
            f"(each retried once after {RETRY_DELAY}s)"
        )
        load = OpenLoopLoad(proxy.address, variant.load_interval, RETRY_DELAY, REQUEST_TIMEOUT, prompt).start()
        failover(kube, proxy, load, narrator, report, variant)
        narrator.title("Roll out a new engine version under the same client")
        rolling_upgrade(cluster, kube, load, narrator, report, variant)
        ok = True
    # SystemExit: a stalled rollout ends the wait from inside its condition.
    except (Exception, SystemExit) as error:  # noqa: BLE001 - shown, then the cluster is torn down or kept as asked
        log.exception("the demo failed at step %d/%d (%s)", narrator.step, narrator.steps, narrator.current)
        lines = str(error).splitlines() or [repr(error)]
        message = f"[{narrator.step}/{narrator.steps}] {narrator.current}: " + "\n".join(lines[:FAILURE_LINES])
        if len(lines) > FAILURE_LINES:
            message += f"\n(the whole error: {logs / 'demo.log'})"
        failure = (message, blame(error if isinstance(error, Exception) else RuntimeError(error), cluster, logs))
    finally:
        # A reference engine still loading is waited for (it stops itself once done), not left behind.
        background.shutdown(wait=True, cancel_futures=True)
        if load is not None:
            load.stop()
            report.attempts = load.done()
        if proxy is not None:
            proxy.stop()
        narrator.title("Keep the cluster" if keep else "Tear down")
        if cluster is not None and keep:
            print(keep_message(cluster, variant))
        elif cluster is not None:
            if ok:
                tool(
                    cluster,
                    "kubectl",
                    ["delete", "-f", example, "--wait", "--timeout=60s"],
                    narrator,
                    check=False,
                )
            narrator.command("python -m testcluster down")
            left = stop(directory, keep_logs=logs)
            narrator.say(
                f"control plane, kubelet and every pod stopped; their logs copied to {logs}; {directory} removed"
                + (f"; had to kill {len(left)} leftover processes: {left}" if left else "; no process left")
            )
        report.total_seconds = round(narrator.elapsed(), 1)
        if report_path is not None:
            report_path.write_text(json.dumps(asdict(report), indent=1))
    if failure is not None:
        message, culprit = failure
        if culprit.log is not None and cluster is not None and not keep and culprit.log.is_relative_to(cluster.dir):
            culprit = Suspect(culprit.component, culprit.why, kept_log(culprit.log, Path(cluster.dir), logs))
        show_failure(message, culprit, logs)
        if not keep:
            print(f"({make} KEEP=1 keeps the cluster after a failure, for kubectl describe and kubectl logs)")
    print_logs(logs, cluster if keep else None)
    print(
        f"\n{variant.label + ' ' if variant.label else ''}demo {'done' if ok else 'FAILED'} in "
        f"{int(report.total_seconds) // 60}m{int(report.total_seconds) % 60:02d}s "
        f"(cluster start {report.cluster_seconds:.0f}s, Ready {report.ready_seconds:.0f}s after the apply, "
        + (
            f"completion equal to {variant.label} from disk, "
            if report.disk_token_ids == report.completion_token_ids != []
            else ""
        )
        + f"client saw the promotion after {report.client_first_ok_seconds:.2f}s, rollout {report.rollout_seconds:.0f}s)"
    )
    return 0 if ok else 1


def engine_from_disk(variant: Variant, checkpoint: Path, log: Path) -> list[int]:
    """The variant's engine from disk, logging to ``log``; its failure names that engine from disk."""
    assert variant.disk is not None
    try:
        return variant.disk.token_ids(checkpoint, variant.example, log)
    except Exception as error:
        raise ComponentFailed(
            f"{variant.label} from disk", log, str(error).splitlines()[0] if str(error) else repr(error)
        ) from error


def blame(error: Exception, cluster: LocalCluster | None, logs: Path) -> Suspect:
    """The component a failure is put down to, while the cluster still runs: the one named by the
    error, else the container that crashed, restarted or is not ready, else the operator (which
    decides what every pod does next)."""
    if isinstance(error, ComponentFailed):
        return Suspect(error.component, "", error.log)
    if cluster is None:
        return Suspect(CLUSTER_COMPONENT, "", logs / "cluster.log")
    directory = Path(cluster.dir)
    try:
        everything = list(cluster.kube().get("/api/v1/pods")["items"])
    except Exception as unreachable:  # noqa: BLE001 - a cluster that does not answer is the culprit
        return Suspect(CLUSTER_COMPONENT, f"its API server does not answer ({unreachable})", logs / "cluster.log")

    def runs(pod: dict[str, Any], container: str) -> list[Path]:
        metadata = pod["metadata"]
        return pod_log(directory, metadata["namespace"], metadata["name"], metadata["uid"], container)

    if (found := suspect(everything, runs)) is not None:
        return found
    operators = [p for p in everything if p["metadata"]["namespace"] == OPERATOR_NAMESPACE]
    if not operators:
        return Suspect(CLUSTER_COMPONENT, "no operator pod was created", logs / "cluster.log")
    operator = operators[0]
    operator_runs = runs(operator, "operator")
    return Suspect(
        f"operator (pod {OPERATOR_NAMESPACE}/{operator['metadata']['name']})",
        "every container runs and is ready; the operator decides what happens next",
        operator_runs[-1] if operator_runs else None,
    )


def show_failure(message: str, culprit: Suspect, logs: Path) -> None:
    """What failed, the component it is put down to, and the tail of that component's log."""
    print(f"\nFAILED at {message}")
    print(f"failing component: {culprit.component}" + (f": {culprit.why}" if culprit.why else ""))
    lines = tail(culprit.log) if culprit.log is not None else []
    if culprit.log is None or not lines:
        print(f"(no log of it{'' if culprit.log is None else f' in {culprit.log}'})")
    else:
        print(f"the last {len(lines)} lines of {culprit.log}:")
        for line in lines:
            print(f"    | {line}")
    print(f"(the traceback: {logs / 'demo.log'})")


LOG_FILES = [
    ("cluster.log", "the local cluster's process: the process kubelet"),
    ("control-plane/", "kube-apiserver, etcd, kube-controller-manager, kube-scheduler"),
    ("pods/", "every container, as pods/<namespace>/<pod>/<container>/<restart>.log: the operator, daemons, engines"),
    ("gen-checkpoint.log", "the checkpoint generator"),
    *((v.disk_log, f"{v.label} from disk on the same checkpoint") for v in VARIANTS.values() if v.disk),
    ("demo.log", "this process's warnings, and a failure's traceback"),
]


def print_logs(logs: Path, kept: LocalCluster | None) -> None:
    """Where every component's output went (the terminal shows only the narration)."""
    print(f"\nLogs, in {logs}/ (the terminal shows only the narration):")
    for name, what in LOG_FILES:
        if (logs / name).exists():
            print(f"  {name:<20} {what}")
    if kept is not None:
        print(
            f"  (the control plane's and the pods' logs stay in {kept.dir} while the cluster runs: "
            "kubectl logs <pod> -c <container>)"
        )
