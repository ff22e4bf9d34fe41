"""The launcher: one daemon process per local rank, supervised as a unit.

The daemon command (command.py) runs this when a pod holds several ranks; each child runs
``rank.run``. Spawning and supervising stay apart from what one rank does, so a rank process
never carries the launcher's signal handling, and the launcher never imports a rank's loading.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from weightcache_contract import termination
from weightcache_contract.errors import RankExited
from weightcache_contract.launch import DaemonArgs

from .. import status_note
from ..checkpoints.sharding import Layout

if TYPE_CHECKING:
    from ..artifacts.publisher import Publisher

log = logging.getLogger("weightcache.daemon")


def launch_local_ranks(
    ranks: list[int],
    flags: DaemonArgs,
    status_addr: tuple[str, int] | None = None,
    socket_dir: str = "",
    name: str = "",
    gpus_file: str | None = None,
    artifacts: Publisher | None = None,
) -> int:
    """Start one daemon process per local rank and supervise them as a unit.

    Ranks of one engine are useless apart, so if any child exits, the rest are stopped and the
    launcher exits with the first failure's code and message (``RankExited``: the CLI makes it
    the container's termination message); SIGTERM is forwarded to every child. With
    ``status_addr`` the launcher also serves the pod's status endpoint (status_endpoint.py),
    which reports what each rank noted it is doing (status_note.py) and why an exited one ended.
    ``flags``: every rank's flags but its place, which this sets. ``gpus_file`` (already in ``flags``): the endpoint also reports a rank whose GPU the GPU
    holder no longer books as not ready, as the readiness probe does. ``artifacts``: the node's
    compile-artifact publisher, run in a thread here and reported by the endpoint.
    """
    # Each rank's termination message and status note, in a directory only this launcher uses.
    rank_dir = Path(tempfile.mkdtemp(prefix="weightcache-ranks-"))

    def ended_file(rank: int) -> Path:
        return rank_dir / f"rank-{rank}.exit"

    def note_file(rank: int) -> Path:
        return rank_dir / f"rank-{rank}.note"

    # Exit codes as the wait loop below records them: polling the children from the HTTP
    # thread could reap one before os.wait() sees it and hang the loop.
    exited: dict[int, int] = {}

    def ended(rank: int) -> str | None:
        """Why the rank's process ended (its exit code and message); None while it runs."""
        if rank not in exited:
            return None
        message = termination.read(ended_file(rank))
        return f"process exited with code {exited[rank]}" + (f": {message}" if message else "")

    endpoint = None
    if status_addr is not None:
        from .status_endpoint import collect, status_endpoint

        endpoint = status_endpoint(
            status_addr,
            lambda memory=True: collect(
                socket_dir,
                name,
                ranks,
                ended,
                gpus_file=gpus_file,
                memory=memory,
                note=lambda rank: termination.read(note_file(rank)),
                artifacts=artifacts.report if artifacts is not None else None,
            ),
        )
    children: dict[int, subprocess.Popen[bytes]] = {}
    for local_index, rank in enumerate(ranks):
        layout = Layout.from_rank(rank, flags.tp_size, flags.pp_size)
        # The i-th local rank uses the i-th visible GPU (GPU backends; ignored on cpu-shm), or with
        # --gpus-file the i-th GPU of the holder's grant.
        own = flags.but(tp_rank=layout.tp_rank, pp_rank=layout.pp_rank, device=local_index, local_index=local_index)
        argv = [sys.executable, "-m", "weightcache", "daemon", *own.to_argv()]
        note_file(rank).write_text("starting")  # until the rank says more (status_note.py)
        env = {**os.environ, termination.ENV: str(ended_file(rank)), status_note.ENV: str(note_file(rank))}
        children[rank] = subprocess.Popen(argv, env=env)

    def forward(signum: int, _frame: object) -> None:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if endpoint is not None:
        endpoint.start()
    if artifacts is not None:
        artifacts.start()
    exit_code = 0
    failure = ""
    try:
        while children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                pid, status = 0, 0  # every child is reaped already: by Popen, below
            for child in children.values():
                if child.pid == pid:
                    child.returncode = os.waitstatus_to_exitcode(status)
            # ``forward`` signals through Popen, which reaps a child that has just exited (so no
            # signal reaches a recycled pid): that child's code is on its Popen, never from os.wait.
            finished = sorted(r for r, c in children.items() if c.returncode is not None or c.poll() is not None)
            for rank in finished:
                child = children.pop(rank)
                code = exited[rank] = int(child.returncode)
                if code != 0 and exit_code == 0:
                    exit_code = code if code > 0 else 128 - code
                    failure = (
                        termination.read(ended_file(rank))
                        or f"rank {rank} exited with code {child.returncode}; see the container's log"
                    )
                    log.error(
                        "rank exited; stopping the others", extra={"fields": {"rank": rank, "code": child.returncode}}
                    )
                    forward(signal.SIGTERM, None)
    finally:
        if artifacts is not None:
            artifacts.stop()
        if endpoint is not None:
            endpoint.stop()
        shutil.rmtree(rank_dir, ignore_errors=True)
    if exit_code:
        # The rank's own words, not prefixed by its number: every node refusing a spec for one
        # reason then says the same thing, whichever ranks it holds (the log names the rank).
        raise RankExited(failure, exit_code)
    return 0
