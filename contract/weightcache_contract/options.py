"""Typed command lines: each flag defined once, as an ``Option``, and every command line and
environment of ours produced and parsed from that one definition.

A launch dataclass (``launch.DaemonArgs``, ``launch.EngineArgs``, ...) declares its fields with
``takes(OPTION)``. From the same declaration ``add_options`` builds the receiving process's argparse
parser, ``argv`` renders a value's command line by walking *that parser's* actions (so a flag is
never spelled a second time by a producer), ``environment`` renders it as variables, and
``from_namespace`` reads what the parser produced back into the typed value. Renaming a flag is
the one line of its ``Option``. Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass
from typing import Any, Literal, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    """One flag: its spelling, how argparse reads it, and how a typed value is written back.

    ``kind``: ``value`` (``--flag VALUE``), ``switch`` (``--flag``, a bool) or ``append``
    (``--flag VALUE`` repeated, a list). ``show`` turns a typed value into its text; ``read`` turns
    what argparse produced into the typed value (default: lists become tuples). ``aliases`` are
    extra spellings the parser accepts and no producer writes."""

    flag: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    help: str = ""
    kind: Literal["value", "switch", "append"] = "value"
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    required: bool = False
    hidden: bool = False
    aliases: tuple[str, ...] = ()
    show: Callable[[Any], str] | None = None
    read: Callable[[Any], Any] | None = None
    name: str = ""

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under: ``name``, else the flag's (``--tp-size`` → ``tp_size``)."""
        return self.name or self.flag.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser, **changes: Any) -> argparse.Action:
        """Registers this option (``changes``: a command's own default, help, ...) with ``parser``."""
        option = dataclasses.replace(self, **changes) if changes else self
        return _add(parser, option, option.default, option.type, argparse.SUPPRESS if option.hidden else option.help)

    def text(self, value: Any) -> str:
        if self.show is not None:
            return self.show(value)
        if isinstance(value, (tuple, list)):
            return ",".join(str(v) for v in value)
        return str(value)

    def typed(self, parsed: Any) -> Any:
        if self.read is not None and parsed is not None:
            return self.read(parsed)
        return tuple(parsed) if isinstance(parsed, list) else parsed


def takes(option: Option, *, required: bool | None = None, unset: Any = MISSING, **changes: Any) -> Any:
    """A dataclass field that is ``option``, with the command's own ``changes`` to it (default,
    help, aliases; a ``flag`` of its own keeps the option's value name). ``required``: the field
    has no default (default: when the flag is required); ``unset``: the field's default when it
    differs from the parser's (a value the producer leaves out unless it sets it)."""
    if "flag" in changes:
        changes.setdefault("name", option.dest)
    if required is False:
        changes["required"] = False  # nor is the flag: the value may come from elsewhere (the environment)
    chosen = dataclasses.replace(option, **changes) if changes else option
    metadata = {"option": chosen}
    if chosen.kind == "append":
        return dataclasses.field(default_factory=tuple, metadata=metadata)
    if chosen.required or required:
        return dataclasses.field(metadata=metadata)
    default = bool(chosen.default) if chosen.kind == "switch" else chosen.default
    return dataclasses.field(default=default if unset is MISSING else unset, metadata=metadata)


def options_of(cls: type) -> list[Option]:
    """The options of a launch dataclass, in field order (which is the parser's and the argv's)."""
    found = []
    for field in dataclasses.fields(cls):
        option = field.metadata.get("option")
        if option is None:
            raise TypeError(f"{cls.__name__}.{field.name} is not declared with takes(OPTION)")
        if option.dest != field.name:
            raise TypeError(f"{cls.__name__}.{field.name} takes {option.flag}, whose value is {option.dest}")
        found.append(option)
    return found


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    defaults: Mapping[str, Any] | None = None,
    env: Callable[[str], str] | None = None,
) -> list[argparse.Action]:
    """Registers ``cls``'s options with ``parser``. ``defaults`` overrides a default by field name
    (one the receiving process decides, such as a directory read from its environment); ``env``
    maps a flag to the variable that sets its default, for commands that take their settings from
    the environment too (a flag on the command line wins)."""
    actions = []
    for option in options_of(cls):
        default = (defaults or {}).get(option.dest, option.default)
        help = argparse.SUPPRESS if option.hidden else option.help
        kind = option.type
        if env is not None:
            name = env(option.flag)
            help = help if option.hidden else f"{help} [env {name}]"
            if name in os.environ:
                default = os.environ[name]
                if kind is not None:  # argparse converts a string default when the command runs
                    kind = _naming(kind, name)
        actions.append(_add(parser, option, default, kind, help))
    return actions


def _add(
    parser: argparse.ArgumentParser, option: Option, default: Any, kind: Callable[[str], Any] | None, help: str
) -> argparse.Action:
    keywords: dict[str, Any] = {"help": help, "dest": option.dest}
    if option.kind == "switch":
        return parser.add_argument(option.flag, *option.aliases, action="store_true", default=bool(default), **keywords)
    if option.kind == "append":
        keywords |= {"action": "append", "default": list(default or ())}
    else:
        keywords["default"] = default
    if kind is not None:
        keywords["type"] = kind
    if option.metavar is not None:
        keywords["metavar"] = option.metavar
    if option.choices is not None:
        keywords["choices"] = list(option.choices)
    if option.required and default is None:
        keywords["required"] = True
    return parser.add_argument(option.flag, *option.aliases, **keywords)


def _naming(kind: Callable[[str], Any], variable: str) -> Callable[[str], Any]:
    """``kind`` whose refusal of a value names the environment variable it came from."""

    def convert(text: str) -> Any:
        try:
            return kind(text)
        except (ValueError, argparse.ArgumentTypeError) as error:
            raise argparse.ArgumentTypeError(f"{variable}={text!r}: {error}") from None

    convert.__name__ = getattr(kind, "__name__", "value")
    return convert


def _written(value: Any, always: Iterable[str], every: bool) -> Iterator[tuple[Option, str, Any]]:
    """The options ``value`` writes, with the spelling its parser gives each first, in the parser's
    order: each one set and differing from the parser's default (``always``: fields written at
    their default too; ``every``: every value that is not None)."""
    keep = set(always)
    options = {o.dest: o for o in options_of(type(value))}
    for action in add_options(argparse.ArgumentParser(add_help=False), type(value)):
        option, current = options[action.dest], getattr(value, action.dest)
        if current is None or (option.kind == "append" and not current):
            continue
        if every or action.dest in keep or current != option.typed(action.default):
            yield option, action.option_strings[0], current


def argv(value: Any, *, always: Iterable[str] = (), every: bool = False) -> list[str]:
    """``value``'s command line, generated from the parser its dataclass builds (``_written``);
    ``every`` is for a child process whose environment could otherwise set a default of its own."""
    out: list[str] = []
    for option, flag, current in _written(value, always, every):
        if option.kind == "switch":
            out += [flag] if current else []
        else:
            for item in current if option.kind == "append" else (current,):
                out += _pair(flag, option.text(item))
    return out


def _pair(flag: str, text: str) -> list[str]:
    # argparse reads a separate word that starts with "-" as a flag of its own ("--revision -rc1"
    # is refused as a missing value): such a value goes in the flag's own word.
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def environment(value: Any, name: Callable[[str], str], *, always: Iterable[str] = ()) -> dict[str, str]:
    """``value`` as environment variables ``name(flag)``, the same values ``argv`` writes."""
    return {name(flag): option.text(current) for option, flag, current in _written(value, always, every=False)}


def from_namespace(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """The typed value of what ``add_options(parser, cls)`` parsed into ``args``; ``overrides``:
    fields given instead of read."""
    values = {o.dest: o.typed(getattr(args, o.dest)) for o in options_of(cls) if o.dest not in overrides}
    return cls(**values, **overrides)
