"""TP shards re-assemble exactly into the full tensors; PP ranges are disjoint and complete."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from weightcache.checkpoints.sharding import Layout, Split, rules_for
from weightcache.client.weights import expect, load_from_disk, load_weights
from weightcache_contract.errors import ShardingError


def full_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in ckpt.glob("*.safetensors"):
        out.update(load_file(str(shard)))
    return out


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_tensor_parallel_shards_reassemble_exactly(checkpoint_factory, family: str, tp: int) -> None:
    ckpt = checkpoint_factory(family=family)
    full = full_tensors(ckpt)
    arch = rules_for({"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family])
    ranks = [
        load_from_disk(expect(str(ckpt), Layout(tp_size=tp, tp_rank=r), dtype="bfloat16")).tensors for r in range(tp)
    ]
    assert all(set(r) == set(full) for r in ranks)
    for name, tensor in full.items():
        rule, _ = arch.rule_for(name)
        parts = [r[name] for r in ranks]
        if rule.split is Split.REPLICATED:
            assert all(torch.equal(p, tensor) for p in parts), name
        else:
            dim = min(rule.split.dim, tensor.dim() - 1)
            assert all(p.shape[dim] == tensor.shape[dim] // tp for p in parts), name
            assert torch.equal(torch.cat(parts, dim=dim), tensor), name


@pytest.mark.parametrize("tp, kv", [(4, 1), (4, 2), (2, 1)])
def test_with_more_ranks_than_kv_heads_rank_r_holds_kv_head_r_over_replicas(
    checkpoint_factory, tp: int, kv: int
) -> None:
    ckpt = checkpoint_factory(family="qwen2", num_kv_heads=kv)  # k/v biases are replicated with their weights
    full = full_tensors(ckpt)
    head_dim = 128 // 8
    ranks = [
        load_from_disk(expect(str(ckpt), Layout(tp_size=tp, tp_rank=r), dtype="bfloat16")).tensors for r in range(tp)
    ]
    for name, tensor in full.items():
        parts = [r[name] for r in ranks]
        if ".k_proj." in name or ".v_proj." in name:
            for r, part in enumerate(parts):
                head = r // (tp // kv)
                assert torch.equal(part, tensor[head * head_dim : (head + 1) * head_dim]), (name, r)
        elif ".q_proj." in name:  # query heads still split: rank r has H/tp of them
            assert torch.equal(torch.cat(parts), tensor) and parts[0].shape[0] == tensor.shape[0] // tp


@pytest.mark.parametrize("hidden, refused", [(512, False), (256, True)])
def test_replicated_kv_heads_of_a_prequantized_checkpoint_must_be_whole_fp8_blocks(
    checkpoint_factory, hidden: int, refused: bool
) -> None:
    # 4 heads, 2 KV heads, TP=4: each rank holds one KV head of head_dim rows: 128 (whole blocks) or 64.
    ckpt = checkpoint_factory(
        family="llama", hidden_size=hidden, intermediate_size=512, num_heads=4, num_kv_heads=2, num_layers=1, fp8=True
    )
    expected = [expect(str(ckpt), Layout(tp_size=4, tp_rank=r), dtype="bfloat16", quantization="fp8") for r in range(4)]
    if refused:
        with pytest.raises(ShardingError, match="k_proj.*one whole KV head.*use a tp size <= the KV heads"):
            load_from_disk(expected[0])
        return
    full = full_tensors(ckpt)
    for r, e in enumerate(expected):
        tensors = load_from_disk(e).tensors
        for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"):
            head = r // 2
            assert torch.equal(
                tensors[name].view(torch.uint8), full[name][head * 128 : (head + 1) * 128].view(torch.uint8)
            )
            assert torch.equal(tensors[name + "_scale_inv"], full[name + "_scale_inv"][head : head + 1])


def test_pipeline_stages_are_disjoint_and_complete(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(family="llama", num_layers=5)
    full = full_tensors(ckpt)
    stages = [
        load_from_disk(expect(str(ckpt), Layout(pp_size=2, pp_rank=r), dtype="bfloat16")).tensors for r in range(2)
    ]
    assert not set(stages[0]) & set(stages[1])
    assert set(stages[0]) | set(stages[1]) == set(full)
    assert "model.embed_tokens.weight" in stages[0] and "lm_head.weight" in stages[1]
    assert {n.split(".")[2] for n in stages[0] if ".layers." in n} == {"0", "1", "2"}
    assert {n.split(".")[2] for n in stages[1] if ".layers." in n} == {"3", "4"}
    for stage in stages:
        for name, tensor in stage.items():
            assert torch.equal(tensor, full[name])


def test_tied_embedding_reaches_the_last_pipeline_stage(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(family="qwen2", tie_word_embeddings=True)
    last = load_from_disk(expect(str(ckpt), Layout(pp_size=2, pp_rank=1), dtype="bfloat16"))
    assert torch.equal(last.tensors["lm_head.weight"], full_tensors(ckpt)["model.embed_tokens.weight"])


def test_launcher_serves_every_local_rank(checkpoint_factory, start_daemon) -> None:
    ckpt = checkpoint_factory(family="qwen2")
    daemon = start_daemon(ckpt, tp_size=2, pp_size=2, dtype="bfloat16", ranks=[0, 1, 2, 3])
    for rank in range(4):
        layout = Layout.from_rank(rank, tp_size=2, pp_size=2)
        cached = load_weights(
            str(ckpt), layout, socket_dir=daemon.socket_dir, name=daemon.name, fallback="error", dtype="bfloat16"
        )
        disk = load_from_disk(expect(str(ckpt), layout, dtype="bfloat16"))
        assert set(cached.tensors) == set(disk.tensors)
        assert all(torch.equal(cached.tensors[n], disk.tensors[n]) for n in disk.tensors)
