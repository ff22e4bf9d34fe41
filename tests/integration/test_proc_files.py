"""The tests' /proc readers (proc_files.py) on real processes that exit under them: a reaped child,
a zombie, children exiting while they are read, and fds closing while they are listed. Each reader
says "gone" (None, [], False) instead of raising, whichever moment of the exit it meets."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from proc_files import alive, argv, children, fd_targets, read_proc

# Enough rounds that a reader raising on a vanished entry meets one (a naive one does within
# about a thousand listings and a hundred children, here on 2 cores).
LISTINGS = 3000
CHILDREN = 100


def test_a_reaped_child_reads_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert child.wait(timeout=30) == 0
    assert read_proc(child.pid, "cmdline") is None and argv(child.pid) is None
    assert children(child.pid) == [] and fd_targets(child.pid) == [] and not alive(child.pid)


def test_a_zombie_reads_as_gone() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 30
        while alive(pid):  # exited, not yet reaped: a zombie, whose directory is still there
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert read_proc(pid, "stat") is not None  # not reaped: the zombie is still listed
        assert argv(pid) is None and fd_targets(pid) == []
    finally:
        os.waitpid(pid, 0)


def test_children_read_while_they_exit_read_as_running_or_gone() -> None:
    """What the status endpoint's test does to the launcher's ranks (stop_children_as_they_start),
    against children that exit at once, read at every moment of their exit."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys\nfor _ in range({CHILDREN}):\n    subprocess.run(['/bin/true'])\n",
        ]
    )
    seen = 0
    try:
        while parent.poll() is None:
            for pid in children(parent.pid):
                seen += 1
                command = argv(pid)
                assert command is None or command[0] in (b"/bin/true", sys.executable.encode()), command
                fd_targets(pid)
                alive(pid)
    finally:
        parent.wait(timeout=60)
    assert seen, "no child was ever read"
    assert children(parent.pid) == []


def test_fds_closed_while_they_are_listed_are_left_out() -> None:
    """A process opening and closing files as fast as it can: its fd table changes between the
    listing and each link's read (test_handoff's check of what a daemon holds open)."""
    churn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys\n"
            "sys.stdout.write('go\\n'); sys.stdout.flush()\n"
            "while True:\n"
            "    fds = [os.open('/dev/null', os.O_RDONLY) for _ in range(64)]\n"
            "    for fd in fds: os.close(fd)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert churn.stdout is not None and churn.stdout.readline() == b"go\n"
        for _ in range(LISTINGS):
            targets = fd_targets(churn.pid)
            assert targets and all(isinstance(t, str) for t in targets)  # it runs: stdio at least
    finally:
        churn.kill()
        churn.wait()
    assert fd_targets(churn.pid) == []
