"""``weightcache plan``: the daemon's planning for every rank, from config.json and headers alone."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from weightcache.checkpoints.planner import plan_world
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import expect, load_from_disk
from weightcache.tools.sample_checkpoints import ModelSpec, write_sparse_checkpoint

LLAMA_70B = ModelSpec(
    family="llama",
    hidden_size=8192,
    intermediate_size=28672,
    num_layers=80,
    num_heads=64,
    num_kv_heads=8,
    vocab_size=128256,
    tokenizer=False,
)

# Runs the CLI in-process after its imports, so that the kernel's count of bytes this process read
# (rchar: every read/pread, page cache or not) covers the planning and nothing else.
MEASURED = r"""
import json, sys
from weightcache import cli
from weightcache.checkpoints import planner  # noqa: F401
def rchar():
    return int(dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())["rchar"])
before = rchar()
rc = cli.main(sys.argv[1:])
print(json.dumps({"rc": rc, "read": rchar() - before}), file=sys.stderr)
"""


def plan_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "weightcache", "plan", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def llama_70b(tmp_path_factory) -> Path:
    return write_sparse_checkpoint(tmp_path_factory.mktemp("llama70b"), LLAMA_70B)


@pytest.mark.slow
def test_planning_a_131_gib_checkpoint_reads_its_headers_and_no_tensor_byte(llama_70b: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", MEASURED, "plan", "--model", str(llama_70b), "--tp", "16", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    measured = json.loads(proc.stderr.strip().splitlines()[-1])
    headers = 0
    for shard in llama_70b.glob("*.safetensors"):
        with shard.open("rb") as fh:
            headers += 8 + struct.unpack("<Q", fh.read(8))[0]
    world = json.loads(proc.stdout)
    assert measured["rc"] == 0 and world["ok"], proc.stdout
    # The smallest weight here is 32 KiB (a norm), the largest 2 GiB: what was read is the headers
    # plus the config, the index and /proc/self/io itself.
    assert world["checkpoint_bytes"] > 130 * 2**30
    assert measured["read"] < headers + 2**20, (measured, headers)


@pytest.mark.slow
def test_ranks_hold_their_share_and_replicated_kv_heads_count_on_every_rank(llama_70b: Path) -> None:
    world = plan_world(str(llama_70b), tp_size=16)
    h, inter, vocab, layers, head_dim = 8192, 28672, 128256, 80, 128
    bf16 = 2
    per_layer = (
        h * h // 16  # q: 64 heads / 16
        + 2 * head_dim * h  # k, v: one of 8 KV heads, replicated on 2 ranks (tp 16 > 8)
        + h * h // 16  # o
        + 3 * h * inter // 16  # gate, up, down
        + 2 * h
    ) * bf16  # two norms, whole
    want = layers * per_layer + 2 * vocab // 16 * h * bf16 + h * bf16
    assert {r.tensors for r in world.ranks} == {layers * 9 + 3}
    for r in world.ranks:
        assert want <= r.arena_bytes < want + 256 * r.tensors  # each tensor starts 256-aligned
        assert r.read_bytes == want
    # Unreplicated, the 16 ranks would add up to the checkpoint plus 15 extra copies of the norms.
    assert (
        sum(r.read_bytes for r in world.ranks)
        == world.checkpoint_bytes + layers * 8 * 2 * head_dim * h * bf16 + 15 * (layers * 2 + 1) * h * bf16
    )


def test_a_plan_is_what_the_loader_then_loads(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(family="qwen2", num_kv_heads=2, tie_word_embeddings=True)
    world = plan_world(str(ckpt), tp_size=4, pp_size=2, dtype="float32", quantization="fp8")
    assert world.ok and world.quantization == "fp8" and world.dtype == "float32"
    for r in world.ranks:
        loaded = load_from_disk(expect(str(ckpt), Layout.from_rank(r.rank, 4, 2), dtype="float32", quantization="fp8"))
        assert r.tensors == len(loaded.tensors) and r.read_bytes == loaded.bytes_loaded
        assert r.fp8_tensors == sum(str(t.dtype) == "torch.float8_e4m3fn" for t in loaded.tensors.values()) > 0
    assert [r.layers for r in world.ranks] == [(0, 2)] * 4 + [(2, 4)] * 4


def test_every_rank_of_a_refused_layout_says_why_and_the_command_fails(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(family="llama")  # 8 heads, 4 KV heads
    proc = plan_cli("--model", str(ckpt), "--tp", "3")
    assert proc.returncode == 1
    rows = [line for line in proc.stdout.splitlines() if "not divisible by tensor-parallel size 3" in line]
    assert len(rows) == 3 and "3 of 3 ranks refused" in proc.stdout
    fp8 = checkpoint_factory(
        family="llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, num_layers=1, fp8=True
    )  # head_dim 64: half an FP8 block per replicated KV head
    world = json.loads(plan_cli("--model", str(fp8), "--tp", "4", "--quantization", "fp8", "--json").stdout)
    assert not world["ok"] and all("one whole KV head" in r["refused"] for r in world["ranks"])
    whole = checkpoint_factory(
        family="llama", hidden_size=512, intermediate_size=512, num_heads=4, num_kv_heads=2, num_layers=1, fp8=True
    )  # head_dim 128: one whole block per KV head
    ok = plan_cli("--model", str(whole), "--tp", "4", "--quantization", "fp8")
    assert ok.returncode == 0 and "every rank can be planned" in ok.stdout, ok.stdout


def test_moe_experts_are_planned_whole_per_expert_parallel_rank_or_refused_by_name(checkpoint_factory) -> None:
    moe = checkpoint_factory(family="qwen3_moe", num_layers=2, num_experts=8, num_experts_per_tok=2)
    tp = json.loads(plan_cli("--model", str(moe), "--tp", "2", "--json").stdout)
    ep = json.loads(plan_cli("--model", str(moe), "--tp", "2", "--ep", "2", "--json").stdout)
    assert tp["ok"] and ep["ok"] and ep["ep_size"] == 2
    # Whole experts (EP) or a slice of every expert (TP): the same bytes and the same stacked tensors per rank.
    assert [r["tensors"] for r in ep["ranks"]] == [r["tensors"] for r in tp["ranks"]]
    assert [r["arena_bytes"] for r in ep["ranks"]] == [r["arena_bytes"] for r in tp["ranks"]]
    six = checkpoint_factory(family="qwen3_moe", num_layers=2, num_experts=6, num_experts_per_tok=2)
    refused = plan_cli("--model", str(six), "--tp", "4", "--ep", "4", "--json")
    world = json.loads(refused.stdout)
    assert refused.returncode == 1 and all(
        "num_experts=6 is not divisible by expert-parallel size 4" in r["refused"] for r in world["ranks"]
    ), world


@pytest.mark.parametrize(
    "args, words",
    [
        (["--quantization", "awq"], "'awq' is not supported"),
        (["--ep", "2"], "--ep-size 2 must divide --tp-size 1"),
        (["--tp", "0"], "--tp-size must be >= 1"),
        (["--dtype", "int8"], "dtype 'int8' cannot be served"),
    ],
)
def test_what_no_layout_can_fix_is_an_error(checkpoint_factory, args: list[str], words: str) -> None:
    proc = plan_cli("--model", str(checkpoint_factory(family="llama")), *args)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def test_an_unreadable_checkpoint_is_an_error_naming_it(tmp_path: Path) -> None:
    proc = plan_cli("--model", str(tmp_path / "nothing"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_gen_checkpoint_sparse_writes_a_plannable_checkpoint_of_holes(tmp_path: Path) -> None:
    out = tmp_path / "qwen3-32b"
    gen = subprocess.run(
        [
            sys.executable,
            "-m",
            "weightcache",
            "gen-checkpoint",
            str(out),
            "--sparse",
            "--family",
            "qwen3",
            "--hidden-size",
            "5120",
            "--intermediate-size",
            "25600",
            "--layers",
            "64",
            "--heads",
            "64",
            "--kv-heads",
            "8",
            "--vocab-size",
            "151936",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert gen.returncode == 0, gen.stderr
    apparent = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    on_disk = sum(f.stat().st_blocks * 512 for f in out.glob("*.safetensors"))
    assert apparent > 56 * 2**30 and on_disk < 2**20  # 57 GiB of tensors, none of them written
    world = json.loads(plan_cli("--model", str(out), "--tp", "8", "--json").stdout)
    assert world["ok"] and len({r["arena_bytes"] for r in world["ranks"]}) == 1
