"""Waiting for a test's daemon to exit, and when it does not, what its processes were doing."""

from __future__ import annotations

import subprocess
from pathlib import Path


def wait_or_explain(proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> int:
    """``proc.wait``; past ``timeout_s`` an AssertionError with each process and thread of its
    process group (state, kernel wait channel, signal masks) and the end of its log, so a stop
    that hangs names where it hangs."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
        raise AssertionError(
            f"pid {proc.pid} did not exit within {timeout_s:.0f} s of its stop signal; its process group:\n"
            f"{group_report(proc.pid)}\nthe end of its log:\n{tail}"
        ) from None


def group_report(pgid: int) -> str:
    """One line per process of group ``pgid`` and per thread: name, state, wait channel; a
    process's line also has its blocked, pending and caught signal masks."""
    lines = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            proc = stat.parent
            status = dict(line.split(":\t", 1) for line in (proc / "status").read_text().splitlines() if ":\t" in line)
            masks = " ".join(f"{k}={status.get(k, '?').strip()}" for k in ("SigBlk", "SigPnd", "ShdPnd", "SigCgt"))
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
            lines.append(f"pid {proc.name} {status.get('State', '?').strip()} {masks} {cmd}")
            for task in sorted((proc / "task").iterdir(), key=lambda t: int(t.name)):
                name = (task / "comm").read_text().strip()
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                lines.append(f"  thread {task.name} {name} {state} wchan={(task / 'wchan').read_text().strip()}")
        except (OSError, ValueError, IndexError):
            continue  # the process ended while being read
    return "\n".join(lines) or "(no process left in the group)"
