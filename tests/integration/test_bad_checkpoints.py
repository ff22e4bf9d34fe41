"""A bad checkpoint makes the daemon exit non-zero with a message naming the problem; no ready file."""

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file


def corrupt(case: str, ckpt: Path) -> None:
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(ckpt.glob("*.safetensors"))
    config = json.loads((ckpt / "config.json").read_text())
    if case == "missing config":
        (ckpt / "config.json").unlink()
    elif case == "config not json":
        (ckpt / "config.json").write_text("{not json")
    elif case == "missing shard":
        shards[1].unlink()
    elif case == "truncated shard":
        data = shards[0].read_bytes()
        shards[0].write_bytes(data[: len(data) - 1000])
    elif case == "corrupt header":
        data = bytearray(shards[0].read_bytes())
        data[8:20] = b"\xff" * 12
        shards[0].write_bytes(bytes(data))
    elif case == "index points elsewhere":
        name = next(n for n, f in index["weight_map"].items() if f == shards[0].name)
        index["weight_map"][name] = shards[1].name
        index_path.write_text(json.dumps(index))
    elif case == "tensor missing from index":
        name = next(iter(index["weight_map"]))
        del index["weight_map"][name]
        index_path.write_text(json.dumps(index))
    elif case == "layer tensor missing":
        tensors = load_file(str(shards[-1]))
        victim = next(n for n in tensors if ".layers." in n and "mlp.up_proj" in n)
        del tensors[victim]
        save_file(tensors, str(shards[-1]))
        del index["weight_map"][victim]
        index_path.write_text(json.dumps(index))
    elif case == "unknown architecture":
        config["architectures"] = ["MambaForCausalLM"]
        (ckpt / "config.json").write_text(json.dumps(config))
    elif case == "awq checkpoint":
        config["quantization_config"] = {"quant_method": "awq", "bits": 4}
        (ckpt / "config.json").write_text(json.dumps(config))
    elif case == "per-tensor fp8 checkpoint":
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
        (ckpt / "config.json").write_text(json.dumps(config))
    else:
        raise AssertionError(case)


CASES = {
    "missing config": "config.json is missing",
    "config not json": "config.json is not valid JSON",
    "missing shard": "listed in model.safetensors.index.json is missing",
    "truncated shard": "is truncated or padded",
    "corrupt header": "corrupt safetensors header",
    "index points elsewhere": "the index and the shard files disagree",
    "tensor missing from index": "not in model.safetensors.index.json",
    "layer tensor missing": "lacks 'mlp.up_proj.weight'",
    "unknown architecture": "'MambaForCausalLM' is not supported",
    "awq checkpoint": "uses 'awq', which is not supported",
    "per-tensor fp8 checkpoint": "per-tensor fp8",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_checkpoint_fails_clearly_without_a_ready_file(
    case: str, llama: Path, tmp_path: Path, start_daemon
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama, ckpt)
    corrupt(case, ckpt)
    daemon = start_daemon(ckpt, dtype="bfloat16", wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    output = daemon.output()
    assert "weightcache daemon: error:" in output and CASES[case] in output, output
    assert "Traceback" not in output
    assert not daemon.files[0].ready.exists() and not daemon.files[0].socket.exists()


@pytest.mark.parametrize("method", ["gptq", "marlin"])
def test_unsupported_quantization_flag_fails_before_reading(method: str, tmp_path: Path, start_daemon) -> None:
    # The checkpoint does not even exist: the allowlist is checked first.
    daemon = start_daemon(tmp_path / "nothing-here", quantization=method, wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    assert f"quantization method '{method}' is not supported" in daemon.output()


@pytest.mark.parametrize(
    "args, says",
    [
        ({"tp_size": 3}, "num_attention_heads=8 is not divisible by tensor-parallel size 3"),
        ({"pp_size": 5}, "pipeline size 5 exceeds the model's 4 layers"),
        ({"tp_size": 2, "tp_rank": 1, "dtype": "float64"}, "dtype 'float64' cannot be served"),
    ],
)
def test_a_refused_checkpoint_leaves_no_files(args: dict[str, object], says: str, llama: Path, start_daemon) -> None:
    daemon = start_daemon(llama, **args, wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    assert says in daemon.output(), daemon.output()
    assert list(Path(daemon.socket_dir).iterdir()) == []  # no cache dir, no rank-N.lock


def test_a_corrupt_checkpoint_leaves_no_files(llama: Path, tmp_path: Path, start_daemon) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama, ckpt)
    corrupt("layer tensor missing", ckpt)  # found only by reading every header: the full plan runs before the claim
    daemon = start_daemon(ckpt, dtype="bfloat16", wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    assert list(Path(daemon.socket_dir).iterdir()) == []
