"""The arena backends, defined once: what a ``WeightCache``'s ``spec.daemon.backend`` may say, what
the daemon's ``--backend`` accepts, and which of them live on a GPU or can be held by the keeper.
The order of ``Backend`` is the CRD's enum order."""

from __future__ import annotations

from typing import Literal, get_args

Backend = Literal["cuda-vmm", "cuda-ipc", "cpu-shm"]
BACKENDS: tuple[str, ...] = get_args(Backend)

GPU_BACKENDS: tuple[str, ...] = ("cuda-vmm", "cuda-ipc")
"""Arenas in GPU memory: the daemon needs a visible GPU, engines compute on it."""

FD_BACKENDS: tuple[str, ...] = ("cpu-shm", "cuda-vmm")
"""Arenas exported as an fd (memfd or cuMem POSIX fd), which the keeper can hold; a legacy CUDA IPC
handle (cuda-ipc) cannot be held by it."""
