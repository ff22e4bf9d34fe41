"""The memory a rank's tensors live in, one allocation per rank: ``arena`` (the interface, the
``cpu-shm`` memfd and the engine-side read-only mapping) and ``cuda_arena`` (``cuda-vmm`` and
``cuda-ipc``)."""
