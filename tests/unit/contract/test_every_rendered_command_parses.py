"""The launch contract holds across the process boundary: every daemon, keeper and plan command the
operator renders parses with the parser ``weightcache`` itself runs, into the typed values the
operator rendered, and every engine pod's environment reads back, through the reference engine's
own parser, into the same ``EngineArgs``."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import yaml
from repo_root import ROOT
from weightcache.cli import build_parser
from weightcache_contract.launch import ENGINE_ENV_PREFIX, DaemonArgs, EngineArgs, KeeperArgs, PlanArgs
from weightcache_contract.plan_summary import PLAN_CONTAINER
from weightcache_operator.observe.validation import parse
from weightcache_operator.render import engine_pod
from weightcache_operator.render.daemon import daemon_args, daemon_daemonsets
from weightcache_operator.render.engine import Member, engine_env
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import CLI, SOCKET_MOUNT, local_ranks

EXAMPLES = ROOT / "examples"


def cache_of(example: str, **changes: Any) -> WeightCache:
    """An example with dotted spec paths set, e.g. ``cache_of("weightcache-cpu.yaml", **{"model.revision": "r"})``."""
    body = yaml.safe_load((EXAMPLES / example).read_text())
    body["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = body["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    cache, problems = parse(body)
    assert cache is not None and not problems, problems
    return cache


CACHES = {
    "cpu": lambda: cache_of("weightcache-cpu.yaml"),
    "gpu": lambda: cache_of("weightcache-gpu.yaml"),
    "vllm-cpu": lambda: cache_of("weightcache-vllm-cpu.yaml"),
    "vllm-gpu": lambda: cache_of("weightcache-vllm-gpu.yaml"),
    "fp8-experts-revision": lambda: cache_of(
        "weightcache-cpu.yaml",
        **{
            "model.quantization": {"method": "fp8", "weightBlockSize": [128, 128]},
            "model.revision": "r1",
            "parallelism.tensor": 2,
            "parallelism.expert": 2,
        },
    ),
    "two-nodes": lambda: cache_of("weightcache-cpu.yaml", **{"parallelism.tensor": 2, "parallelism.nodes": 2}),
}


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def parse_command(command: list[str]) -> Any:
    assert command[: len(CLI)] == CLI, command
    return build_parser().parse_args(command[len(CLI) :])


@pytest.mark.parametrize("kind", sorted(CACHES))
def test_every_rendered_daemon_command_parses_into_the_arguments_the_operator_rendered(kind: str) -> None:
    cache = CACHES[kind]()
    slots = [[f"node-{k}"] for k in range(cache.spec.parallelism.nodes)]
    daemonsets = daemon_daemonsets(cache, slots)
    assert len(daemonsets) == cache.spec.parallelism.nodes
    for slot, daemonset in enumerate(daemonsets):
        pod_spec = daemonset["spec"]["template"]["spec"]
        parsed = parse_command(container(pod_spec, "daemon")["command"])
        assert parsed.command == "daemon"
        assert DaemonArgs.from_namespace(parsed) == daemon_args(cache, local_ranks(cache, slot))
        if any(c["name"] == "keeper" for c in pod_spec["containers"]):
            keeper = parse_command(container(pod_spec, "keeper")["command"])
            assert keeper.command == "keeper"
            assert KeeperArgs.from_namespace(keeper) == KeeperArgs(socket_dir=SOCKET_MOUNT)


def engine_args_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> EngineArgs:
    """What ``weightcache engine`` parses from ``env`` alone (the pod's command adds no flag)."""
    for name in [n for n in os.environ if n.startswith(ENGINE_ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return EngineArgs.from_namespace(build_parser().parse_args(["engine"]))


@pytest.mark.parametrize("kind", sorted(CACHES))
def test_every_rendered_plan_command_parses_into_the_arguments_the_operator_rendered(kind: str) -> None:
    cache = CACHES[kind]()
    slots = [[f"node-{k}"] for k in range(cache.spec.parallelism.nodes)]
    for slot, daemonset in enumerate(daemon_daemonsets(cache, slots)):
        plans = [c for c in daemonset["spec"]["template"]["spec"]["initContainers"] if c["name"] == PLAN_CONTAINER]
        if kind.startswith("vllm"):
            assert not plans  # vLLM's arenas are vLLM's to plan: its daemons refuse by themselves
            continue
        (plan,) = plans
        parsed = parse_command(plan["command"])
        assert parsed.command == "plan"
        planned = PlanArgs.from_namespace(parsed)
        model = cache.spec.model
        assert (planned.model, planned.dtype, planned.quantization) == (
            "/weightcache/model",
            model.dtype,
            model.quantization.method,
        )
        parallelism = cache.spec.parallelism
        assert (planned.tp_size, planned.pp_size, planned.ep_size) == (
            parallelism.tensor,
            parallelism.pipeline,
            parallelism.expert,
        )
        assert planned.verdict and planned.ranks == tuple(local_ranks(cache, slot))
        assert planned == PlanArgs.from_namespace(build_parser().parse_args(["plan", *planned.to_argv()]))


@pytest.mark.parametrize("kind", sorted(CACHES))
def test_every_rendered_engine_environment_reads_back_into_the_values_the_operator_rendered(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = CACHES[kind]()
    members: list[Member | None] = (
        [Member("g", 0), Member("g", 1, "198.18.1.7")] if cache.spec.parallelism.nodes > 1 else [None]
    )
    for member in members:
        pod = engine_pod(cache, 0, "active", member=member)
        main = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in main["env"] if "value" in e}
        # What the operator rendered, as the pod carries it (the template's own settings aside).
        ours = {k: env[k] for k in engine_env(cache, member).to_env()}
        assert engine_args_from(ours, monkeypatch) == engine_env(cache, member)


def test_the_reference_engine_reads_every_rendered_engine_value_as_its_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = CACHES["fp8-experts-revision"]()
    rendered = engine_env(cache)
    args = engine_args_from(rendered.to_env(), monkeypatch)
    assert (args.quantization, args.weight_block_size, args.revision, args.ep_size, args.tp_size) == (
        "fp8",
        (128, 128),
        "r1",
        2,
        2,
    )
    assert args == rendered


def test_an_engine_setting_the_environment_gets_wrong_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = engine_env(CACHES["cpu"]()).to_env()
    env["WEIGHTCACHE_ENGINE_TP_SIZE"] = "two"
    with pytest.raises(SystemExit) as exited:
        engine_args_from(env, monkeypatch)
    assert exited.value.code == 2
    assert "argument --tp-size: WEIGHTCACHE_ENGINE_TP_SIZE='two'" in capsys.readouterr().err


def test_a_daemon_command_with_an_unknown_flag_is_refused_by_the_daemons_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["daemon", *daemon_args(CACHES["cpu"](), [0]).to_argv(), "--tensor-parallel", "2"]
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "unrecognized arguments: --tensor-parallel 2" in capsys.readouterr().err


def test_daemon_arguments_with_every_field_set_parse_back_unchanged() -> None:
    rendered = DaemonArgs(
        model="/m",
        name="c",
        socket_dir="/s",
        backend="cuda-vmm",
        tp_size=4,
        pp_size=2,
        ranks=(0, 2, 3),
        keeper="off",
        status_addr="10.0.0.1:9400",
        gpus_file="/g/gpus.json",
        profile="vllm",
        engine_args=("--dtype", "bfloat16", "--hf-overrides", '{"a": 1}'),
        artifact_dir="/a",
        artifact_max_bytes=1 << 20,
        load_workers=7,
        synthetic_fill=True,
        socket_group="weightcache",
        checkpoint_poll_seconds=0.2,
    )
    parsed = build_parser().parse_args(["daemon", *rendered.to_argv()])
    assert DaemonArgs.from_namespace(parsed) == rendered
    reference = DaemonArgs(
        model="/m",
        name="c",
        socket_dir="/s",
        dtype="float16",
        quantization="fp8",
        weight_block_size=(128, 64),
        revision="r2",
        ep_size=2,
        tp_size=2,
        tp_rank=1,
        pp_rank=0,
    )
    assert DaemonArgs.from_namespace(build_parser().parse_args(["daemon", *reference.to_argv()])) == reference
