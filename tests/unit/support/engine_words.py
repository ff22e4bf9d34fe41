"""Words of an identifier, for the checks that code outside an engine's own module names no engine."""

from __future__ import annotations

import re


def words_of(identifier: str) -> set[str]:
    """``uses_vllm`` → {uses, vllm}; ``VllmProfile`` → {vllm, profile}; ``VLLM_PROFILE`` likewise."""
    return {w.lower() for part in identifier.split("_") for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", part)}
