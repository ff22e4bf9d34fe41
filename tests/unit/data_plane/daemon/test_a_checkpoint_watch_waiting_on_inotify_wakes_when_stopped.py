"""The checkpoint watch sleeps on inotify between looks; a daemon told to stop wakes it through its
pipe, or the daemon's exit would wait out the 2 s the stop gives the watch."""

from __future__ import annotations

import os
import time
from pathlib import Path

from weightcache.daemon.watch import _Inotify

POLL_S = 30.0  # a wait that ran its course would take this long


def test_a_wait_woken_through_the_pipe_returns_before_its_timeout_and_reports_no_change(tmp_path: Path) -> None:
    notify = _Inotify.open(tmp_path)
    assert notify is not None
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        os.write(wake_w, b"x")
        started = time.monotonic()
        assert notify.wait(POLL_S, wake_r) is False
        assert time.monotonic() - started < POLL_S / 2
    finally:
        notify.close()
        os.close(wake_r)
        os.close(wake_w)


def test_a_write_in_the_checkpoint_still_wakes_the_wait_as_a_change(tmp_path: Path) -> None:
    notify = _Inotify.open(tmp_path)
    assert notify is not None
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        (tmp_path / "model.safetensors").write_bytes(b"new")
        assert notify.wait(POLL_S, wake_r) is True
    finally:
        notify.close()
        os.close(wake_r)
        os.close(wake_w)
