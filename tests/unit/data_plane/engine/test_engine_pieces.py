"""Small engine parts with no model: metrics text, the tokenizer and chat rendering, the timeline."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from weightcache.engine.metrics import Metrics
from weightcache.engine.timeline import Timeline, process_start_time
from weightcache.engine.tokenizer import Tokenizer


def test_metrics_render_prometheus_text_with_escaped_labels_and_cumulative_buckets() -> None:
    m = Metrics()
    m.describe("x_total", "counter", "things")
    m.inc("x_total", route="/v1/completions", code=200)
    m.inc("x_total", 2, route="/v1/completions", code=200)
    m.set("y", 1.5, reason='say "hi"\nthere')
    m.describe("lat", "histogram", "latency")
    for v in (0.004, 0.2, 100.0):
        m.observe("lat", v)
    text = m.render()
    assert '# TYPE x_total counter\nx_total{code="200",route="/v1/completions"} 3\n' in text
    assert 'y{reason="say \\"hi\\"\\nthere"} 1.5' in text
    assert 'lat_bucket{le="0.005"} 1' in text and 'lat_bucket{le="0.25"} 2' in text
    assert 'lat_bucket{le="60"} 2' in text and 'lat_bucket{le="+Inf"} 3' in text and "lat_count 3" in text
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]+="([^"\\]|\\.)*",?)*\})? \S+$')
    assert all(line.startswith("#") or sample.match(line) for line in text.strip().splitlines())


def test_tokenizer_round_trips_and_knows_its_eos(checkpoint_factory) -> None:
    tok = Tokenizer(checkpoint_factory(family="llama"))
    ids = tok.encode("The weight cache keeps a model's weights resident.")
    assert len(ids) > 3 and tok.decode(ids) == "The weight cache keeps a model's weights resident."
    assert tok.eos_token_ids == frozenset({0})


# Text the tokenizers must agree on: ASCII, code, runs of spaces and newlines, accents, CJK, emoji
# (bytes outside the trained merges), a special token's text and the empty string.
TOKENIZER_SAMPLES = [
    "The weight cache keeps a model's weights resident.",
    "def add(a, b):\n    return a + b\n\n\nprint(add(2, 3))",
    "  leading and   inner   spaces\t\ttabs ",
    "naïve café, Grüße — 東京 🚀 ∑x²",
    "<|endoftext|> after the end",
    "",
]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_tokenizer_gives_transformers_ids_and_text_without_importing_it(checkpoint_factory, family: str) -> None:
    """The engine reads tokenizer.json with ``tokenizers`` alone; transformers' AutoTokenizer (what
    the oracle and the old demo used) must produce the same ids and the same decoded text."""
    from weightcache.tools.reference_hf import tokenizer_for

    model = checkpoint_factory(family=family)
    ours, theirs = Tokenizer(model), tokenizer_for(model)
    for text in TOKENIZER_SAMPLES:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    every_id = list(range(theirs.vocab_size))  # each token alone, specials included
    assert [ours.decode([i]) for i in every_id] == [theirs.decode([i], skip_special_tokens=True) for i in every_id]
    assert ours.eos_token_ids >= {theirs.eos_token_id}


def test_chat_uses_the_checkpoint_template_when_it_has_one(checkpoint_factory, tmp_path) -> None:
    src = checkpoint_factory(family="llama")
    tok = Tokenizer(src)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == "system: be brief\nuser: hi\nassistant:"
    (tmp_path / "tokenizer.json").write_text((src / "tokenizer.json").read_text())
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    templated = Tokenizer(tmp_path).render_chat(messages)
    assert templated == "<|system|>be brief<|endoftext|><|user|>hi<|endoftext|><|assistant|>"


def test_timeline_starts_at_the_process_start_and_orders_phases() -> None:
    # A fresh interpreter asks right away: its age must be that of a young process, not of the
    # epoch, the boot, or a clock rounded to whole seconds.
    code = (
        "import time; from weightcache.engine.timeline import process_start_time; "
        "time.sleep(0.3); print(time.time() - process_start_time())"
    )
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.3 <= age < 5.0
    assert process_start_time() < time.time()
    t = Timeline(started_at=time.time() - 1.0)
    for phase in ("imports", "distributed_init", "weights_bound", "warmup", "ready"):
        t.mark(phase)
    d = t.durations()
    assert list(d) == ["imports", "distributed_init", "weights_bound", "warmup", "ready"]
    assert d["imports"] >= 1.0 and all(v >= 0 for v in d.values())
    assert abs(sum(d.values()) - t.marks["ready"]) < 1e-9


def test_each_gpu_rank_gets_its_own_device_from_the_visible_list() -> None:
    import pytest
    from weightcache.engine.launcher import rank_gpus
    from weightcache_contract.errors import WeightCacheError

    assert rank_gpus(2, None) == ["0", "1"]
    assert rank_gpus(2, "GPU-aaa, GPU-bbb,GPU-ccc") == ["GPU-aaa", "GPU-bbb"]
    with pytest.raises(WeightCacheError, match="needs 4 GPUs"):
        rank_gpus(4, "3,5")


def test_engine_flags_come_from_the_environment_and_the_command_line_wins(monkeypatch) -> None:
    from weightcache.cli import build_parser

    monkeypatch.setenv("WEIGHTCACHE_ENGINE_MODEL", "/models/m")
    monkeypatch.setenv("WEIGHTCACHE_ENGINE_TP_SIZE", "4")
    monkeypatch.setenv("WEIGHTCACHE_ENGINE_WEIGHT_BLOCK_SIZE", "64,64")
    monkeypatch.setenv("WEIGHTCACHE_ENGINE_SOCKET_DIR", "/run/wc")
    monkeypatch.setenv("WEIGHTCACHE_ENGINE_NAME", "qwen")
    monkeypatch.setenv("WEIGHTCACHE_ENGINE_PORT", "not-a-port")
    args = build_parser().parse_args(["engine", "--port", "9000"])
    assert (args.model, args.tp_size, args.weight_block_size, args.socket_dir, args.name, args.port) == (
        "/models/m",
        4,
        (64, 64),
        "/run/wc",
        "qwen",
        9000,
    )
    assert args.tp_rank is None
    # A bad environment value breaks only the engine command, and as a usage error.
    assert build_parser().parse_args(["probe", "--name", "x"]).command == "probe"
