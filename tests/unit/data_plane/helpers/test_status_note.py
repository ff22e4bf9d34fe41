"""What a rank tells its launcher before it has a socket: how far its load got."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from weightcache import status_note
from weightcache.checkpoints.progress import Progress
from weightcache_contract.termination import read


def test_a_loading_rank_notes_how_far_it_got(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    noted = tmp_path / "rank-0.note"
    monkeypatch.setenv(status_note.ENV, str(noted))
    progress = Progress(3 * 2**30, "tiny/rank-0", stream=io.StringIO(), log_every_s=0)
    assert read(noted) == "loading the weights: 3.00 GiB to read"
    progress.advance(2**30)
    assert (read(noted) or "").startswith("loading the weights: 1.00 GiB of 3.00 GiB read, ETA ")
    assert not list(tmp_path.glob(".*.partial")), "replaced atomically, nothing left over"
