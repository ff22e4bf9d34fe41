"""Caches whose engines are vLLM (spec.engine.vllm): the daemon's vllm profile and the engine's
`vllm serve` command get one list of vLLM arguments, the engine is probed on vLLM's /health and
gated like any engine, engine-only settings roll engines and not daemons, and what vLLM cannot do
here is refused with the field to change."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import cache_of, changed
from example_caches import body
from rendered import daemon_command, env_of, main_container
from weightcache_operator.observe.responsiveness import probe_url
from weightcache_operator.observe.validation import parse
from weightcache_operator.render import READY_GATE, daemon_daemonset, daemon_spec_hash, engine_pod, engine_template_hash


def shared_list(daemon: list[str]) -> list[str]:
    assert daemon[daemon.index("--profile") + 1] == "vllm"
    return list(json.loads(daemon[daemon.index("--engine-args") + 1]))


def test_daemon_and_engine_get_the_same_vllm_arguments() -> None:
    cache = cache_of(body())
    listed = shared_list(daemon_command(cache))
    assert listed == [
        "--dtype",
        "bfloat16",
        "--tensor-parallel-size",
        "1",
        "--pipeline-parallel-size",
        "1",
        "--revision",
        "seed-0",
        "--max-model-len",
        "256",
        "--enforce-eager",
    ]
    command = main_container(cache)["command"]
    assert command[:3] == ["vllm", "serve", "/weightcache/model"]
    assert command[3 : 3 + len(listed)] == listed
    assert command[3 + len(listed) : 5 + len(listed)] == ["--shutdown-timeout", "30"], "engines drain on SIGTERM"
    assert command[5 + len(listed) : 7 + len(listed)] == ["--served-model-name", "tiny-qwen3"], "the cache's name"
    rest = command[7 + len(listed) :]
    assert rest[:2] == ["--load-format", "weightcache"]
    assert json.loads(rest[3]) == {"socket_dir": "/run/weightcache", "name": "tiny-qwen3", "fallback": "disk"}
    assert rest[2] == "--model-loader-extra-config" and rest[4:] == ["--host", "$(POD_IP)", "--port", "8000"]


def test_the_gpu_example_lists_quantization_and_engine_only_options_follow_the_shared_list() -> None:
    cache = cache_of(body("weightcache-vllm-gpu.yaml"))
    listed = shared_list(daemon_command(cache))
    assert listed == [
        "--dtype",
        "bfloat16",
        "--tensor-parallel-size",
        "4",
        "--pipeline-parallel-size",
        "1",
        "--quantization",
        "fp8",
        "--revision",
        "main",
        "--max-model-len",
        "32768",
    ]
    command = main_container(cache)["command"]
    after = command[5 + len(listed) :]
    assert after[:4] == ["--served-model-name", "qwen3-235b", "--gpu-memory-utilization", "0.63"]
    assert json.loads(after[after.index("--model-loader-extra-config") + 1])["fallback"] == "error"
    assert "--gpu-memory-utilization" not in daemon_command(cache)


def test_expert_parallelism_equal_to_tensor_becomes_vllms_flag_on_both_sides() -> None:
    eight = {"parallelism": {"tensor": 8, "expert": 8}, "daemon.resources": {"limits": {"nvidia.com/gpu": "8"}}}
    cache = cache_of(changed(body("weightcache-vllm-gpu.yaml"), **eight))
    listed = shared_list(daemon_command(cache))
    assert "--enable-expert-parallel" in listed and listed[listed.index("--tensor-parallel-size") + 1] == "8"
    assert "--enable-expert-parallel" in main_container(cache)["command"]


def test_the_daemon_keeps_its_own_command_and_adds_the_profile_before_extra_args() -> None:
    cache = cache_of(changed(body(), **{"daemon.extraArgs": ["--log-level", "debug"]}))
    daemon = daemon_command(cache)
    assert daemon[:4] == ["python", "-m", "weightcache", "daemon"]
    assert daemon[-2:] == ["--log-level", "debug"] and daemon.index("--engine-args") < daemon.index("--log-level")
    containers = daemon_daemonset(cache)["spec"]["template"]["spec"]["containers"]
    assert {"name": "VLLM_HOST_IP", "value": "127.0.0.1"} in next(c for c in containers if c["name"] == "daemon")["env"]


def test_cpu_engines_get_an_explicit_kv_cache_and_loopback_queues_and_the_template_env_wins() -> None:
    cache = cache_of(body())
    env = env_of(main_container(cache))
    assert (env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_HOST_IP"]) == ("1", "127.0.0.1")
    # Every engine of a node, one rank or more, leaves its threads to the OS: vLLM's own binding
    # would pin the active, its standbys and a rollout's new engine to the same cores.
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    two = cache_of(changed(body(), parallelism={"tensor": 2}))
    assert env_of(main_container(two))["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    obj = body()
    obj["spec"]["engine"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "0|1"}
    ]
    pinned = cache_of(changed(obj, parallelism={"tensor": 2}))
    assert env_of(main_container(pinned))["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"


def test_gpu_engines_size_no_cpu_kv_cache_and_see_the_daemons_gpus() -> None:
    env = env_of(main_container(cache_of(body("weightcache-vllm-gpu.yaml"))))
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_vllm_health_is_the_startup_readiness_and_liveness_probe_and_the_daemon_gate_stays() -> None:
    cache = cache_of(body())
    pod = engine_pod(cache, 0, "standby", ["node-a"])
    main = pod["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"] == {"path": "/health", "port": 8000}, probe
    assert main["readinessProbe"]["periodSeconds"] == 1
    assert {"conditionType": READY_GATE} in pod["spec"]["readinessGates"]
    # The operator's own hang detection asks the same endpoint.
    assert probe_url({**pod, "status": {"podIP": "10.0.0.7"}}) == "http://10.0.0.7:8000/health"


def test_engine_only_settings_roll_engines_and_shared_arguments_change_the_generation() -> None:
    base = cache_of(body())
    engine_only = cache_of(
        changed(body(), **{"engine.vllm.engineArgs": ["--max-num-seqs", "4"], "engine.vllm.kvCacheSpaceGiB": 2})
    )
    assert daemon_spec_hash(engine_only) == daemon_spec_hash(base)
    assert engine_template_hash(engine_only) != engine_template_hash(base)
    shared = cache_of(changed(body(), **{"engine.vllm.maxModelLen": 512}))
    assert daemon_spec_hash(shared) != daemon_spec_hash(base)
    assert engine_template_hash(shared) != engine_template_hash(base)


def test_a_cache_without_vllm_keeps_the_hashes_it_had_before_the_field_existed() -> None:
    reference = cache_of(body("weightcache-cpu.yaml"))
    # The daemon hash was computed before spec.engine.vllm existed: an operator upgrade must not
    # reload existing caches. The engine hash moved once, with served model names: engines served
    # under their mount path's name before, so an upgrade rolls them (no weight read) to serve
    # under the cache's name.
    assert (daemon_spec_hash(reference), engine_template_hash(reference)) == ("33d6755a50a74f45", "58182dc4ca2ef1be")
    assert "--profile" not in daemon_command(reference)


def template_with(**container: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "engine", "image": "weightcache/vllm:0.1.0", **container}]}}


REFUSED = [
    ({"parallelism": {"tensor": 2, "nodes": 2}}, "spec.parallelism.nodes is 2, but vLLM engines run on one node"),
    ({"parallelism": {"tensor": 4, "expert": 2}}, "set expert to 1 (experts split across ranks) or to tensor (4"),
    ({"engine.vllm.kvCacheSpaceGiB": None}, "spec.engine.vllm.kvCacheSpaceGiB is required on CPU"),
    ({"engine.template": template_with(command=["python", "-m", "weightcache", "engine"])}, "sets command, but"),
    ({"engine.template": template_with(args=["--port", "9"])}, "sets args, but with spec.engine.vllm"),
    ({"engine.vllm.args": ["--tensor_parallel_size=2"]}, "sets --tensor-parallel-size, which the operator renders"),
    ({"engine.vllm.engineArgs": ["-q", "fp8"]}, "set spec.model.quantization.method instead"),
    ({"engine.vllm.engineArgs": ["--port", "9000"]}, "set spec.engine.port instead"),
    ({"engine.vllm.engineArgs": ["--served-model-name", "m"]}, "set spec.engine.servedModelName instead"),
    ({"engine.vllm.engineArgs": ["--kv-cache-dtype", "fp8"]}, "move it to spec.engine.vllm.args"),
    # argparse abbreviations, as vLLM's parser accepts them
    ({"engine.vllm.engineArgs": ["--tensor-para", "2"]}, "sets --tensor-parallel-size (spelled --tensor-para)"),
    ({"engine.vllm.engineArgs": ["--kv-cache-dt=fp8"]}, "move it to spec.engine.vllm.args"),
]


@pytest.mark.parametrize(("changes", "needle"), REFUSED)
def test_what_vllm_cannot_do_here_is_refused_naming_the_field(changes: dict[str, Any], needle: str) -> None:
    cache, problems = parse(changed(body(), **changes))
    assert cache is not None and len(problems) == 1 and needle in problems[0], problems


def test_a_kv_cache_size_on_gpus_is_refused_for_gpu_memory_utilization() -> None:
    _, problems = parse(changed(body("weightcache-vllm-gpu.yaml"), **{"engine.vllm.kvCacheSpaceGiB": 4}))
    assert problems == [
        "spec.engine.vllm.kvCacheSpaceGiB sizes CPU engines only (daemon.backend cpu-shm); on GPUs remove it and "
        "size the KV cache with --gpu-memory-utilization in spec.engine.vllm.engineArgs"
    ]


@pytest.mark.parametrize("example", ["weightcache-vllm-cpu.yaml", "weightcache-vllm-gpu.yaml"])
def test_the_rendered_daemon_command_passes_the_vllm_daemons_own_checks(example: str) -> None:
    from weightcache.cli import build_parser
    from weightcache.engine_profiles.publisher import engine_arguments, refuse_reference_only_flags

    command = daemon_command(cache_of(body(example)))
    assert command[:3] == ["python", "-m", "weightcache"]
    args = build_parser().parse_args(command[3:])
    refuse_reference_only_flags(args)
    assert engine_arguments(args) == shared_list(command)
