"""The compile-artifact key of a vLLM engine, from vLLM's own parsed configuration.

Called by the weightcache loader in every worker, after the weights are mapped and before vLLM
compiles (compilation runs after ``load_model``), when the engine runs under ``weightcache
artifacts-run`` (which sets ``WEIGHTCACHE_ARTIFACT_STAGING``): a published entry of the same key is
copied into the engine's ``VLLM_CACHE_ROOT`` and vLLM finds its compiled graphs there.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import os
import pprint
import time
from pathlib import Path

from vllm.config import VllmConfig
from weightcache_contract.launch import ENGINE_IMAGE_ENV

from ..artifacts.engine import DIR_ENV, STAGING_ENV
from ..artifacts.key import ArtifactKey, Claim
from ..artifacts.store import Store, write_atomically
from ..wire.fingerprint import Fingerprint
from .stamp import rank_fingerprint

log = logging.getLogger("vllm.weightcache")
COMPILE_CACHE_INDEX = "vllm_compile_cache.py"
"""vLLM's index of one rank's compiled graphs: a Python literal, ``{(range, graph index, compiler):
{"graph_handle": (key, path), "cache_key": ...}}``, read with ``ast.literal_eval``."""


def artifact_key(vllm_config: VllmConfig, ours: Fingerprint, backend: str, device: int = 0) -> ArtifactKey:
    """``ours``: this rank's fingerprint; the others' are computed alike, so every worker of the
    engine arrives at one key. vLLM's ``compute_hash`` covers what its compilation depends on in
    the configuration (the compilation config, shapes, dtypes, parallel sizes, model config)."""
    import torch
    import vllm

    parallel = vllm_config.parallel_config
    world = [
        rank_fingerprint(vllm_config, tp, pp, parallel.data_parallel_rank, backend=backend, device=device)
        for pp in range(parallel.pipeline_parallel_size)
        for tp in range(parallel.tensor_parallel_size)
    ]
    if ours not in world:
        raise AssertionError("this rank's fingerprint is not among the world's")
    weights = hashlib.sha256("".join(f.weights_digest + "\n" for f in world).encode()).hexdigest()
    env = ours.environment
    settings = ours.engine.settings if ours.engine is not None else {}
    if env.device_kind == "cpu":
        device_text = f"cpu:{settings.get('cpu_isa', '')}"
    else:
        device_text = f"{env.device_kind}:sm{env.compute_capability}:{env.cuda_runtime}"
    return ArtifactKey(
        engine="vllm",
        engine_version=vllm.__version__,
        torch_version=torch.__version__,
        image=os.environ.get(ENGINE_IMAGE_ENV, ""),
        device=device_text,
        weights=weights,
        compile_config=vllm_config.compute_hash(),
    )


def claim_artifacts(vllm_config: VllmConfig, ours: Fingerprint, backend: str, device: int = 0) -> Claim | None:
    """Under ``artifacts-run``: the engine's claim (a hit copies the entry in); None otherwise."""
    staging = os.environ.get(STAGING_ENV)
    if not staging:
        return None
    began = time.perf_counter()
    key = artifact_key(vllm_config, ours, backend, device)
    claim = Store(os.environ[DIR_ENV]).claim(Path(staging), key, prepare=relocate_compile_cache)
    log.info(
        "Compile artifacts: %s for key %s (%.3f s)",
        f"hit, copied entry {claim.hit}" if claim.hit else "miss, this engine compiles and its daemon publishes",
        key.digest,
        time.perf_counter() - began,
    )
    return claim


def relocate_compile_cache(data: Path) -> int:
    """Points every compiled graph of a copied entry at its file in this copy; the number of
    handles rewritten. vLLM 0.26 records a graph's handle as ``(key, absolute path)`` and loads the
    path as recorded, which lay in the publishing engine's staging directory, gone since: without
    this a warm engine fails at its first load (``FileNotFoundError: …/artifact_compile_range_…``).
    Later vLLMs load ``key`` relative to the index's directory and ignore the path. An index vLLM
    could not parse either, or a handle whose key is not a plain file name, is left as it is."""
    moved = 0
    for index in sorted((data / "torch_compile_cache").rglob(COMPILE_CACHE_INDEX)):
        if index.is_symlink() or not index.is_file():
            continue
        try:
            graphs = ast.literal_eval(index.read_text())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError) as exc:
            log.warning("Compile artifacts: %s is not vLLM's index (%s); left as it is", index, exc)
            continue
        if not isinstance(graphs, dict):
            continue
        changed = 0
        for graph in graphs.values():
            handle = graph.get("graph_handle") if isinstance(graph, dict) else None
            if not (isinstance(handle, tuple) and len(handle) == 2 and all(isinstance(h, str) for h in handle)):
                continue
            key, path = handle
            if key in ("", ".", "..") or Path(key).name != key:
                continue
            here = str(index.parent / key)
            if path != here:
                graph["graph_handle"] = (key, here)
                changed += 1
        if changed:
            write_atomically(index, pprint.PrettyPrinter(indent=4).pformat(graphs).encode(), 0o600)
            moved += changed
    if moved:
        log.info("Compile artifacts: %d compiled graph(s) pointed at this engine's copy", moved)
    return moved
