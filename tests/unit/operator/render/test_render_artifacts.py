"""spec.engine.vllm.artifactCache: the daemon publishes the node's compile artifacts, engines run
under the artifact wrapper with the published entries read-only, and caches without the field
render exactly as before."""

from __future__ import annotations

from typing import Any

from builders import cache_of, changed
from example_caches import body
from rendered import daemon_command, env_of, main_container
from weightcache_operator.render import daemon_daemonset, daemon_spec_hash, engine_pod, engine_template_hash
from weightcache_operator.vocabulary import ARTIFACT_MOUNT

ON = {"engine.vllm.artifactCache": {"maxBytes": 1 << 30}}


def test_vllm_caches_without_artifact_cache_keep_their_hashes() -> None:
    # Pinned before the field existed: an operator upgrade must not roll daemons or engines.
    hashes = {
        ex: (daemon_spec_hash(c), engine_template_hash(c))
        for ex in ("weightcache-vllm-cpu.yaml", "weightcache-vllm-gpu.yaml")
        for c in [cache_of(body(ex))]
    }
    assert hashes == {
        "weightcache-vllm-cpu.yaml": ("f15bad9d1555cece", "a9c23663ca780a2c"),
        "weightcache-vllm-gpu.yaml": ("3b988300cc3c6f63", "f96f87cd7990b3c5"),
    }
    cache = cache_of(body())
    assert "--artifact-dir" not in daemon_command(cache)
    assert main_container(cache)["command"][0] == "vllm"


def test_turning_the_artifact_cache_on_is_a_daemon_generation_change() -> None:
    base, on = cache_of(body()), cache_of(changed(body(), **ON))
    assert daemon_spec_hash(on) != daemon_spec_hash(base)
    assert engine_template_hash(on) != engine_template_hash(base)
    bigger = cache_of(changed(body(), **{"engine.vllm.artifactCache": {"maxBytes": 2 << 30}}))
    assert daemon_spec_hash(bigger) != daemon_spec_hash(on)


def test_the_daemon_owns_the_per_cache_host_directory_and_publishes_into_it() -> None:
    cache = cache_of(changed(body(), **ON))
    command = daemon_command(cache)
    assert command[command.index("--artifact-dir") + 1] == ARTIFACT_MOUNT
    assert command[command.index("--artifact-max-bytes") + 1] == str(1 << 30)
    pod = daemon_daemonset(cache)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "weightcache-artifacts")
    assert volume["hostPath"] == {"path": "/var/lib/weightcache/artifacts/ns-tiny-qwen3", "type": "DirectoryOrCreate"}
    # The init container hands it to the daemon's uid, as it does the socket directory.
    owner = pod["initContainers"][0]
    assert ARTIFACT_MOUNT in owner["command"]


def test_engines_see_entries_read_only_write_only_staging_and_run_under_the_wrapper() -> None:
    cache = cache_of(changed(body(), **ON))
    pod = engine_pod(cache, 0, "active", ["node-a"])["spec"]
    main: dict[str, Any] = pod["containers"][0]
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts[f"{ARTIFACT_MOUNT}/entries"]["readOnly"] is True
    assert mounts[f"{ARTIFACT_MOUNT}/staging"]["readOnly"] is False
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert host["weightcache-artifacts-entries"]["path"].endswith("/ns-tiny-qwen3/entries")
    assert host["weightcache-artifacts-staging"]["type"] == "Directory"
    command = main["command"]
    wrapper = command[: command.index("--") + 1]
    assert wrapper[-8:] == [
        "artifacts-run",
        "--dir",
        ARTIFACT_MOUNT,
        "--health",
        "http://$(POD_IP):8000/health",
        "--profile",
        "vllm",
        "--",
    ]
    assert command[len(wrapper) : len(wrapper) + 2] == ["vllm", "serve"]
    assert env_of(main_container(cache))["WEIGHTCACHE_ENGINE_IMAGE"] == main["image"]


def test_node_status_shows_what_the_daemon_counted_of_the_nodes_artifacts() -> None:
    from builders import NOW, daemon, make
    from daemon_reports import rank, report
    from weightcache_contract.daemon_report import ArtifactReport
    from weightcache_operator.plan.status import Observed, aggregate
    from weightcache_operator.spec import WeightCacheStatus

    cache = make()
    daemon_pod = daemon("d", ready=True, spec_hash=daemon_spec_hash(cache))
    counted = ArtifactReport(hits=2, misses=1, published=1, lost_races=0, entries=1, bytes=5000, max_bytes=1 << 30)
    held = report(rank(0), rank(1)).model_copy(update={"artifacts": counted})
    status = aggregate(cache, Observed([daemon_pod], [], 1, daemon_reports={"d": held}), NOW).wire()
    assert status["nodes"][0]["artifacts"] == {"hits": 2, "misses": 1, "published": 1, "entries": 1, "bytes": 5000}
    WeightCacheStatus.model_validate(status)
    plain = aggregate(cache, Observed([daemon_pod], [], 1, daemon_reports={"d": report(rank(0), rank(1))}), NOW).wire()
    assert "artifacts" not in plain["nodes"][0], "a daemon without --artifact-dir reports none"
