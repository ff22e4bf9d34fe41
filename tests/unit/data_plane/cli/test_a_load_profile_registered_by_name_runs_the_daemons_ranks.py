"""``weightcache daemon --profile NAME`` finds its rank's loader by name (``weightcache.profiles``):
the built-in profiles are the ones the contract names, an unknown name is refused with the known
ones, and a profile registered in one module is what a rank of that name runs."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest
from weightcache.cli import build_parser
from weightcache.commands import daemon
from weightcache.profiles import LoadProfile, get_profile, known_profiles, register_profile, unregister_profile
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import PROFILES

DAEMON = ["daemon", "--model", "/m", "--name", "q", "--socket-dir", "/run/wc", "--backend", "cpu-shm"]


class Recording(LoadProfile):
    """Loads nothing; keeps the arguments of each rank it was asked to run."""

    def __init__(self) -> None:
        self.ran: list[argparse.Namespace] = []

    def check(self, args: argparse.Namespace) -> None:
        if args.quantization != "none":
            raise WeightCacheError("--quantization belongs to the reference profile; drop it")

    def run_rank(self, args: argparse.Namespace) -> int:
        self.ran.append(args)
        return 7


@pytest.fixture
def recording() -> Iterator[LoadProfile]:
    register_profile("recording")(Recording)
    try:
        yield get_profile("recording")
    finally:
        unregister_profile("recording")


def test_the_built_in_profiles_are_the_ones_the_contract_names() -> None:
    assert known_profiles() == sorted(PROFILES)
    assert {get_profile(name).name for name in PROFILES} == set(PROFILES)


def test_an_unknown_profile_is_refused_with_the_known_ones() -> None:
    with pytest.raises(
        WeightCacheError, match=r"--profile 'trtllm' is no load profile here; use one of: reference, sglang, vllm"
    ):
        get_profile("trtllm")


def test_the_daemon_command_refuses_an_unknown_profile_before_any_rank_starts() -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "weightcache", *DAEMON, "--profile", "trtllm", "--ranks", "0-1", "--tp-size", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr
    assert "--profile 'trtllm' is no load profile here; use one of: reference, sglang, vllm" in refused.stderr, (
        refused.stderr
    )


def test_a_registered_profile_is_what_a_rank_of_its_name_runs(recording: Recording) -> None:
    assert daemon(build_parser().parse_args([*DAEMON, "--profile", "recording", "--tp-size", "2"])) == 7
    assert [(a.model, a.tp_size, a.profile) for a in recording.ran] == [("/m", 2, "recording")]


def test_a_profile_checks_its_flags_before_its_rank_runs(recording: Recording) -> None:
    with pytest.raises(WeightCacheError, match="--quantization belongs to the reference profile"):
        daemon(build_parser().parse_args([*DAEMON, "--profile", "recording", "--quantization", "fp8"]))
    assert recording.ran == []


def test_a_taken_profile_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'vllm' is registered already"):
        register_profile("vllm")(Recording)
