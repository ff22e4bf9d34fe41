"""A whole engine profile for the data plane in this one module, as a new engine would add one:
its own argument parser, configuration and model, registered by name, published and handed over
by the shared publisher core (``weightcache.engine_profiles``). ``python toy_engine.py daemon
--profile toy --engine-args '["--width","24"]' …`` is ``weightcache`` with this profile known."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn
from weightcache.checkpoints.checkpoint import open_checkpoint
from weightcache.checkpoints.quantization import resolve
from weightcache.checkpoints.sharding import Layout
from weightcache.engine_profiles.profile import EngineLoadProfile
from weightcache.engine_profiles.publisher import EngineRank
from weightcache.profiles import register_profile
from weightcache.wire.fingerprint import EngineStamp, Fingerprint, compute
from weightcache_contract.errors import WeightCacheError

NAME = "toy"
LOADS = "TOY_LOADS"
"""A file the toy appends a line to for each load (the test counts them: a re-adoption loads nothing)."""


def parse(engine_args: list[str]) -> argparse.Namespace:
    """The toy's own parser; what it refuses is refused before the rank claims anything."""
    parser = argparse.ArgumentParser(prog="toy", exit_on_error=False, add_help=False)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--draft-model")
    try:
        parsed = parser.parse_args(engine_args)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise WeightCacheError(f"the toy's parser refused --engine-args {engine_args}: {exc}; fix the list") from None
    if parsed.draft_model:
        raise WeightCacheError("the toy cannot serve a draft model from the cache; remove --draft-model")
    return parsed


def toy_model(width: int) -> nn.Module:
    torch.manual_seed(width)
    return nn.Sequential(nn.Linear(width, 32), nn.Linear(32, 8))


def toy_fingerprint(model: str, width: int, layout: Layout = Layout(), backend: str = "cpu-shm") -> Fingerprint:
    base = compute(open_checkpoint(model, stamps_only=True), layout, resolve("none", None, None), "float32",
                   revision="", backend=backend)  # fmt: skip
    stamp = EngineStamp(engine=NAME, version="1", load_profile=NAME, settings={"width": str(width)})
    return base.model_copy(update={"engine": stamp})


class ToyRank(EngineRank):
    profile = NAME

    def __init__(self) -> None:
        self.width = 0

    def prepare(self, args: argparse.Namespace, engine_args: list[str], layout: Layout, device: int) -> Fingerprint:
        self.width = parse(engine_args).width
        return toy_fingerprint(args.model, self.width, layout, args.backend)

    def join(self, layout: Layout, rendezvous: str, device: int) -> None:
        assert rendezvous.startswith("tcp://127.0.0.1:")

    def load(self, device: int) -> nn.Module:
        import os

        with open(os.environ[LOADS], "a") as out:
            out.write("load\n")
        return toy_model(self.width)


class Toy(EngineLoadProfile):
    def engine_rank(self) -> EngineRank:
        return ToyRank()

    def compile_env(self, data: Path, environ: Mapping[str, str]) -> dict[str, str]:
        return {"TOY_CACHE": str(data / "toy")}


if __name__ == "__main__":
    # Registered where it runs only: a test process that imports the toy's helpers keeps the
    # built-in profiles alone.
    register_profile(NAME)(Toy)
    from weightcache.cli import main

    sys.exit(main(sys.argv[1:]))
