"""Helper process for test_artifact_store.py: one publisher (``publish ROOT STAGING START``) or one
engine checking an entry out slowly (``hold ROOT DIGEST SECONDS``), as a separate process."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from weightcache.artifacts.store import Store, _dir_lock


def main() -> int:
    what, root = sys.argv[1], Store(sys.argv[2])
    if what == "publish":
        staging, start = Path(sys.argv[3]), float(sys.argv[4])
        claim = root.read_claim(staging)
        assert claim is not None
        while time.time() < start:  # every racer leaves at once
            time.sleep(0.001)
        print("won" if root.publish(staging, claim, max_bytes=1 << 30) else "lost", flush=True)
        return 0
    if what == "hold":
        # What checkout holds while it copies: a shared lock on the entry directory.
        with _dir_lock(root.entries / sys.argv[3], exclusive=False, wait=True) as held:
            assert held
            print("holding", flush=True)
            time.sleep(float(sys.argv[4]))
        return 0
    raise SystemExit(f"unknown {what}")


if __name__ == "__main__":
    raise SystemExit(main())
