"""The daemon's ``GET /status?wait=S&after=ETAG`` long poll, on the real endpoint over a real
socket (the launcher's ``collect`` replaced by a report the test changes): it answers within a
second of the report changing, at ``wait`` when nothing changes, refuses bad parameters naming
them, and a peer that opens more long polls than the cap gets 503 at once while the endpoint
keeps answering everyone else."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from weightcache.daemon.status_endpoint import MAX_WAIT_S, MAX_WAITERS, status_endpoint
from weightcache_contract.daemon_report import CheckpointWatch, DaemonReport, RankReport, report_digest


class Daemon:
    """What the endpoint reports: a Ready rank whose checkpoint watch the test can change."""

    def __init__(self) -> None:
        self.state = "unchanged"
        self.uptime = 1.0
        self.asked = 0

    def report(self, memory: bool = True) -> DaemonReport:
        self.asked += 1
        self.uptime += 0.5  # a counter that moves on every look must not wake anyone
        watch = CheckpointWatch(
            state=self.state, changed_files=["model.safetensors"] if self.state == "changed" else []
        )  # type: ignore[arg-type]
        rank = RankReport(rank=0, ready=True, fingerprint="f0", uptime_seconds=self.uptime, checkpoint=watch)
        return DaemonReport(cache="test", ready=True, ranks=[rank])


@pytest.fixture
def daemon() -> Daemon:
    return Daemon()


@pytest.fixture
def address(daemon: Daemon) -> Iterator[tuple[str, int]]:
    server = status_endpoint(("127.0.0.1", 0), daemon.report)
    server.start()
    try:
        yield server.address
    finally:
        server.stop()


def get(address: tuple[str, int], target: str, timeout: float = 70) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


def etag(headers: dict[str, str]) -> str:
    return headers["ETag"].strip('"')


def test_status_carries_the_digest_of_what_the_report_says_as_its_etag(
    address: tuple[str, int], daemon: Daemon
) -> None:
    code, headers, body = get(address, "/status")
    assert code == 200, body
    assert etag(headers) == report_digest(DaemonReport.model_validate_json(body))
    assert etag(get(address, "/status")[1]) == etag(headers), "counters alone do not change the ETag"


def test_a_long_poll_answers_at_once_when_the_report_differs_from_after(address: tuple[str, int]) -> None:
    started = time.monotonic()
    code, headers, _ = get(address, "/status?wait=30&after=0123abcd")
    assert code == 200 and etag(headers) != "0123abcd"
    assert time.monotonic() - started < 1.0


def test_a_long_poll_answers_within_a_second_of_the_report_changing(address: tuple[str, int], daemon: Daemon) -> None:
    before = etag(get(address, "/status")[1])
    changed_at: list[float] = []

    def change() -> None:
        time.sleep(1.5)
        daemon.state = "changed"
        changed_at.append(time.monotonic())

    threading.Thread(target=change).start()
    code, headers, body = get(address, f"/status?wait=20&after={before}")
    delay = time.monotonic() - changed_at[0]
    assert code == 200 and etag(headers) != before
    assert DaemonReport.model_validate_json(body).ranks[0].checkpoint.state == "changed"  # type: ignore[union-attr]
    print(f"long poll answered {delay:.3f} s after the report changed")
    assert delay < 1.0


def test_a_long_poll_answers_at_wait_when_nothing_changes(address: tuple[str, int], daemon: Daemon) -> None:
    before = etag(get(address, "/status")[1])
    started = time.monotonic()
    code, headers, _ = get(address, f"/status?wait=1.5&after={before}")
    took = time.monotonic() - started
    assert code == 200 and etag(headers) == before
    assert 1.5 <= took < 2.5, took


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("wait=soon", "wait='soon' is not a number of seconds"),
        ("wait=-1", "is not between 0 and"),
        ("wait=nan", "is not between 0 and"),
        (f"wait={MAX_WAIT_S * 10:g}", f"is not between 0 and {MAX_WAIT_S:g} seconds"),
        ("after=not-a-digest", "is not an ETag of this endpoint"),
        ("wait=1&wait=2", "'wait' is given twice"),
        ("since=3", "unknown query parameter(s) 'since'"),
        ("wait", "is not name=value pairs"),
    ],
)
def test_bad_long_poll_parameters_are_refused_naming_the_problem(
    address: tuple[str, int], query: str, named: str
) -> None:
    started = time.monotonic()
    code, _, body = get(address, f"/status?{query}")
    assert code == 400, body
    assert named in json.loads(body)["error"], body
    assert time.monotonic() - started < 1.0


def test_long_polls_beyond_the_cap_are_refused_at_once_and_the_endpoint_keeps_answering(
    address: tuple[str, int], daemon: Daemon
) -> None:
    before = etag(get(address, "/status")[1])
    extra = 4
    with ThreadPoolExecutor(max_workers=MAX_WAITERS + extra) as pool:
        held = [pool.submit(get, address, f"/status?wait=4&after={before}") for _ in range(MAX_WAITERS)]
        time.sleep(0.5)  # every one of them is waiting now
        started = time.monotonic()
        refused = [pool.submit(get, address, f"/status?wait=4&after={before}") for _ in range(extra)]
        for answer in refused:
            code, headers, body = answer.result(timeout=5)
            assert code == 503 and headers["Retry-After"] == "1", body
            assert f"{MAX_WAITERS} long polls wait already" in json.loads(body)["error"]
        assert time.monotonic() - started < 1.0, "refusals are immediate"
        # Everyone else is still answered at once while the cap is reached.
        started = time.monotonic()
        assert get(address, "/status")[0] == 200
        assert get(address, "/ready")[0] == 200
        assert get(address, "/metrics")[0] == 200
        assert time.monotonic() - started < 1.0
        assert all(f.result(timeout=10)[0] == 200 for f in held)
    # Once the held polls ended, a long poll is taken again.
    assert get(address, f"/status?wait=0.2&after={before}")[0] == 200


def test_nobody_waiting_means_nobody_asks_the_ranks(address: tuple[str, int], daemon: Daemon) -> None:
    before = etag(get(address, "/status")[1])
    get(address, f"/status?wait=0.6&after={before}")
    time.sleep(0.5)  # the poller notices that nobody waits
    asked = daemon.asked
    time.sleep(1.0)
    assert daemon.asked == asked


def test_a_real_daemons_long_poll_answers_a_checkpoint_resync_within_a_second_of_its_verdicts(
    llama: Path, tmp_path: Path, start_daemon
) -> None:
    """A real launcher and rank, the checkpoint watch at its default poll: the long poll returns
    ``verifying`` within a second of the re-sync (inotify), then ``changed`` at the watch's second look."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama, ckpt)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    running = start_daemon(ckpt, keeper="off", status_addr=f"127.0.0.1:{port}", ranks=[0])
    address = ("127.0.0.1", port)
    deadline = time.monotonic() + 120
    while True:
        assert running.proc.poll() is None and time.monotonic() < deadline, "the daemon never got ready"
        try:
            code, headers, body = get(address, "/status", timeout=5)
            if code == 200 and DaemonReport.model_validate_json(body).ready:
                break
        except OSError:
            pass
        time.sleep(0.2)

    shard = sorted(ckpt.glob("*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # new bytes, same size and header: the watch must re-read to tell
    staged = shard.with_name(".resync")
    staged.write_bytes(data)
    os.replace(staged, shard)
    written = time.monotonic()
    states: list[tuple[str, float]] = []
    after = etag(headers)
    while not states or states[-1][0] != "changed":
        assert time.monotonic() - written < 30, states
        code, headers, body = get(address, f"/status?wait=20&after={after}")
        assert code == 200, body
        after = etag(headers)
        watch = DaemonReport.model_validate_json(body).ranks[0].checkpoint
        assert watch is not None
        states.append((watch.state, round(time.monotonic() - written, 3)))
    print(f"long poll answers after the re-sync (state, seconds): {states}")
    assert states[0][0] == "verifying" and states[0][1] < 1.5, states
    assert states[-1][1] < 8, states
