"""``weightcache`` command line: daemon, gpu-holder, keeper, status, probe, plan, gen-checkpoint, hf-generate,
demo, bench, engine."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from weightcache_contract import termination
from weightcache_contract.errors import WeightCacheError

from . import logfmt
from .arguments import default_backend


@dataclass(frozen=True)
class Command:
    """One subcommand. ``arguments`` and ``handler`` are ``module:function`` strings: the module of
    ``arguments`` is imported to build the parser (it must stay light and torch-free), the one of
    ``handler`` only when the command runs."""

    name: str
    help: str
    arguments: str
    handler: str


COMMANDS: tuple[Command, ...] = (
    Command(
        "daemon",
        "load a checkpoint once and serve it to engines",
        "weightcache.daemon.command:add_arguments",
        "weightcache.commands:daemon",
    ),
    Command(
        "gpu-holder",
        "book this pod's GPUs for a cache's daemons: write their UUIDs, then wait",
        "weightcache.commands:gpu_holder_arguments",
        "weightcache.commands:gpu_holder",
    ),
    Command(
        "keeper",
        "hold arena fds so caches outlive their daemons (no CUDA)",
        "weightcache.commands:keeper_arguments",
        "weightcache.commands:keeper",
    ),
    Command(
        "keeper-ctl",
        "ask the keeper what it holds, or release a cache's arenas",
        "weightcache.commands:keeper_ctl_arguments",
        "weightcache.commands:keeper_ctl",
    ),
    Command(
        "status",
        "ask a running daemon for its status (JSON)",
        "weightcache.commands:status_arguments",
        "weightcache.commands:status",
    ),
    Command(
        "probe",
        "exit 0 only if every listed rank is ready: file, live process, answering socket",
        "weightcache.commands:probe_arguments",
        "weightcache.commands:probe",
    ),
    Command(
        "plan",
        "dry run: what each rank would hold, from config.json and the headers alone",
        "weightcache.commands:plan_arguments",
        "weightcache.commands:plan",
    ),
    Command(
        "gen-checkpoint",
        "write a small real checkpoint with seeded random weights",
        "weightcache.commands:gen_checkpoint_arguments",
        "weightcache.commands:gen_checkpoint",
    ),
    Command(
        "hf-generate",
        "a transformers model fed by weightcache: greedy completion as JSON",
        "weightcache.commands:hf_generate_arguments",
        "weightcache.commands:hf_generate",
    ),
    Command(
        "demo",
        "the quick start: disk vs cache on a generated checkpoint",
        "weightcache.commands:demo_arguments",
        "weightcache.commands:demo",
    ),
    Command(
        "bench",
        "measure disk load, daemon load and map+bind; print a table",
        "weightcache.tools.bench:add_arguments",
        "weightcache.tools.bench:run",
    ),
    Command(
        "artifacts-run",
        "run an engine on the node's compile-artifact directory (stage, then publish once it serves)",
        "weightcache.artifacts.engine:add_arguments",
        "weightcache.artifacts.engine:run",
    ),
    Command(
        "warm",
        "an engine pod's sidecar: ready once the engine has served a request, and kept warm",
        "weightcache.warm:add_arguments",
        "weightcache.warm:run",
    ),
    Command(
        "engine",
        "the reference engine: a tensor-parallel OpenAI-compatible server",
        "weightcache.engine.command:add_arguments",
        "weightcache.engine.command:run",
    ),
)


def resolve(target: str) -> Any:
    """The function a ``module:function`` string names, importing its module."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weightcache", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get(logfmt.LEVEL_ENV, "info"))
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        resolve(command.arguments)(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = build_parser().parse_args(argv)
    args.started = started
    logfmt.setup(args.log_level)
    try:
        default_backend(args)
        handler = next(c.handler for c in COMMANDS if c.name == args.command)
        code: int = resolve(handler)(args)
        return code
    except WeightCacheError as exc:
        print(f"weightcache {args.command}: error: {exc}", file=sys.stderr)
        # The one place a process's fatal error becomes its container's termination message.
        termination.write(str(exc))
        return getattr(exc, "exit_code", 2)
    except Exception as exc:
        termination.write(f"unexpected {type(exc).__name__}: {exc} (a bug: please report it with the container's log)")
        raise
