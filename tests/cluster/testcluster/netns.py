"""Entering a network namespace from one thread, for as long as a block runs.

A network namespace belongs to a thread, not to the whole process: ``setns`` moves only the
calling thread, a socket stays in the namespace it was made in, and a process started from
the thread is born there. So the one process kubelet can act as many hosts: each node's
sockets and containers are made with ``entered(<the node's namespace>)`` around them.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@contextmanager
def entered(namespace: str | None) -> Iterator[None]:
    """Runs the block with this thread in ``namespace`` (a name under /run/netns), then puts it
    back; None runs it where the thread is."""
    if namespace is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        try:
            if _libc.setns(target, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into network namespace {namespace}")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if _libc.setns(home, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the thread's own network namespace")
    finally:
        os.close(home)
