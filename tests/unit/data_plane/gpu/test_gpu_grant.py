"""The GPU holder's grant: which GPUs it books, the file and lock daemons read, and the checks on them."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from weightcache.gpu.gpu_grant import (
    Grant,
    current_grant,
    grant_problem,
    live_token,
    lock_path,
    read_grant,
    take_lock,
    wait_for_grant,
    write_grant,
)
from weightcache.gpu.gpu_holder import granted_gpus
from weightcache_contract.errors import WeightCacheError

A, B, C = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000", "GPU-cc"


def test_granted_gpus_follow_nvml_order_and_refuse_what_was_not_given() -> None:
    # The device plugin's UUID list: NVML must see exactly those; NVML's order wins.
    assert granted_gpus(f"{B},{A}", [A, B], expect=2) == [A, B]
    # No UUIDs in the variable (index strategy, unset, "all"): what the container sees is the grant.
    assert granted_gpus("0,1", [A, B], expect=2) == [A, B]
    assert granted_gpus(None, [A], expect=None) == [A]
    with pytest.raises(WeightCacheError, match="sees GPU-cc besides the GPUs it was given"):
        granted_gpus(f"{A},{B}", [A, B, C], expect=2)
    with pytest.raises(WeightCacheError, match="names GPU-cc, which NVML does not see"):
        granted_gpus(f"{A},{C}", [A, B], expect=2)
    with pytest.raises(WeightCacheError, match="sees 3 GPUs .* but its pod requested 2"):
        granted_gpus("all", [A, B, C], expect=2)
    with pytest.raises(WeightCacheError, match="MIG"):
        granted_gpus("MIG-1234", [A], expect=1)
    with pytest.raises(WeightCacheError, match="sees no GPU"):
        granted_gpus("void", [], expect=None)


def test_grant_file_round_trip_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    assert read_grant(path) is None
    grant = Grant(uuids=(A, B), token="t1", pod="tiny-gpus-x", pod_uid="u", node="node-1", pid=7, written_at=1.0)
    write_grant(path, grant)
    assert read_grant(path) == grant
    assert oct(path.stat().st_mode & 0o777) == "0o644", "daemons of another uid read it"
    assert [p.name for p in tmp_path.iterdir()] == ["gpus.json"], "no temporary file left behind"
    for bad in (
        "{",
        '{"version": 2, "uuids": [], "token": "t"}',
        '{"version": 1, "uuids": ["0"], "token": "t"}',
        '{"version": 1, "uuids": []}',
    ):
        path.write_text(bad)
        assert read_grant(path) is None, bad


def test_only_the_running_holders_grant_counts(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    write_grant(path, Grant(uuids=(A,), token="old", pod="tiny-gpus-old"))
    grant, why = current_grant(path)
    assert grant is None and "no GPU holder runs" in why and str(lock_path(path)) in why
    assert "not booked" in grant_problem(path, A)
    fd = take_lock(path, "new")  # another open file description: conflicts like another process would
    try:
        assert live_token(path) == "new"
        grant, why = current_grant(path)
        assert grant is None and "previous GPU holder's (pod tiny-gpus-old)" in why
        write_grant(path, Grant(uuids=(A, B), token="new", pod="tiny-gpus-new"))
        grant, why = current_grant(path)
        assert why is None and grant is not None and grant.uuids == (A, B)
        assert grant_problem(path, B) is None
        problem = grant_problem(path, C)
        assert problem is not None and "no longer granted" in problem and "tiny-gpus-new" in problem
        assert "delete this daemon pod" in problem
    finally:
        os.close(fd)
    assert live_token(path) is None, "the kernel drops the lock with its holder"


def test_a_daemon_waits_for_the_grant_and_takes_its_local_ranks_gpu(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(wait_for_grant(path, 1, poll_s=0.01)))
    waiter.start()
    time.sleep(0.1)
    assert not got, "no grant yet: it must wait, not guess"
    fd = take_lock(path, "t")
    try:
        write_grant(path, Grant(uuids=(A, B), token="t"))
        waiter.join(timeout=5)
        assert got == [B]
        with pytest.raises(WeightCacheError, match="grants 2 GPUs .* local rank 2"):
            wait_for_grant(path, 2, poll_s=0.01)
    finally:
        os.close(fd)
