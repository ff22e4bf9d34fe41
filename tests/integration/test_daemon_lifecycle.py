"""Daemon lifecycle: ready file, clean shutdown, SIGKILL with a live engine, stale files, live refusal."""

import grp
import json
import os
import signal
import subprocess
import sys
import time

from weightcache.daemon.probe import probe

ENGINE = r"""
import json, sys
from weightcache.client.weights import load_weights
from weightcache.tools.reference_hf import bound_hf_model, greedy
from weightcache.checkpoints.sharding import Layout

model_dir, socket_dir, name = sys.argv[1:]
w = load_weights(model_dir, Layout(), socket_dir=socket_dir, name=name, fallback="error", dtype="bfloat16")
model = bound_hf_model(model_dir, w)
for line in sys.stdin:  # one greedy completion per line received
    print(json.dumps(greedy(model, [5, 6, 7, 8], 10)), flush=True)
"""


def test_ready_file_describes_the_daemon_and_goes_away_on_sigterm(llama, start_daemon) -> None:
    daemon = start_daemon(llama, dtype="bfloat16", revision="abc")
    files = daemon.files[0]
    info = json.loads(files.ready.read_text())
    assert info["pid"] == daemon.proc.pid and info["backend"] == "cpu-shm"
    assert info["fingerprint"]["revision"] == "abc" and len(info["fingerprint_digest"]) == 64
    assert info["arena_bytes"] > 0 and info["load_seconds"] > 0 and info["tensor_count"] > 0
    assert probe(daemon.socket_dir, daemon.name, [0]) == []
    assert daemon.stop(signal.SIGTERM) == 0
    assert not files.ready.exists() and not files.socket.exists()
    assert "no ready file" in probe(daemon.socket_dir, daemon.name, [0])[0]


def test_engine_survives_daemon_sigkill_and_a_new_daemon_starts_over_stale_files(llama, start_daemon) -> None:
    daemon = start_daemon(llama, dtype="bfloat16")
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(llama), daemon.socket_dir, daemon.name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        engine.stdin.write("go\n")
        engine.stdin.flush()
        before = engine.stdout.readline()
        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
        files = daemon.files[0]
        assert files.ready.exists()  # a killed daemon leaves its files behind...
        assert "no live daemon holds" in probe(daemon.socket_dir, daemon.name, [0])[0]
        engine.stdin.write("again\n")
        engine.stdin.flush()
        after = engine.stdout.readline()
        assert before and json.loads(after) == json.loads(before)
    finally:
        engine.kill()
        engine.wait()
    # ...which a new daemon cleans up before serving.
    stale_mtime = files.ready.stat().st_mtime_ns
    fresh = start_daemon(llama, dtype="bfloat16")
    assert files.read_ready().pid == fresh.proc.pid and files.ready.stat().st_mtime_ns != stale_mtime
    assert probe(fresh.socket_dir, fresh.name, [0]) == []


def test_a_second_daemon_refuses_to_start_over_a_live_one(llama, start_daemon) -> None:
    first = start_daemon(llama, dtype="bfloat16")
    second = start_daemon(llama, dtype="bfloat16", wait=False)
    assert second.proc.wait(timeout=60) == 2
    assert f"a live daemon (pid {first.proc.pid}) already serves cache 'test' rank 0" in second.output()
    assert first.files[0].read_ready().pid == first.proc.pid  # untouched
    assert probe(first.socket_dir, first.name, [0]) == []


def test_launcher_stops_all_ranks_when_one_dies(checkpoint_factory, start_daemon) -> None:
    ckpt = checkpoint_factory(family="qwen2")
    daemon = start_daemon(ckpt, tp_size=2, dtype="bfloat16", ranks=[0, 1])
    victim = daemon.files[1].read_ready().pid
    os.kill(victim, signal.SIGKILL)
    assert daemon.proc.wait(timeout=60) != 0
    deadline = time.monotonic() + 10
    while daemon.files[0].ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not daemon.files[0].ready.exists()  # rank 0 was stopped cleanly, not orphaned


def test_socket_group_opens_the_socket_to_that_group(llama, start_daemon) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    daemon = start_daemon(llama, dtype="bfloat16", socket_group=group)
    sock = daemon.files[0].socket
    assert oct(os.stat(sock).st_mode & 0o777) == oct(0o660) and os.stat(sock).st_gid == os.getgid()
    assert oct(os.stat(sock.parent).st_mode & 0o777) == oct(0o750)


def test_sigterm_during_load_exits_cleanly_without_a_ready_file(checkpoint_factory, start_daemon) -> None:
    ckpt = checkpoint_factory(
        family="llama",
        hidden_size=1024,
        intermediate_size=2816,
        num_layers=8,
        num_heads=16,
        num_kv_heads=8,
        vocab_size=4096,
        tokenizer=False,
    )
    daemon = start_daemon(ckpt, dtype="float32", quantization="fp8", wait=False)
    deadline = time.monotonic() + 60
    while "msg=loading" not in daemon.output():
        assert time.monotonic() < deadline and daemon.proc.poll() is None, daemon.output()
        time.sleep(0.01)
    assert daemon.stop(signal.SIGTERM) == 0, daemon.output()
    assert "stopped during load" in daemon.output()
    assert not daemon.files[0].ready.exists() and not daemon.files[0].socket.exists()
