"""Cross-field validation (validation.parse): a spec the schema accepts but the operator cannot run is
refused with a message that names the field and what to fix."""

from __future__ import annotations

from typing import Any

import pytest
from builders import BASE, changed
from weightcache_operator.observe.validation import parse


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        (
            {
                "daemon.backend": "cuda-vmm",
                "parallelism.tensor": 4,
                "daemon.resources": {"limits": {"nvidia.com/gpu": 2}},
            },
            "GPUs per node must be ≥ ranks per node",
        ),
        (
            {
                "daemon.backend": "cuda-vmm",
                "engine.gpuAccess": "dra",
                "daemon.resources": {"requests": {"nvidia.com/gpu": 2}},
            },
            "remove nvidia.com/gpu",
        ),
        ({"daemon.resources": {"limits": {"nvidia.com/gpu": 1}}}, "cpu-shm uses no GPUs"),
        ({"model.quantization": {"method": "fp8", "weightBlockSize": [64, 64]}}, "verified for [128, 128] only"),
        ({"engine.template": {"spec": {"containers": [{"image": "x"}]}}}, "containers[0] needs a name"),
        ({"engine.template": {"spec": {"hostNetwork": True, "containers": [{"name": "e"}]}}}, "hostNetwork"),
        ({"daemon.backend": "rdma"}, "daemon.backend"),
        ({"parallelism.tensor": 3, "parallelism.nodes": 2}, "multiple of nodes"),
    ],
)
def test_invalid_specs_are_named(changes: dict[str, Any], needle: str) -> None:
    cache, problems = parse(changed(BASE, **changes))
    assert problems and any(needle in p for p in problems), problems
