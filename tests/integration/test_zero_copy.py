"""Mapped tensors are views into the arena; a second engine does not duplicate the weights."""

import json
import subprocess
import sys
from pathlib import Path

from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import load_weights
from weightcache.tools.reference_hf import bound_hf_model

SPEC = dict(family="llama", hidden_size=512, intermediate_size=1408, num_layers=8, vocab_size=4096, tokenizer=False)

ENGINE = r"""
import json, sys, torch
from weightcache.client.binding import bind
from weightcache.client.weights import load_weights
from weightcache.tools.reference_hf import empty_hf_model
from weightcache.checkpoints.sharding import Layout

def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

model_dir, socket_dir, name, mode = sys.argv[1:]
model = empty_hf_model(model_dir, "bfloat16")  # imports and skeleton: not weight memory
weights_before = anon_kib()
w = load_weights(model_dir, Layout(), socket_dir=socket_dir if mode == "client" else None,
                 name=name if mode == "client" else None, fallback="error", dtype="bfloat16")
bind(model, w.tensors, w.aliases)
with torch.inference_mode():
    model(torch.tensor([[1, 2, 3, 4]]))  # touches every weight page
print(json.dumps({"anon_growth": (anon_kib() - weights_before) * 1024, "mode": w.mode}))
"""


def test_bound_parameters_point_inside_the_mapped_arena(checkpoint_factory, start_daemon) -> None:
    ckpt = checkpoint_factory(family="qwen2", tie_word_embeddings=True)
    daemon = start_daemon(ckpt, dtype="bfloat16")
    weights = load_weights(
        str(ckpt), Layout(), socket_dir=daemon.socket_dir, name=daemon.name, fallback="error", dtype="bfloat16"
    )
    model = bound_hf_model(ckpt, weights)
    lo, hi = weights.arena.address_range
    params = list(model.named_parameters(remove_duplicate=False))
    assert params and all(lo <= p.data_ptr() < hi for _, p in params)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def run_engine(ckpt: Path, socket_dir: str, name: str, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", ENGINE, str(ckpt), socket_dir, name, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_engine_does_not_copy_the_weights(checkpoint_factory, start_daemon) -> None:
    ckpt = checkpoint_factory(**SPEC)
    daemon = start_daemon(ckpt, dtype="bfloat16")
    weight_bytes = daemon.files[0].read_ready().arena_bytes
    assert weight_bytes > 40 * 2**20
    first = run_engine(ckpt, daemon.socket_dir, daemon.name, "client")
    second = run_engine(ckpt, daemon.socket_dir, daemon.name, "client")
    disk = run_engine(ckpt, daemon.socket_dir, daemon.name, "off")
    assert first["mode"] == second["mode"] == "cache" and disk["mode"] == "disk"
    # Private (anonymous) memory of a mapping engine grows by activations only, not by the weights;
    # the same engine loading from disk grows by at least the weights — the measurement can tell.
    assert second["anon_growth"] < weight_bytes * 0.15, second
    assert disk["anon_growth"] > weight_bytes * 0.9, disk
