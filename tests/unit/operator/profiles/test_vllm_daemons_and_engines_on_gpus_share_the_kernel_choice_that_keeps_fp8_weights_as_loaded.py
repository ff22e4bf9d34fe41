"""vLLM caches on GPUs: the daemons and the engines get the same kernel environment, the one under
which vLLM 0.26 post-processes block-FP8 weights without rewriting the mapped arena (a side without
it has another fingerprint, so it would never share the arena); CPU caches get none of it."""

from __future__ import annotations

from builders import cache_of
from example_caches import body
from rendered import container, env_of, main_container
from weightcache_contract.launch import VLLM_REPLAY_KERNEL_ENV
from weightcache_operator.render import daemon_daemonset


def test_on_gpus_the_daemon_and_the_engine_get_the_kernel_pin_and_on_cpus_neither() -> None:
    gpu = cache_of(body("weightcache-vllm-gpu.yaml"))
    daemon = env_of(container(daemon_daemonset(gpu), "daemon"))
    engine = env_of(main_container(gpu))
    assert VLLM_REPLAY_KERNEL_ENV == {"VLLM_USE_DEEP_GEMM": "0"}
    for name, value in VLLM_REPLAY_KERNEL_ENV.items():
        assert (daemon[name], engine[name]) == (value, value)
    cpu = cache_of(body())
    daemon = env_of(container(daemon_daemonset(cpu), "daemon"))
    engine = env_of(main_container(cpu))
    assert not VLLM_REPLAY_KERNEL_ENV.keys() & (daemon.keys() | engine.keys())
