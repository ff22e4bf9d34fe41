"""Caches whose engines are SGLang (spec.engine.sglang): the daemon's sglang profile and the engine's
`sglang serve` command get one list of SGLang arguments, the CPU engine switch goes to both, the
engine is probed on SGLang's /health, engine-only settings roll engines and not daemons, and what
the profile cannot do is refused with the field to change."""

from __future__ import annotations

import json

from builders import cache_of, changed
from example_caches import body
from rendered import daemon_command, env_of, main_container
from weightcache.cli import build_parser
from weightcache_operator.observe.validation import parse
from weightcache_operator.render import daemon_daemonset, daemon_spec_hash, engine_template_hash

EXAMPLE = "weightcache-sglang-cpu.yaml"


def shared_list(daemon: list[str]) -> list[str]:
    assert daemon[daemon.index("--profile") + 1] == "sglang"
    return list(json.loads(daemon[daemon.index("--engine-args") + 1]))


def test_daemon_and_engine_get_the_same_sglang_arguments() -> None:
    cache = cache_of(body(EXAMPLE))
    daemon = daemon_command(cache)
    listed = shared_list(daemon)
    assert listed == ["--dtype", "bfloat16", "--tp-size", "1", "--pp-size", "1", "--device", "cpu"] + [
        "--revision",
        "seed-0",
        "--context-length",
        "256",
    ]
    parsed = build_parser().parse_args(daemon[daemon.index("daemon") :])
    assert parsed.profile == "sglang" and json.loads(parsed.engine_args) == listed
    command = main_container(cache)["command"]
    assert command[:4] == ["sglang", "serve", "--model-path", "/weightcache/model"]
    assert command[4 : 4 + len(listed)] == listed
    rest = command[4 + len(listed) :]
    assert rest[:5] == ["--max-total-tokens", "2048", "--served-model-name", "tiny-qwen3", "--sleep-on-idle"]
    assert rest[5:7] == ["--load-format", "weightcache"] and rest[7] == "--model-loader-extra-config"
    assert json.loads(rest[8]) == {"socket_dir": "/run/weightcache", "name": "tiny-qwen3", "fallback": "disk"}
    assert rest[9:] == ["--host", "$(POD_IP)", "--port", "8000"]
    assert "--sleep-on-idle" not in listed  # engine-only: the daemons do not serve


def test_cpu_daemons_and_engines_get_sglangs_cpu_engine_and_engines_are_probed_on_health() -> None:
    cache = cache_of(body(EXAMPLE))
    daemon = next(c for c in daemon_daemonset(cache)["spec"]["template"]["spec"]["containers"] if c["name"] == "daemon")
    assert env_of(daemon)["SGLANG_USE_CPU_ENGINE"] == "1"
    main = main_container(cache)
    assert env_of(main)["SGLANG_USE_CPU_ENGINE"] == "1"
    assert main["readinessProbe"]["httpGet"]["path"] == main["startupProbe"]["httpGet"]["path"] == "/health"


def test_readiness_asks_sglangs_health_without_a_generation_and_liveness_asks_for_one() -> None:
    """SGLang's /health generates a token and answers after a second at the earliest, past a
    readiness probe's timeout; the engine env turns that off, and liveness generates instead, with
    a timeout past SGLang's own wait for the token."""
    main = main_container(cache_of(body(EXAMPLE)))
    assert env_of(main)["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
    readiness, liveness = main["readinessProbe"], main["livenessProbe"]
    assert readiness["periodSeconds"] == 1 and readiness.get("timeoutSeconds", 1) == 1
    assert liveness["httpGet"]["path"] == "/health_generate" and liveness["timeoutSeconds"] > 20
    gpu = changed(body(EXAMPLE), **{"daemon.backend": "cuda-vmm", "engine.sglang": {"contextLength": 256}})
    gpu_main = main_container(cache_of(gpu))
    assert env_of(gpu_main)["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
    assert "SGLANG_USE_CPU_ENGINE" not in env_of(gpu_main)


def test_engine_only_settings_roll_engines_and_shared_ones_roll_daemons() -> None:
    base = body(EXAMPLE)
    engine_only = changed(base, **{"engine.sglang.engineArgs": ["--max-running-requests", "8"]})
    shared = changed(base, **{"engine.sglang.args": ["--kv-cache-dtype", "fp8_e5m2"]})
    assert daemon_spec_hash(cache_of(engine_only)) == daemon_spec_hash(cache_of(base))
    assert engine_template_hash(cache_of(engine_only)) != engine_template_hash(cache_of(base))
    assert daemon_spec_hash(cache_of(shared)) != daemon_spec_hash(cache_of(base))


def test_what_the_profile_cannot_do_is_refused_with_the_field_to_change() -> None:
    base = body(EXAMPLE)
    problems = parse(changed(base, **{"engine.sglang": {"contextLength": 256}}))[1]
    assert any("spec.engine.sglang.maxTotalTokens is required on CPU" in p for p in problems), problems
    problems = parse(changed(base, **{"engine.sglang.engineArgs": ["--port=9000", "--kv-cache-dtype", "fp8_e5m2"]}))[1]
    assert (
        "spec.engine.sglang.engineArgs sets --port, which the operator renders itself; set spec.engine.port instead"
        in problems
    )
    assert any("sets --kv-cache-dtype, which shapes the weights' fingerprint" in p for p in problems), problems
    # argparse abbreviations, as SGLang's parser accepts them (--tp-si 4 is its --tp-size 4)
    problems = parse(changed(base, **{"engine.sglang.engineArgs": ["--tp-si", "4", "--context-len=99"]}))[1]
    assert (
        "spec.engine.sglang.engineArgs sets --tp-size (spelled --tp-si), which the operator renders itself; "
        "set spec.parallelism.tensor instead" in problems
    ), problems
    assert any("sets --context-length (spelled --context-len)" in p for p in problems), problems
    problems = parse(changed(base, **{"engine.sglang.engineArgs": ["--tp", "4"]}))[1]
    assert problems == [
        "spec.engine.sglang.engineArgs sets --tp, which the operator renders itself; set spec.parallelism.tensor "
        "instead"
    ], problems
    problems = parse(changed(base, **{"parallelism": {"tensor": 2, "expert": 2}}))[1]
    assert any("does not serve expert parallelism yet" in p for p in problems), problems


def test_an_engine_container_with_its_own_command_or_args_is_refused_since_the_operator_renders_sglangs() -> None:
    container = {"name": "engine", "image": "weightcache/sglang:0.1.0"}
    for key, value in (("command", ["python3", "-m", "sglang.launch_server"]), ("args", ["--port", "9"])):
        template = {"spec": {"containers": [{**container, key: value}]}}
        assert parse(changed(body(EXAMPLE), **{"engine.template": template}))[1] == [
            f"spec.engine.template.spec.containers[0] (engine) sets {key}, but with spec.engine.sglang the operator "
            f"renders the engine's command itself; remove {key} and put the engine's options in spec.engine.sglang.args "
            "or engineArgs"
        ]
