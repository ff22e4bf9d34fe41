import pytest
from weightcache.checkpoints.sharding import (
    ARCHITECTURES,
    Layout,
    Split,
    Stage,
    check_heads,
    kv_split,
    layer_range,
    rules_for,
    shard_bounds,
)
from weightcache_contract.errors import ShardingError, UnsupportedArchitecture


@pytest.mark.parametrize(
    "name, split, stage",
    [
        ("model.embed_tokens.weight", Split.VOCAB, Stage.FIRST),
        ("model.layers.3.self_attn.q_proj.weight", Split.COLUMN, Stage.LAYER),
        ("model.layers.3.self_attn.k_proj.bias", Split.KV_HEADS, Stage.LAYER),
        ("model.layers.3.self_attn.o_proj.weight", Split.ROW, Stage.LAYER),
        ("model.layers.3.mlp.up_proj.weight", Split.COLUMN, Stage.LAYER),
        ("model.layers.3.mlp.down_proj.weight", Split.ROW, Stage.LAYER),
        ("model.layers.3.mlp.down_proj.weight_scale_inv", Split.ROW, Stage.LAYER),
        ("model.layers.3.input_layernorm.weight", Split.REPLICATED, Stage.LAYER),
        ("model.norm.weight", Split.REPLICATED, Stage.LAST),
        ("lm_head.weight", Split.VOCAB, Stage.LAST),
    ],
)
def test_llama_table(name: str, split: Split, stage: Stage) -> None:
    rule, layer = rules_for("LlamaForCausalLM").rule_for(name)
    assert (rule.split, rule.stage) == (split, stage)
    assert layer == (3 if "layers" in name else None)


def test_qwen3_has_qk_norms_and_llama_does_not() -> None:
    rule, _ = rules_for("Qwen3ForCausalLM").rule_for("model.layers.0.self_attn.q_norm.weight")
    assert rule.split is Split.REPLICATED
    with pytest.raises(ShardingError, match="q_norm.*matches no sharding rule of LlamaForCausalLM"):
        rules_for("LlamaForCausalLM").rule_for("model.layers.0.self_attn.q_norm.weight")


def test_unknown_architecture_names_the_supported_ones() -> None:
    with pytest.raises(UnsupportedArchitecture, match="'MixtralForCausalLM' is not supported; supported: Llama"):
        rules_for("MixtralForCausalLM")
    assert set(ARCHITECTURES) == {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"}


@pytest.mark.parametrize(
    "name, split, quantized",
    [
        ("model.layers.5.mlp.gate.weight", Split.REPLICATED, False),  # the router
        ("model.layers.5.mlp.experts.17.gate_proj.weight", Split.EXPERT_COLUMN, True),
        ("model.layers.5.mlp.experts.17.up_proj.weight_scale_inv", Split.EXPERT_COLUMN, True),
        ("model.layers.5.mlp.experts.17.down_proj.weight", Split.EXPERT_ROW, True),
        ("model.layers.5.self_attn.k_norm.weight", Split.REPLICATED, False),
    ],
)
def test_qwen3_moe_table_replicates_the_router_and_splits_experts(name: str, split: Split, quantized: bool) -> None:
    rule, layer = rules_for("Qwen3MoeForCausalLM").rule_for(name)
    assert (rule.split, rule.quantize, layer) == (split, quantized, 5)
    assert rule.split.dim == {Split.REPLICATED: None, Split.EXPERT_COLUMN: 0, Split.EXPERT_ROW: 1}[split]


def test_expert_parallel_runs_of_the_tp_group_hold_whole_experts() -> None:
    # tp 4, ep 2: ranks 0,1 hold experts 0-3 split in two; ranks 2,3 experts 4-7.
    layouts = [Layout(tp_size=4, tp_rank=r, ep_size=2) for r in range(4)]
    assert [(lay.ep_rank, lay.moe_tp_rank, lay.moe_tp_size) for lay in layouts] == [
        (0, 0, 2),
        (0, 1, 2),
        (1, 0, 2),
        (1, 1, 2),
    ]
    assert [lay.expert_range(8) for lay in layouts] == [range(0, 4), range(0, 4), range(4, 8), range(4, 8)]
    assert [Layout(2, r, ep_size=2).expert_range(128) for r in range(2)] == [range(0, 64), range(64, 128)]
    assert Layout(2, 1).expert_range(8) == range(0, 8)  # ep 1: every rank a slice of every expert
    assert Layout.from_rank(3, tp_size=2, pp_size=2, ep_size=2) == Layout(2, 1, 2, 1, 2)


def test_expert_parallel_sizes_that_do_not_divide_are_refused_with_the_fix() -> None:
    with pytest.raises(ShardingError, match="--ep-size 3 must divide --tp-size 4"):
        Layout(tp_size=4, ep_size=3)
    with pytest.raises(ShardingError, match="--ep-size 0 must divide"):
        Layout(ep_size=0)
    with pytest.raises(ShardingError, match="num_experts=6 is not divisible by expert-parallel size 4; use an ep size"):
        Layout(tp_size=4, ep_size=4).expert_range(6)


@pytest.mark.parametrize("layers", [1, 2, 5, 7, 32, 61])
@pytest.mark.parametrize("pp", [1, 2, 3, 4])
def test_layer_ranges_are_disjoint_contiguous_and_complete(layers: int, pp: int) -> None:
    if pp > layers:
        with pytest.raises(ShardingError, match="exceeds"):
            layer_range(layers, pp, 0)
        return
    ranges = [layer_range(layers, pp, r) for r in range(pp)]
    flat = [i for r in ranges for i in r]
    assert flat == list(range(layers))
    assert max(len(r) for r in ranges) - min(len(r) for r in ranges) <= 1


def test_shard_bounds_split_evenly_and_refuse_uneven() -> None:
    assert [shard_bounds("w", 8, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(ShardingError, match="'w': dimension 10 does not split evenly into 4"):
        shard_bounds("w", 10, 4, 0)
    with pytest.raises(ShardingError, match="whole 128-blocks"):
        shard_bounds("w", 256, 4, 0, granule=128)


def test_layout_ranks_are_pipeline_major() -> None:
    layouts = [Layout.from_rank(r, tp_size=2, pp_size=2) for r in range(4)]
    assert [(lay.pp_rank, lay.tp_rank) for lay in layouts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(Layout.from_rank(lay.rank, 2, 2) == lay for lay in layouts)
    with pytest.raises(ShardingError, match="--tp-rank must be in"):
        Layout(tp_size=2, tp_rank=2)
    with pytest.raises(ShardingError, match="outside a world of 4"):
        Layout.from_rank(4, 2, 2)


def test_kv_heads_split_when_they_outnumber_ranks_and_replicate_when_ranks_outnumber_them() -> None:
    assert [kv_split(8, 4, r) for r in range(4)] == [(4, 0), (4, 1), (4, 2), (4, 3)]
    assert [kv_split(2, 4, r) for r in range(4)] == [(2, 0), (2, 0), (2, 1), (2, 1)]  # head r // (tp / kv)
    assert [kv_split(1, 2, r) for r in range(2)] == [(1, 0), (1, 0)]
    assert [kv_split(4, 16, r)[1] for r in range(16)] == [r // 4 for r in range(16)]


@pytest.mark.parametrize(
    "kv, tp, words",
    [
        (3, 2, "num_key_value_heads=3 is not divisible by tensor-parallel size 2"),
        (2, 3, "tensor-parallel size 3 is not a multiple of num_key_value_heads=2"),
        (4, 6, "not a multiple of num_key_value_heads=4"),
    ],
)
def test_tp_neither_dividing_nor_multiplying_the_kv_heads_is_refused(kv: int, tp: int, words: str) -> None:
    with pytest.raises(ShardingError, match=words):
        kv_split(kv, tp, 0)
    with pytest.raises(ShardingError, match=words):
        check_heads({"num_attention_heads": 12 * tp, "num_key_value_heads": kv}, tp)


def test_query_heads_must_still_divide_by_tp_when_kv_heads_replicate() -> None:
    check_heads({"num_attention_heads": 8, "num_key_value_heads": 1}, 8)
    check_heads({"num_attention_heads": 8}, 4)  # no num_key_value_heads: multi-head attention
    with pytest.raises(ShardingError, match="num_attention_heads=6 is not divisible by tensor-parallel size 4"):
        check_heads({"num_attention_heads": 6, "num_key_value_heads": 2}, 4)
