"""What the ``sglang`` profile cannot publish is refused from SGLang's own parse and resolution of
``--engine-args`` — a flag, ``--flag=value``, a prefix of it or a ``--config`` file; what SGLang's
parser itself refuses (an underscore form) is refused as it refuses it — before any rank file
exists, each with one line naming the fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_harness import ROOT, env, qwen3_checkpoint, sglang_args
from weightcache.sglang.build import model_config_of
from weightcache.sglang.server_args import parse, refuse_quantization, refuse_unservable
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import SGLANG_PROFILE, DaemonArgs


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen3_checkpoint(tmp_path_factory.mktemp("qwen3"))


def refusal(model: Path, extra: list[str], tp_size: int = 1) -> str:
    with pytest.raises(WeightCacheError) as refused:
        server_args = parse(str(model), [*sglang_args(), *extra])
        refuse_unservable(server_args, str(model), tp_size, 1)
        refuse_quantization(model_config_of(server_args, 0))
    return str(refused.value)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--load-format", "dummy"], "load_format='dummy'"),
        (["--load-format=dummy"], "load_format='dummy'"),
        # SGLang's parser has no underscore forms: refused as SGLang would refuse it.
        (["--load_format=dummy"], "SGLang's server-argument parser refused"),
        (["--load-form", "pt"], "load_format='pt'"),
        (["--load-format", "layered"], "load_format='layered'"),
        (["--model-loader-extra-config", '{"a": 1}'], "model_loader_extra_config="),
        (["--quantization", "w8a8_int8"], "quantization='w8a8_int8'"),
        (["--quantization", "fp8"], "quantize to FP8 per tensor while loading"),
        (["--speculative-algorithm", "NGRAM"], "speculative decoding (NGRAM)"),
        (["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "q_proj"], "LoRA adapters"),
        (["--lora-paths", "a=/nonexistent"], "LoRA adapters"),
        (["--dp-size", "2"], "data parallel 2"),
        (["--weight-cache-mode", "client"], "SGLang's own weight cache daemon"),
        (["--tp-size", "2"], "tensor parallel 2 and pipeline parallel 1, but the daemon was started with --tp-size 1"),
        (["--no-such-flag"], "SGLang's server-argument parser refused"),
    ],
)
def test_each_spelling_is_refused_from_sglangs_parse(model: Path, extra: list[str], message: str) -> None:
    assert message in refusal(model, extra)


def test_another_model_in_the_list_is_refused(model: Path, tmp_path: Path) -> None:
    other = shutil.copytree(model, tmp_path / "other")
    assert f"set SGLang's model to {str(other)!r}" in refusal(model, ["--model-path", str(other)])


def test_a_config_file_is_read_as_sglang_reads_it(model: Path, tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("load-format: dummy\n")
    assert "load_format='dummy'" in refusal(model, ["--config", str(config)])


def test_arguments_that_do_not_change_the_bytes_are_served(model: Path) -> None:
    server_args = parse(str(model), [*sglang_args(), "--load-format", "safetensors", "--skip-tokenizer-init"])
    refuse_unservable(server_args, str(model), 1, 1)
    refuse_quantization(model_config_of(server_args, 0))


def test_the_daemon_stops_before_any_rank_file_with_the_one_line(model: Path, tmp_path: Path) -> None:
    launch = DaemonArgs(
        model=str(model),
        name="refused",
        socket_dir=str(tmp_path / "sockets"),
        backend="cpu-shm",
        profile=SGLANG_PROFILE,
        engine_args=(*sglang_args(), "--load-format", "dummy"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "weightcache", "daemon", *launch.to_argv()],
        env=env(tmp_path / "calls"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "load_format='dummy'" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "sockets" / "refused").exists()
    assert json.loads(json.dumps(launch.to_argv()))  # the command as rendered
