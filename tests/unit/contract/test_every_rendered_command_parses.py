"""The launch contract holds across the process boundary: every daemon and keeper command the
operator renders parses with the parser ``weightcache`` itself runs, into the typed values the
operator rendered, and every engine pod's environment reads back into the same ``EngineEnv``."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from repo_root import ROOT
from weightcache.cli import build_parser
from weightcache_contract.launch import DaemonArgs, EngineEnv, KeeperArgs
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


@pytest.mark.parametrize("kind", sorted(CACHES))
def test_every_rendered_engine_environment_reads_back_into_the_values_the_operator_rendered(kind: str) -> None:
    cache = CACHES[kind]()
    members: list[Member | None] = (
        [Member("g", 0), Member("g", 1, "198.18.1.7")] if cache.spec.parallelism.nodes > 1 else [None]
    )
    for member in members:
        pod = engine_pod(cache, 0, "active", member=member)
        main = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in main["env"] if "value" in e}
        assert EngineEnv.from_env(env) == engine_env(cache, member)


def test_the_reference_engine_reads_every_rendered_engine_value_as_its_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = CACHES["fp8-experts-revision"]()
    rendered = engine_env(cache)
    for name, value in rendered.to_env().items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["engine"])
    for field, value in vars(rendered).items():
        if value is not None and field != "pp_size":  # the reference engine has no pipeline parallelism
            assert getattr(args, field) == value, field


def test_an_engine_environment_without_a_required_value_is_refused_by_name() -> None:
    env = engine_env(CACHES["cpu"]()).to_env()
    del env["WEIGHTCACHE_ENGINE_TP_SIZE"]
    with pytest.raises(ValueError, match="WEIGHTCACHE_ENGINE_TP_SIZE is not set"):
        EngineEnv.from_env(env)
    env["WEIGHTCACHE_ENGINE_TP_SIZE"] = "two"
    with pytest.raises(ValueError, match="WEIGHTCACHE_ENGINE_TP_SIZE='two'"):
        EngineEnv.from_env(env)


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
        vllm_args=("--dtype", "bfloat16", "--hf-overrides", '{"a": 1}'),
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
