"""The repository's example WeightCache manifests (examples/) as the API server would hand them to
the operator: namespaced, with a uid and a generation."""

from __future__ import annotations

from typing import Any

import yaml
from repo_root import ROOT

EXAMPLES = ROOT / "examples"


def body(example: str = "weightcache-vllm-cpu.yaml") -> dict[str, Any]:
    loaded = yaml.safe_load((EXAMPLES / example).read_text())
    loaded["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    return dict(loaded)
