"""TP shards re-assemble exactly into the full tensors; PP ranges are disjoint and complete."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from weightcache.client import expect, load_from_disk, load_weights
from weightcache.sharding import Layout, Split, rules_for


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
    ranks = [load_from_disk(expect(str(ckpt), Layout(tp_size=tp, tp_rank=r), dtype="bfloat16")).tensors
             for r in range(tp)]
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


def test_pipeline_stages_are_disjoint_and_complete(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(family="llama", num_layers=5)
    full = full_tensors(ckpt)
    stages = [load_from_disk(expect(str(ckpt), Layout(pp_size=2, pp_rank=r), dtype="bfloat16")).tensors for r in range(2)]
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
    daemon = start_daemon(ckpt, "--ranks", "0-3", "--tp-size", "2", "--pp-size", "2", "--dtype", "bfloat16",
                          ranks=[0, 1, 2, 3])
    for rank in range(4):
        layout = Layout.from_rank(rank, tp_size=2, pp_size=2)
        cached = load_weights(str(ckpt), layout, socket_dir=daemon.socket_dir, name=daemon.name, fallback="error",
                              dtype="bfloat16")
        disk = load_from_disk(expect(str(ckpt), layout, dtype="bfloat16"))
        assert set(cached.tensors) == set(disk.tensors)
        assert all(torch.equal(cached.tensors[n], disk.tensors[n]) for n in disk.tensors)
