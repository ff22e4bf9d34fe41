"""Generates the WeightCache CustomResourceDefinition from the pydantic models in the ``spec`` package.

Kubernetes accepts only *structural* OpenAPI v3 schemas: every node has a ``type``, no ``$ref``,
no ``anyOf``/``oneOf``/``allOf`` carrying types, ``additionalProperties`` never next to
``properties`` (and never a boolean), ``exclusiveMinimum`` a boolean (OpenAPI 3.0) rather than a
number (JSON Schema 2020-12). pydantic emits the latter dialect, so ``structural()`` rewrites it,
and refuses anything it cannot rewrite faithfully instead of guessing.

``python -m weightcache_operator.crd`` prints the CRD; ``--write [PATH]`` writes the checked-in
``crds/weightcache.yaml``, which tests/unit/chart/test_crd.py keeps equal to this output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from weightcache_operator import spec

Schema = dict[str, Any]

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "weightcache.yaml"
COMMAND = "python -m weightcache_operator.crd --write"
HEADER = f"# Generated from operator/weightcache_operator/spec/ by `{COMMAND}`; do not edit.\n"

# JSON Schema keys with no meaning to the API server (or forbidden by it).
_DROPPED_KEYS = frozenset({"title", "$defs", "$schema"})
_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_VALIDATIONS = "x-kubernetes-validations"

PRINTER_COLUMNS: list[Schema] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    # Next to the phase: a Ready cache whose daemons move to a new generation says how.
    {"name": "Change", "type": "string", "jsonPath": ".status.generationChange"},
    {"name": "Ready Nodes", "type": "string", "jsonPath": ".status.readyNodes"},
    {"name": "Active", "type": "integer", "jsonPath": ".status.activeEngines"},
    {"name": "Standby", "type": "integer", "jsonPath": ".status.standbyEngines"},
    {"name": "Served Model", "type": "string", "jsonPath": ".status.servedModelName"},
    {"name": "Model", "type": "string", "jsonPath": ".status.model"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # Last: it can be long, and the columns before it are the glance.
    {"name": "Message", "type": "string", "jsonPath": ".status.message"},
]


class UnsupportedSchema(ValueError):
    """A model produced JSON Schema that has no faithful structural equivalent."""


def structural(schema: Schema, defs: dict[str, Schema] | None = None, where: str = "") -> Schema:
    """Returns a structural OpenAPI v3 copy of pydantic's JSON schema ``schema``."""
    defs = schema.get("$defs", {}) if defs is None else defs
    node = _inline(schema, defs, where)
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "default" and value is None:
            continue  # "no value": the field is simply optional
        if key == "properties":
            out[key] = {name: structural(sub, defs, f"{where}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value, defs, f"{where}[]")
        elif key == "additionalProperties":
            if value is True or value == {}:
                out[_PRESERVE] = True
            elif isinstance(value, dict):
                out[key] = structural(value, defs, f"{where}{{}}")
            # False: the API server prunes unknown fields anyway, and refuses the boolean.
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == _VALIDATIONS:
            out[key] = [{"rule": rule["rule"], **rule} for rule in value]  # rule first, for readers
        elif key == "const":
            out["enum"] = [value]
        elif key in ("anyOf", "oneOf", "allOf", "not", "$ref", "prefixItems"):
            raise UnsupportedSchema(f"{where or '<root>'}: {key} left after inlining: {node}")
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" in out:
        raise UnsupportedSchema(f"{where}: properties and additionalProperties together")
    if "type" not in out:
        if out.get(_PRESERVE) or out.get("x-kubernetes-int-or-string"):
            pass
        elif set(out) <= {"description", "default"}:  # typing.Any
            out[_PRESERVE] = True
        else:
            raise UnsupportedSchema(f"{where or '<root>'}: no type in {out}")
    if "description" in out:
        out["description"] = _prose(out["description"])
    return dict(sorted(out.items(), key=lambda item: _key_rank(item[0])))


_FIRST = ("type", "description", "format", "enum", "default", "required")
_LAST = ("properties", "additionalProperties", "items")


def _key_rank(key: str) -> tuple[int, int, str]:
    """Stable, readable key order in the YAML: what a node is first, its children last."""
    if key in _FIRST:
        return (0, _FIRST.index(key), "")
    if key in _LAST:
        return (2, _LAST.index(key), "")
    return (1, 0, key)


def _prose(text: str) -> str:
    """A docstring as one line for `kubectl explain`: no hard wraps, no reST literals."""
    return " ".join(text.replace("``", "`").split())


def _inline(node: Schema, defs: dict[str, Schema], where: str) -> Schema:
    """Resolves ``$ref``, single-branch ``allOf`` and ``X | None`` unions into one plain node.

    Keys next to a ``$ref`` (description, default, field-level CEL rules) win over the target's,
    except CEL rules, which are concatenated: a field's rules and its type's rules both apply."""
    node = dict(node)
    for combinator in ("anyOf", "oneOf"):
        if combinator in node:
            branches = [b for b in node[combinator] if b != {"type": "null"}]
            if len(branches) != 1:
                raise UnsupportedSchema(f"{where}: {combinator} with {len(branches)} non-null branches")
            del node[combinator]
            node = _merge(branches[0], node)
    if "allOf" in node:
        if len(node["allOf"]) != 1:
            raise UnsupportedSchema(f"{where}: allOf with {len(node['allOf'])} branches")
        node = _merge(node.pop("allOf")[0], node)
    if "$ref" in node:
        name = node.pop("$ref").removeprefix("#/$defs/")
        if name not in defs:
            raise UnsupportedSchema(f"{where}: unresolved $ref {name}")
        node = _merge(defs[name], node)
    if any(key in node for key in ("anyOf", "oneOf", "allOf", "$ref")):
        return _inline(node, defs, where)
    return node


def _merge(target: Schema, overrides: Schema) -> Schema:
    merged = {**target, **overrides}
    if _VALIDATIONS in target and _VALIDATIONS in overrides:
        merged[_VALIDATIONS] = [*target[_VALIDATIONS], *overrides[_VALIDATIONS]]
    return merged


def openapi_schema() -> Schema:
    """The whole object's schema: apiVersion, kind, metadata, spec (required) and status."""
    spec_schema = structural(spec.WeightCacheSpec.model_json_schema(by_alias=True, mode="validation"), where="spec")
    status_schema = structural(
        spec.WeightCacheStatus.model_json_schema(by_alias=True, mode="validation"), where="status"
    )
    return {
        "type": "object",
        "description": _prose(spec.WeightCache.__doc__ or ""),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }


def custom_resource_definition() -> Schema:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition for WeightCache, as a dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{spec.PLURAL}.{spec.GROUP}"},
        "spec": {
            "group": spec.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": spec.KIND,
                "listKind": f"{spec.KIND}List",
                "plural": spec.PLURAL,
                "singular": spec.SINGULAR,
                "shortNames": list(spec.SHORT_NAMES),
            },
            "versions": [
                {
                    "name": spec.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def render() -> str:
    """The CRD as the YAML text checked in at crds/weightcache.yaml (stable key order)."""
    body = yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m weightcache_operator.crd", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", nargs="?", const=str(CRD_PATH), metavar="PATH", help=f"write the file (default {CRD_PATH})"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        path = Path(args.write)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
