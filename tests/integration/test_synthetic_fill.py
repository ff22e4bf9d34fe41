"""A daemon started with ``--synthetic-fill`` (benchmarks only) holds a byte pattern, and no engine that
expects the checkpoint's real weights maps it."""

from __future__ import annotations

from pathlib import Path

import torch
from weightcache.checkpoints.loader import SYNTHETIC_REVISION
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import DaemonConnection, load_weights


def test_an_engine_expecting_real_weights_never_maps_a_synthetic_arena(llama: Path, start_daemon) -> None:
    daemon = start_daemon(llama, dtype="bfloat16", synthetic_fill=True)
    assert "SYNTHETIC FILL" in daemon.output()
    with DaemonConnection(daemon.files[0].socket) as conn:
        assert conn.status().disk_bytes_read == 0  # nothing of the checkpoint was read

    real = load_weights(
        str(llama), Layout(), socket_dir=daemon.socket_dir, name=daemon.name, fallback="disk", dtype="bfloat16"
    )
    assert real.mode == "disk" and real.bytes_mapped == 0
    assert "revision" in real.fallback_reason

    synthetic = load_weights(
        str(llama),
        Layout(),
        socket_dir=daemon.socket_dir,
        name=daemon.name,
        fallback="error",
        dtype="bfloat16",
        revision=SYNTHETIC_REVISION,
    )
    assert synthetic.mode == "cache"
    assert set(synthetic.tensors) == set(real.tensors)
    for name, tensor in synthetic.tensors.items():
        assert tensor.shape == real.tensors[name].shape
        assert bool((tensor.contiguous().view(torch.uint8) == 0x3C).all()), name
