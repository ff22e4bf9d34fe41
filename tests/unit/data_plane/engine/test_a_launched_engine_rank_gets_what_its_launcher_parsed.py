"""The engine launcher starts each rank with what its own parser made of its flags and environment:
full flag names whatever the user typed (``--flag=value``, unambiguous prefixes), and every value
written out, so the environment a rank inherits cannot put back a value the launcher's command line
overrode."""

from __future__ import annotations

import pytest
from weightcache.cli import build_parser
from weightcache_contract.launch import EngineArgs


def engine(argv: list[str]) -> EngineArgs:
    return EngineArgs.from_namespace(build_parser().parse_args(["engine", *argv]))


def test_a_rank_gets_the_launchers_values_in_full_names_however_the_user_spelled_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(EngineArgs.variable("port"), "9000")  # the command line below wins over it
    monkeypatch.setenv(EngineArgs.variable("max_active"), "3")  # set only here: the rank gets it too
    launcher = engine(["--mod=/m", "--tp-s", "2", "--port", "8000", "--served=tiny", "--weight-cache-m=client"])
    assert (launcher.model, launcher.tp_size, launcher.port, launcher.max_active) == ("/m", 2, 8000, 3)

    argv = launcher.but(tp_rank=1).to_argv()
    assert "--tp-s" not in argv and not any(t.startswith("--") and "=" in t for t in argv), argv
    rank = engine(argv)  # the rank inherits the launcher's environment, port 9000 included
    assert rank == launcher.but(tp_rank=1)
    assert (rank.port, rank.max_active, rank.served_model_name, rank.weight_cache_mode) == (8000, 3, "tiny", "client")


def test_a_setting_the_environment_gets_wrong_fails_only_the_engine_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(EngineArgs.variable("max_queue"), "lots")
    assert build_parser().parse_args(["keeper"]).command == "keeper"  # other commands do not read it
    with pytest.raises(SystemExit) as exited:
        engine(["--model", "/m"])
    assert exited.value.code == 2
    assert "argument --max-queue: WEIGHTCACHE_ENGINE_MAX_QUEUE='lots'" in capsys.readouterr().err
