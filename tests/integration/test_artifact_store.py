"""The compile-artifact directory on real files and real processes: racing publishers, a staging
directory that never finished, a key that does not match, symlinks, eviction, and the engine
wrapper with its daemon-side publisher."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from weightcache.artifacts.key import ArtifactKey, Claim
from weightcache.artifacts.publisher import Publisher
from weightcache.artifacts.store import ArtifactError, Store

HERE = Path(__file__).parent
KEY = ArtifactKey(
    engine="vllm",
    engine_version="0.32.0",
    torch_version="2.11.0",
    device="cpu:avx2",
    weights="a" * 64,
    compile_config="b" * 10,
)


def staged(store: Store, key: ArtifactKey, files: dict[str, bytes], ready: bool = True) -> tuple[Path, int]:
    """A staging directory as an engine leaves it: its data, its claim (a miss), READY."""
    staging, alive = store.stage()
    for rel, data in files.items():
        (staging / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / "data" / rel).write_bytes(data)
    store.claim(staging, key)
    if ready:
        Store.mark_ready(staging)
    return staging, alive


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "artifacts")
    s.create()
    return s


def test_racing_publishers_of_one_key_leave_exactly_one_complete_entry(store: Store) -> None:
    stagings = [staged(store, KEY, {"torch_compile_cache/x/graph.py": f"racer {i}".encode() * 1000}) for i in range(6)]
    start = time.time() + 1.0
    racers = [
        subprocess.Popen(
            [sys.executable, str(HERE / "artifact_race.py"), "publish", str(store.root), str(s), str(start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for s, _fd in stagings
    ]
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in racers)
    assert outcomes == ["lost"] * 5 + ["won"]
    assert [e.digest for e in store.list_entries()] == [KEY.digest]
    # The winner's bytes, whole: one racer's file, never a mix.
    text = (store.entries / KEY.digest / "data/torch_compile_cache/x/graph.py").read_text()
    assert text in {f"racer {i}" * 1000 for i in range(6)}
    assert os.listdir(store.incoming) == []


def test_a_publisher_killed_mid_copy_leaves_no_visible_entry(store: Store) -> None:
    staging, _alive = staged(store, KEY, {f"f{i}": os.urandom(1 << 20) for i in range(300)})
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "artifact_race.py"), "publish", str(store.root), str(staging), "0"]
    )
    deadline = time.monotonic() + 30
    while not os.listdir(store.incoming) and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.listdir(store.incoming), "the kill came after the copy; make the staging data larger"
    assert store.list_entries() == [] and store.lookup(KEY) is None
    assert store.checkout(KEY, store.root / "out") is None


def test_a_staging_directory_without_ready_is_not_published(store: Store) -> None:
    publisher = Publisher(str(store.root), 1 << 30)
    staged(store, KEY, {"a": b"half written"}, ready=False)
    publisher.pass_once()
    assert store.list_entries() == []
    assert publisher.report().misses == 1 and publisher.report().published == 0


def test_an_entry_is_never_reused_under_another_key(store: Store) -> None:
    staging, _ = staged(store, KEY, {"a": b"compiled for KEY"})
    claim = store.read_claim(staging)
    assert claim is not None and store.publish(staging, claim, 1 << 30)
    other = KEY.model_copy(update={"compile_config": "other"})
    assert store.lookup(KEY) == KEY.digest and store.lookup(other) is None
    # An entry moved by hand under the other key's name keeps its own key inside: not reused.
    os.rename(store.entries / KEY.digest, store.entries / other.digest)
    assert store.lookup(other) is None and store.checkout(other, store.root / "out") is None


def test_a_hit_copies_the_entry_into_the_engines_own_staging(store: Store) -> None:
    first, _ = staged(store, KEY, {"cache/graph.py": b"graph"})
    claim = store.read_claim(first)
    assert claim is not None and store.publish(first, claim, 1 << 30)
    second, _ = store.stage()
    assert store.claim(second, KEY) == Claim(key=KEY, hit=KEY.digest)
    assert (second / "data/cache/graph.py").read_bytes() == b"graph"
    # Every worker of the engine claims; only the first copies, all agree.
    assert store.claim(second, KEY).hit == KEY.digest
    with pytest.raises(ArtifactError, match="different artifact keys"):
        store.claim(second, KEY.model_copy(update={"device": "cpu:amx"}))


def test_a_symlink_in_staging_is_refused_and_never_followed(store: Store, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("another engine's file")
    staging, _ = staged(store, KEY, {"a": b"ok"})
    os.symlink(secret, staging / "data" / "link")
    claim = store.read_claim(staging)
    assert claim is not None
    with pytest.raises(ArtifactError, match="not a regular file or directory"):
        store.publish(staging, claim, 1 << 30)
    assert store.list_entries() == [] and os.listdir(store.incoming) == []


def test_staging_over_the_size_bound_is_refused(store: Store) -> None:
    staging, _ = staged(store, KEY, {"big": b"x" * 1000})
    claim = store.read_claim(staging)
    assert claim is not None
    with pytest.raises(ArtifactError, match="more than the bound of 999 bytes"):
        store.publish(staging, claim, 999)


def test_eviction_removes_least_recently_used_and_skips_an_entry_being_copied(store: Store) -> None:
    keys = [KEY.model_copy(update={"compile_config": f"c{i}"}) for i in range(3)]
    for i, key in enumerate(keys):
        staging, _ = staged(store, key, {"blob": b"x" * 1000})
        claim = store.read_claim(staging)
        assert claim is not None and store.publish(staging, claim, 1 << 30)
        os.utime(store.entries / key.digest, (100.0 + i, 100.0 + i))
    store.record_hit(keys[0].digest)  # the oldest is used again: now the newest
    holder = subprocess.Popen(
        [sys.executable, str(HERE / "artifact_race.py"), "hold", str(store.root), keys[1].digest, "30"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        # Room for one: keys[1] is the least recently used but in use, so keys[2] goes instead.
        assert store.evict(max_bytes=2500) == [keys[2].digest]
        # Still held: the more recently used keys[0] goes before it.
        assert store.evict(max_bytes=1000) == [keys[0].digest]
    finally:
        holder.kill()
        holder.wait()
    assert [e.digest for e in store.list_entries()] == [keys[1].digest]
    assert store.evict(max_bytes=0) == [keys[1].digest]


def test_the_wrapper_marks_ready_once_the_engine_serves_and_the_daemon_publishes(store: Store) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A real engine stand-in: it writes into its VLLM_CACHE_ROOT, claims, then serves HTTP.
    engine = (
        "import os, sys, http.server, pathlib;"
        "from weightcache.artifacts.store import Store;"
        "from weightcache.artifacts.key import ArtifactKey;"
        "root = pathlib.Path(os.environ['VLLM_CACHE_ROOT']);"
        "(root / 'graph.py').write_text('compiled');"
        f"Store(os.environ['WEIGHTCACHE_ARTIFACT_DIR']).claim(pathlib.Path(os.environ['WEIGHTCACHE_ARTIFACT_STAGING']), ArtifactKey.model_validate_json(sys.argv[1]));"
        f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "weightcache", "artifacts-run", "--dir", str(store.root)]
        + [
            "--health",
            f"http://127.0.0.1:{port}/",
            "--profile",
            "vllm",
            "--",
            sys.executable,
            "-c",
            engine,
            KEY.model_dump_json(),
        ],
        cwd=store.root,
    )
    publisher = Publisher(str(store.root), 1 << 30)
    try:
        deadline = time.monotonic() + 60
        while store.lookup(KEY) is None:
            assert time.monotonic() < deadline, "never published"
            assert wrapper.poll() is None
            publisher.pass_once()
            time.sleep(0.2)
        assert (store.entries / KEY.digest / "data/graph.py").read_text() == "compiled"
        report = publisher.report()
        assert (report.misses, report.published, report.entries) == (1, 1, 1)
    finally:
        wrapper.send_signal(signal.SIGTERM)  # forwarded to the engine
        code = wrapper.wait(timeout=30)
    assert code == 128 + signal.SIGTERM
    publisher.pass_once()  # the engine is gone: its staging directory goes
    assert store.staged() == []
    # The next engine of the key starts from the entry and is counted as a hit.
    staging, _ = store.stage()
    assert store.claim(staging, KEY).hit == KEY.digest
    publisher.pass_once()
    assert json.loads(publisher.report().model_dump_json())["hits"] == 1
