"""One case per fingerprint field: changing it alone changes the digest and is named as the difference."""

import json
import os
import shutil
from pathlib import Path

import pytest
from weightcache.checkpoints.checkpoint import Checkpoint, open_checkpoint, with_headers
from weightcache.checkpoints.quantization import resolve
from weightcache.checkpoints.sharding import Layout
from weightcache.wire.fingerprint import Fingerprint, compute
from weightcache_contract.errors import CheckpointError


def fingerprint(
    path: Path,
    layout: Layout = Layout(),
    quantization: str = "none",
    dtype: str = "bfloat16",
    revision: str = "r1",
    backend: str = "cpu-shm",
    block: tuple[int, int] | None = None,
) -> Fingerprint:
    ckpt = open_checkpoint(path)
    return compute(
        ckpt, layout, resolve(quantization, ckpt.quantization_config, block), dtype, revision=revision, backend=backend
    )


@pytest.fixture
def ckpt(llama: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(llama, copy)
    return copy


def assert_only(base: Fingerprint, changed: Fingerprint, field: str) -> None:
    assert changed.digest != base.digest
    assert base.differences(changed) == [field]


def test_identical_inputs_give_identical_fingerprints(ckpt: Path) -> None:
    a, b = fingerprint(ckpt), fingerprint(ckpt)
    assert a.digest == b.digest and a.differences(b) == []


def test_model_path(ckpt: Path, tmp_path: Path) -> None:
    base = fingerprint(ckpt)
    moved = tmp_path / "elsewhere"
    os.rename(ckpt, moved)
    assert_only(base, fingerprint(moved), "model_path")


def test_revision(ckpt: Path) -> None:
    assert_only(fingerprint(ckpt), fingerprint(ckpt, revision="r2"), "revision")


def test_config_hash(ckpt: Path) -> None:
    base = fingerprint(ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (ckpt / "config.json").write_text(json.dumps(config))
    assert_only(base, fingerprint(ckpt), "config_sha256")


def test_shard_mtime(ckpt: Path) -> None:
    base = fingerprint(ckpt)
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert_only(base, fingerprint(ckpt), "shards")


def test_a_shard_rewritten_in_place_with_size_and_mtime_restored_changes_the_fingerprint(ckpt: Path) -> None:
    base = fingerprint(ckpt)
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, same header
    with shard.open("r+b") as fh:  # in place: the inode stays
        fh.write(data)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (shard.stat().st_ino, shard.stat().st_size, shard.stat().st_mtime_ns) == (
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )
    assert_only(base, fingerprint(ckpt), "shards")  # the ctime moved: the write set it, utime cannot restore it


def test_copies_of_a_checkpoint_on_two_nodes_hold_the_same_weights_but_are_different_files(
    ckpt: Path, tmp_path: Path
) -> None:
    other_node = tmp_path / "node-2"
    shutil.copytree(ckpt, other_node / "ckpt")  # mtimes kept, inodes and ctimes new
    here, there = fingerprint(ckpt), fingerprint(other_node / "ckpt")
    same_path = here.model_copy(update={"model_path": there.model_path})  # both nodes mount it at one path
    assert same_path.digest != there.digest and same_path.differences(there) == ["shards"]
    assert same_path.weights_digest == there.weights_digest


def test_a_new_shard_mtime_changes_the_weights_digest_too(ckpt: Path) -> None:
    base = fingerprint(ckpt)
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert fingerprint(ckpt).weights_digest != base.weights_digest  # a new mtime is a new checkpoint everywhere


def test_a_shard_replaced_by_another_file_changes_the_fingerprint(ckpt: Path) -> None:
    base = fingerprint(ckpt)
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    st = shard.stat()
    copy = shard.with_suffix(".tmp")
    copy.write_bytes(shard.read_bytes())
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(copy, shard)
    assert_only(base, fingerprint(ckpt), "shards")


@pytest.mark.parametrize("field, layout", [("tp_size", Layout(tp_size=2)), ("pp_size", Layout(pp_size=2))])
def test_parallel_sizes(ckpt: Path, field: str, layout: Layout) -> None:
    # A size change alone (rank 0 in both) differs exactly in that size.
    assert_only(fingerprint(ckpt), fingerprint(ckpt, layout=layout), field)


def test_expert_parallel_size(ckpt: Path) -> None:
    # Same tp rank, other experts (whole ones instead of a slice of each): other bytes.
    assert_only(
        fingerprint(ckpt, layout=Layout(tp_size=2)), fingerprint(ckpt, layout=Layout(tp_size=2, ep_size=2)), "ep_size"
    )


@pytest.mark.parametrize(
    "field, layout", [("tp_rank", Layout(tp_size=2, tp_rank=1)), ("pp_rank", Layout(pp_size=2, pp_rank=1))]
)
def test_parallel_ranks(ckpt: Path, field: str, layout: Layout) -> None:
    rank0 = Layout(tp_size=layout.tp_size, pp_size=layout.pp_size)
    assert_only(fingerprint(ckpt, layout=rank0), fingerprint(ckpt, layout=layout), field)


def test_quantization_method(ckpt: Path) -> None:
    base, fp8 = fingerprint(ckpt), fingerprint(ckpt, quantization="fp8")
    assert fp8.digest != base.digest
    assert base.differences(fp8) == ["quantization", "quantization_sha256"]


def test_quantization_config(ckpt: Path) -> None:
    assert_only(
        fingerprint(ckpt, quantization="fp8"),
        fingerprint(ckpt, quantization="fp8", block=(64, 64)),
        "quantization_sha256",
    )


def test_dtype(ckpt: Path) -> None:
    assert_only(fingerprint(ckpt), fingerprint(ckpt, dtype="float32"), "dtype")


def test_layout_version(ckpt: Path) -> None:
    base = fingerprint(ckpt)
    assert_only(base, base.model_copy(update={"layout_version": base.layout_version + 1}), "layout_version")


@pytest.mark.parametrize(
    "field, value",
    [
        ("torch_version", "9.9.9"),
        ("device_kind", "NVIDIA H200"),
        ("compute_capability", "9.0"),
        ("protocol_version", 99),
    ],
)
def test_environment_fields(ckpt: Path, field: str, value: object) -> None:
    base = fingerprint(ckpt)
    env = base.environment.model_copy(update={field: value})
    assert_only(base, base.model_copy(update={"environment": env}), f"environment.{field}")


def test_backend(ckpt: Path) -> None:
    base = fingerprint(ckpt)
    env = base.environment.model_copy(update={"backend": "cuda-ipc"})
    assert_only(base, base.model_copy(update={"environment": env}), "environment.backend")
    # Computed for real: a GPU backend also stamps the GPU (or its absence) it was computed on.
    assert "environment.backend" in base.differences(fingerprint(ckpt, backend="cuda-vmm"))


@pytest.mark.parametrize(
    "field, value", [("driver_version", "580.1"), ("cuda_runtime", "13.0"), ("access", "read-write")]
)
def test_gpu_environment_fields(ckpt: Path, field: str, value: str) -> None:
    base = fingerprint(ckpt)
    env = base.environment.model_copy(update={field: value})
    assert_only(base, base.model_copy(update={"environment": env}), f"environment.{field}")


def test_a_stamps_only_checkpoint_fingerprints_like_a_fully_opened_one(ckpt: Path) -> None:
    stamps = open_checkpoint(ckpt, stamps_only=True)
    assert stamps.tensors == {}  # no header parsed: what engines open on every start
    quant = resolve("none", None, None)

    def digest(c: Checkpoint) -> str:
        return compute(c, Layout(), quant, "bfloat16", revision="r1", backend="cpu-shm").digest

    assert digest(stamps) == digest(open_checkpoint(ckpt))


def test_headers_opened_after_the_stamps_refuse_a_shard_that_changed_in_between(ckpt: Path) -> None:
    stamps = open_checkpoint(ckpt, stamps_only=True)
    assert set(with_headers(stamps).tensors) == set(open_checkpoint(ckpt).tensors)
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(CheckpointError, match="changed since this process fingerprinted it; start it again"):
        with_headers(stamps)


def test_a_fingerprint_without_an_engine_stamp_keeps_the_reference_profiles_digest(ckpt: Path) -> None:
    import hashlib

    base = fingerprint(ckpt)
    fields = base.model_dump(mode="json")
    del fields["engine"]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    assert base.digest == hashlib.sha256(canonical).hexdigest()


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("version", "0.33.0", "engine.version"),
        ("load_profile", "other", "engine.load_profile"),
        ("settings", {"platform": "cpu", "cpu_gemm": "vllm-default", "cpu_isa": "avx512f"}, "engine.settings.cpu_gemm"),
        (
            "settings",
            {"platform": "cpu", "cpu_gemm": "plain-f-linear", "cpu_isa": "amx_tile"},
            "engine.settings.cpu_isa",
        ),
        ("settings", {"platform": "cpu", "cpu_gemm": "plain-f-linear"}, "engine.settings.cpu_isa"),
    ],
)
def test_an_engine_stamp_field_that_differs_changes_the_digest_and_is_named_with_its_path(
    ckpt: Path, field: str, value: object, named: str
) -> None:
    from weightcache.wire.fingerprint import EngineStamp

    stamp = EngineStamp(
        engine="vllm",
        version="0.32.0",
        load_profile="vllm",
        settings={"platform": "cpu", "cpu_gemm": "plain-f-linear", "cpu_isa": "avx512f"},
    )
    base = fingerprint(ckpt).model_copy(update={"engine": stamp})
    other = base.model_copy(update={"engine": stamp.model_copy(update={field: value})})
    assert other.digest != base.digest and other.weights_digest != base.weights_digest
    assert base.differences(other) == [named]


def test_an_engine_stamp_against_none_is_named_as_the_engine_field(ckpt: Path) -> None:
    from weightcache.wire.fingerprint import EngineStamp

    base = fingerprint(ckpt)
    other = base.model_copy(
        update={"engine": EngineStamp(engine="vllm", version="0", load_profile="vllm", settings={})}
    )
    assert base.differences(other) == ["engine"]


def test_a_mismatch_in_the_shards_says_the_checkpoint_changed_and_suggests_a_daemon_restart_not_arguments() -> None:
    from weightcache.wire.fingerprint import mismatch_fix

    fix = mismatch_fix(["shards"])
    assert "checkpoint on disk changed after the daemon loaded it" in fix and "restart the daemon" in fix
    assert "argument" not in fix


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (["config_sha256"], "checkpoint on disk changed"),
        (["model_path"], "same --model"),
        (["dtype"], "same --dtype"),
        (["quantization_sha256"], "same --quantization"),
        (["tp_rank", "tp_size"], "same parallel layout"),
        (["environment.torch_version"], "same image"),
        (["environment.device_kind"], "same GPU model"),
        (["engine.settings.max_model_len"], "same engine arguments"),
    ],
)
def test_each_mismatching_field_names_its_own_fix(fields: list[str], words: str) -> None:
    from weightcache.wire.fingerprint import mismatch_fix

    assert words in mismatch_fix(fields)


def test_a_mismatch_in_several_kinds_of_field_names_each_fix_once() -> None:
    from weightcache.wire.fingerprint import mismatch_fix

    fix = mismatch_fix(["shards", "config_sha256", "dtype"])
    assert fix.count("checkpoint on disk changed") == 1 and "same --dtype" in fix
