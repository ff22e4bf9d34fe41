"""Every flag and engine variable of ours is written once, in ``weightcache_contract/launch.py``:
producers render from the receiving parser, so a renamed flag renames every command line that
carries it, and a producer that spelled a flag by hand is found here."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest
from repo_root import ROOT
from weightcache_contract import launch
from weightcache_contract.launch import ENGINE_IMAGE_ENV, DaemonArgs, EngineArgs, KeeperArgs, PlanArgs
from weightcache_contract.options import Option, add_options, argv, from_namespace, options_of, takes

PRODUCT = [ROOT / "contract", ROOT / "daemon_image", ROOT / "operator"]
DEFINITION = ROOT / "contract" / "weightcache_contract" / "launch.py"
PROFILES = ROOT / "operator" / "weightcache_operator" / "profiles"
ENGINES_OWN = {p for p in PROFILES.glob("*.py") if p.stem not in ("__init__", "base", "reference")}
"""Engine profiles write their engine's own flags, some spelled as ours (vLLM's --dtype, --port)."""
COMMANDS = (DaemonArgs, KeeperArgs, PlanArgs, EngineArgs)


def our_spellings() -> set[str]:
    flags = {o.flag for o in vars(launch).values() if isinstance(o, Option)}
    for command in COMMANDS:
        for option in options_of(command):
            flags |= {option.flag, *option.aliases}
    return flags | {launch.engine_env_name(o.flag) for o in options_of(EngineArgs)} | {ENGINE_IMAGE_ENV}


def literals(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_no_module_but_the_contract_spells_a_flag_or_engine_variable_of_ours() -> None:
    ours = our_spellings()
    assert ENGINES_OWN and {"--tp-size", "--tp", "--engine-args", "WEIGHTCACHE_ENGINE_TP_SIZE"} <= ours
    found = {
        f"{path.relative_to(ROOT)}: {literal}"
        for folder in PRODUCT
        for path in folder.rglob("*.py")
        if path != DEFINITION and path not in ENGINES_OWN
        for literal in literals(path) & ours
    }
    assert not found, "spelled outside weightcache_contract/launch.py (render it from its typed definition):\n" + (
        "\n".join(sorted(found))
    )


def test_renaming_a_flag_in_its_option_renames_it_for_the_producer_and_the_parser() -> None:
    renamed = dataclasses.make_dataclass(
        "Renamed",
        [
            ("model", str, takes(launch.MODEL)),
            ("tp_size", int, takes(launch.TP_SIZE, flag="--tensor-size")),
        ],
        frozen=True,
        kw_only=True,
    )
    value = renamed(model="/m", tp_size=4)
    written = argv(value)
    assert written == ["--model", "/m", "--tensor-size", "4"]
    parser = argparse.ArgumentParser()
    add_options(parser, renamed)
    assert from_namespace(renamed, parser.parse_args(written)) == value
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "/m", "--tp-size", "4"])  # the old spelling is gone with the rename


def test_a_field_whose_name_is_not_its_flags_value_is_refused_before_anything_renders() -> None:
    disagreeing = dataclasses.make_dataclass(
        "Disagreeing", [("tensor_parallel", int, takes(launch.TP_SIZE))], frozen=True, kw_only=True
    )
    with pytest.raises(TypeError, match="takes --tp-size, whose value is tp_size"):
        argv(disagreeing())
    untyped = dataclasses.make_dataclass("Untyped", [("tp_size", int, dataclasses.field(default=1))], frozen=True)
    with pytest.raises(TypeError, match="not declared with takes"):
        argv(untyped())


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.__name__)
def test_every_option_of_a_command_round_trips_through_its_own_parser(command: type) -> None:
    """Each field set away from its default, rendered and parsed back by the command's parser."""
    samples = {int: 3, float: 0.5, str: "x", bool: True}
    values: dict[str, object] = {}
    for option in options_of(command):
        if option.kind == "append":
            values[option.dest] = (5, 6)
        elif option.choices:
            values[option.dest] = option.choices[-1]
        elif option.dest in ("weight_block_size",):
            values[option.dest] = (128, 64)
        elif option.dest == "ranks":
            values[option.dest] = (0, 2, 3)
        elif option.dest == "engine_args":
            values[option.dest] = ("--dtype", "bfloat16")
        elif option.kind == "switch":
            values[option.dest] = True
        else:
            kind = option.type or str
            values[option.dest] = samples.get(kind, "x") if kind in samples else samples[int]
    value = command(**values)
    parser = argparse.ArgumentParser()
    add_options(parser, command)
    assert command.from_namespace(parser.parse_args(value.to_argv())) == value


def test_a_value_that_starts_with_a_dash_reaches_the_receiving_parser_as_a_value() -> None:
    value = DaemonArgs(model="-weights", name="c", socket_dir="/s", revision="-rc1", engine_args=("-tp", "2"))
    parser = argparse.ArgumentParser()
    add_options(parser, DaemonArgs)
    assert "--revision=-rc1" in value.to_argv() and "--model=-weights" in value.to_argv()
    assert DaemonArgs.from_namespace(parser.parse_args(value.to_argv())) == value
    engine = EngineArgs(model="/m", revision="-rc1", tp_rank=1)
    engine_parser = argparse.ArgumentParser()
    add_options(engine_parser, EngineArgs)
    assert EngineArgs.from_namespace(engine_parser.parse_args(engine.to_argv())) == engine
