"""The engine end to end: real daemons, real rank processes, real HTTP.

Client mode must serve exactly what off mode serves (same weights, same forward pass), and keep
serving when the daemon dies (the engine holds its own reference to the mapped memory).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_process import Engine, EngineFactory, engines, request, stream, stream_events
from proc_files import alive
from weightcache.engine.launcher import free_port
from weightcache_contract.launch import EngineArgs

PROMPTS = ["The weight cache", "Once upon a time", "def add(a, b):"]
CHAT = [{"role": "system", "content": "You count."}, {"role": "user", "content": "one, two,"}]


@pytest.fixture
def start_engine(tmp_path: Path) -> Iterator[EngineFactory]:
    yield from engines(tmp_path)


def ranks_of(engine: Engine) -> list[dict]:
    return engine.get("/health").body["ranks"]


def stream_text(events: list) -> tuple[str, list[int], str]:
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    text = "".join(
        c["choices"][0].get("text", "") or c["choices"][0].get("delta", {}).get("content", "") for c in chunks
    )
    ids = [i for c in chunks for i in c["choices"][0].get("token_ids", [])]
    return text, ids, chunks[-1]["choices"][0]["finish_reason"]


def kill_daemon_group(handle) -> None:
    """SIGKILL the daemon launcher and its rank processes; returns once no rank holds its lock."""
    os.killpg(handle.proc.pid, signal.SIGKILL)
    handle.proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(f.lock_is_held() for f in handle.files) and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.slow
def test_client_mode_serves_what_off_mode_serves_and_survives_the_daemon(llama, start_daemon, start_engine) -> None:
    daemon = start_daemon(llama, tp_size=2, ranks=[0, 1])
    cached = start_engine(
        llama,
        "--tp-size",
        "2",
        "--weight-cache-mode",
        "client",
        "--weight-cache-fallback",
        "error",
        "--socket-dir",
        daemon.socket_dir,
        "--name",
        daemon.name,
    )
    disk = start_engine(llama, "--tp-size", "2", "--weight-cache-mode", "off")

    assert [r["weights"]["mode"] for r in ranks_of(cached)] == ["cache", "cache"]
    assert all(r["weights"]["bytes_mapped"] > 0 and r["weights"]["bytes_loaded"] == 0 for r in ranks_of(cached))
    assert all(r["weights"]["weights_in_arena"] is True for r in ranks_of(cached))  # the serving model's own check
    assert [r["weights"]["mode"] for r in ranks_of(disk)] == ["disk", "disk"]
    assert all(r["weights"]["bytes_loaded"] > 0 for r in ranks_of(disk))
    metrics = cached.get("/metrics").body
    assert 'weightcache_engine_weight_mode{mode="cache",rank="1",requested="client"} 1' in metrics
    for phase in ("imports", "distributed_init", "weights_bound", "warmup", "ready"):
        assert f'weightcache_engine_startup_seconds{{phase="{phase}",rank="0"}}' in metrics
    assert 'weightcache_engine_startup_seconds{phase="weights_bound",rank="1"}' in metrics
    assert cached.get("/v1/models").body["data"][0]["id"] == llama.name

    expected = {}
    for prompt in PROMPTS:
        want = disk.complete(prompt, max_tokens=12)
        got = cached.complete(prompt, max_tokens=12)
        assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        assert got["usage"] == want["usage"] and got["usage"]["completion_tokens"] >= 1
        expected[prompt] = want["choices"][0]
        text, ids, finish = stream_text(
            stream(
                cached.port,
                "/v1/completions",
                {"prompt": prompt, "max_tokens": 12, "temperature": 0, "return_token_ids": True},
            )
        )
        assert (text, ids, finish) == (
            want["choices"][0]["text"],
            want["choices"][0]["token_ids"],
            want["choices"][0]["finish_reason"],
        )

    chat_want = disk.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 8, "temperature": 0}).body
    chat_got = cached.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 8, "temperature": 0}).body
    assert chat_got["object"] == "chat.completion" and chat_got["choices"] == chat_want["choices"]
    events = stream(cached.port, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 8, "temperature": 0})
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    text, _, finish = stream_text(events)
    assert (text, finish) == (chat_want["choices"][0]["message"]["content"], chat_want["choices"][0]["finish_reason"])

    # A hot standby maps the same arenas while the active engine serves.
    standby = start_engine(
        llama,
        "--tp-size",
        "2",
        "--weight-cache-mode",
        "client",
        "--weight-cache-fallback",
        "error",
        "--socket-dir",
        daemon.socket_dir,
        "--name",
        daemon.name,
    )
    assert [r["weights"]["mode"] for r in ranks_of(standby)] == ["cache", "cache"]

    # Mid-serving, literally: the daemon dies while a long streaming request is generating.
    long_body = {
        "prompt": PROMPTS[0],
        "max_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    long_want = disk.complete(**long_body)["choices"][0]["token_ids"]
    streamed: dict = {}
    first = threading.Event()

    def long_stream() -> None:
        events = []
        for event in stream_events(cached.port, "/v1/completions", long_body):
            events.append(event)
            first.set()
        streamed["events"] = events

    reader = threading.Thread(target=long_stream)
    reader.start()
    assert first.wait(30)
    kill_daemon_group(daemon)  # the mapped memory stays valid for the engines
    assert not any(f.lock_is_held() for f in daemon.files)
    assert reader.is_alive(), "the stream ended before the daemon died: nothing was tested mid-stream"
    reader.join(timeout=120)
    assert stream_text(streamed["events"])[1] == long_want
    for prompt in PROMPTS:
        got = cached.complete(prompt, max_tokens=12)["choices"][0]
        assert (got["token_ids"], got["text"]) == (expected[prompt]["token_ids"], expected[prompt]["text"])
    assert cached.get("/ready").status == 200

    os.killpg(cached.proc.pid, signal.SIGKILL)  # the active engine dies too: the standby carries on
    for prompt in PROMPTS:
        got = standby.complete(prompt, max_tokens=12)["choices"][0]
        assert (got["token_ids"], got["text"]) == (expected[prompt]["token_ids"], expected[prompt]["text"])


@pytest.fixture(scope="module")
def tp1_engine(checkpoint_factory, tmp_path_factory) -> Iterator[Engine]:
    factory = EngineFactory(tmp_path_factory.mktemp("engine-tp1"))
    try:
        yield factory(checkpoint_factory(family="llama"), "--max-model-len", "128")
    finally:
        factory.close()


def test_concurrent_requests_get_what_they_would_get_alone(tp1_engine: Engine) -> None:
    prompts = [f"{p} {i}" for i in range(2) for p in PROMPTS]
    alone = {p: tp1_engine.complete(p, max_tokens=20, ignore_eos=True)["choices"][0]["token_ids"] for p in prompts}
    together: dict[str, list[int]] = {}

    def one(prompt: str) -> None:
        together[prompt] = tp1_engine.complete(prompt, max_tokens=20, ignore_eos=True)["choices"][0]["token_ids"]

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == alone
    # Seeded sampling is reproducible and differs from greedy: the sampler is really used.
    sampled = [
        tp1_engine.complete(PROMPTS[0], max_tokens=20, temperature=1.0, seed=7, ignore_eos=True)["choices"][0][
            "token_ids"
        ]
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1] != alone[PROMPTS[0] + " 0"]


def test_stop_strings_end_the_completion_at_the_token_that_completes_them(
    tp1_engine: Engine, checkpoint_factory
) -> None:
    from weightcache.engine.tokenizer import Tokenizer

    tok = Tokenizer(checkpoint_factory(family="llama"))  # the engine's checkpoint (session-cached)
    full = tp1_engine.complete(PROMPTS[1], max_tokens=24, ignore_eos=True)["choices"][0]
    text = full["text"]
    # A random model emits invalid UTF-8 now and then; take an ASCII pair from the second half.
    pairs = [
        text[i : i + 2]
        for i in range(len(text) // 2, len(text) - 1)
        if text[i : i + 2].isascii() and text[i : i + 2].strip() == text[i : i + 2]
    ]
    assert pairs, full
    stop = pairs[0]
    cut = tp1_engine.complete(PROMPTS[1], max_tokens=24, ignore_eos=True, stop=[stop])["choices"][0]
    n = len(cut["token_ids"])
    assert cut["finish_reason"] == "stop" and n < 24 and full["token_ids"][:n] == cut["token_ids"]
    assert stop not in cut["text"]
    assert stop in tok.decode(cut["token_ids"]) and stop not in tok.decode(cut["token_ids"][:-1])
    events = stream(
        tp1_engine.port,
        "/v1/completions",
        {"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": stop},
    )
    assert stream_text(events)[0::2] == (cut["text"], "stop")


BAD_REQUESTS = [
    ("/v1/completions", b'{"prompt": "hi", ', 400, "invalid_json", None),
    ("/v1/completions", b'["prompt"]', 400, "invalid_json", None),
    ("/v1/completions", b'{"max_tokens": 4}', 400, "missing_field", "prompt"),
    ("/v1/chat/completions", b'{"max_tokens": 4}', 400, "missing_field", "messages"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "wizard", "content": "x"}]}',
        400,
        "invalid_value",
        "messages.0.role",
    ),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', 400, None, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": -3}', 400, None, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 100000}', 400, None, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "many"}', 400, "invalid_value", "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 127}', 400, "context_length_exceeded", "prompt"),
    (
        "/v1/completions",
        b'{"prompt": ' + str(list(range(1, 130))).encode() + b"}",
        400,
        "context_length_exceeded",
        "prompt",
    ),
    (
        "/v1/completions",
        b'{"prompt": "' + b"one two three " * 60 + b'", "max_tokens": 1}',
        400,
        "context_length_exceeded",
        "prompt",
    ),
    ("/v1/completions", b'{"prompt": [1, 2, 99999]}', 400, None, "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": 9}', 400, "invalid_value", "temperature"),
    ("/v1/completions", b'{"prompt": "hi", "n": 2}', 400, "invalid_value", "n"),
    ("/v1/completions", b'{"prompt": "hi", "model": "gpt-9"}', 404, "model_not_found", "model"),
]


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(tp1_engine: Engine) -> None:
    before = tp1_engine.complete(PROMPTS[0], max_tokens=6)["choices"][0]["token_ids"]
    for path, raw, status, code, param in BAD_REQUESTS:
        reply = request(tp1_engine.port, "POST", path, raw=raw)
        assert reply.status == status, (raw[:60], reply.body)
        error = reply.body["error"]
        assert error["message"] and error["type"] and (code is None or error["code"] == code), (raw[:60], error)
        assert param is None or error["param"] == param, (raw[:60], error)
    assert request(tp1_engine.port, "GET", "/v1/nothing").status == 404
    huge = request(tp1_engine.port, "POST", "/v1/completions", raw=b'{"prompt": "' + b"x" * (5 * 2**20) + b'"}')
    assert huge.status == 413 and huge.body["error"]["code"] == "request_too_large"
    assert tp1_engine.complete(PROMPTS[0], max_tokens=6)["choices"][0]["token_ids"] == before
    assert tp1_engine.get("/ready").status == 200
    metrics = tp1_engine.get("/metrics").body
    assert 'weightcache_engine_requests_total{code="400",method="POST",route="/v1/completions"}' in metrics


def wait_exit(engine: Engine, timeout: float) -> int | None:
    try:
        return engine.proc.wait(timeout=timeout)
    except Exception:
        return None


def ready_status(engine: Engine) -> int | None:
    try:
        return engine.get("/ready").status
    except OSError:
        return None  # nobody listens any more: not ready either


@pytest.mark.slow
@pytest.mark.parametrize(
    "victim, sig",
    [(1, signal.SIGKILL), (0, signal.SIGKILL), (1, signal.SIGSTOP)],
    ids=["follower-killed", "leader-killed", "follower-hung"],
)
def test_a_dead_or_hung_rank_fails_readiness_and_the_engine_exits_nonzero(
    llama, start_engine, victim: int, sig: int
) -> None:
    # SIGSTOP: the rank is alive but answers nothing; only the collective timeout can notice.
    engine = start_engine(llama, "--tp-size", "2", "--dist-timeout", "3")
    pids = [r["pid"] for r in ranks_of(engine)]
    os.kill(pids[victim], sig)
    started = time.monotonic()
    code = wait_exit(engine, 30)
    assert code is not None and code != 0, engine.output()
    assert time.monotonic() - started < 30
    assert ready_status(engine) != 200
    for pid in pids:  # no rank is left behind
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)
        assert not alive(pid), f"rank pid {pid} still running"


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests_then_exits_zero(llama, start_engine) -> None:
    engine = start_engine(llama, "--tp-size", "2", "--drain-timeout", "60")
    pids = [r["pid"] for r in ranks_of(engine)]
    result: dict = {}
    first_chunk = threading.Event()

    def long_stream() -> None:
        import json
        import urllib.request

        body = {"prompt": PROMPTS[0], "max_tokens": 150, "temperature": 0, "ignore_eos": True, "stream": True}
        req = urllib.request.Request(
            f"http://127.0.0.1:{engine.port}/v1/completions", data=json.dumps(body).encode(), method="POST"
        )
        chunks = []
        with urllib.request.urlopen(req, timeout=120) as resp:
            for line in resp:
                if line.startswith(b"data: "):
                    chunks.append(line[6:].strip())
                    first_chunk.set()
        result["chunks"] = chunks

    client = threading.Thread(target=long_stream)
    client.start()
    assert first_chunk.wait(30)
    engine.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while ready_status(engine) == 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready_status(engine) != 200  # draining: readiness drops at once, new work is refused
    refused = None
    try:
        refused = engine.complete("too late", max_tokens=2)
    except (OSError, AssertionError):
        pass
    assert refused is None
    client.join(timeout=120)
    assert wait_exit(engine, 60) == 0, engine.output()
    import json

    chunks = result["chunks"]
    assert chunks[-1] == b"[DONE]"
    last = json.loads(chunks[-2])
    assert last["choices"][0]["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 150
    assert not any(alive(p) for p in pids)
    assert "drained" in engine.output()


def test_client_mode_without_a_daemon_follows_the_fallback_policy(llama, socket_dir, start_engine) -> None:
    # Only the values this test is about, as the operator renders them: in the environment.
    env = {
        EngineArgs.variable("socket_dir"): socket_dir,
        EngineArgs.variable("name"): "absent",
        EngineArgs.variable("weight_cache_mode"): "client",
    }
    engine = start_engine(llama, env=env)
    weights = ranks_of(engine)[0]["weights"]
    assert weights["mode_requested"] == "client" and weights["mode"] == "disk"
    assert "CacheUnavailable" in weights["fallback_reason"] and "absent" in weights["fallback_reason"]
    assert 'weightcache_engine_weight_fallbacks_total{rank="0"} 1' in engine.get("/metrics").body
    assert engine.complete(PROMPTS[0], max_tokens=3)["usage"]["completion_tokens"] >= 1
    assert engine.stop() == 0

    strict = start_engine(llama, "--weight-cache-fallback", "error", env=env, wait=False)
    code = wait_exit(strict, 60)
    assert code is not None and code != 0
    assert "no daemon listens" in strict.output()


@pytest.mark.slow
def test_daemon_mode_spawns_daemons_once_and_later_starts_map_them(llama, socket_dir, start_engine) -> None:
    args = ("--tp-size", "2", "--weight-cache-mode", "daemon", "--socket-dir", socket_dir, "--name", "own")
    first = start_engine(llama, *args)
    try:
        assert [r["weights"]["mode"] for r in ranks_of(first)] == ["cache", "cache"]
        assert "spawned=True" in first.output()
        assert first.stop() == 0
        second = start_engine(llama, *args)
        assert "spawned=False" in second.output()
        assert [r["weights"]["mode"] for r in ranks_of(second)] == ["cache", "cache"]
        assert second.complete(PROMPTS[0], max_tokens=4)["usage"]["completion_tokens"] >= 1
    finally:
        stop_spawned_daemons(socket_dir, "own")


def stop_spawned_daemons(socket_dir: str, name: str) -> None:
    """Daemons spawned by daemon mode outlive engines by design: stop them at the end of a test."""
    from weightcache.wire.rankfiles import RankFiles

    info = RankFiles(socket_dir, name, 0).read_ready()
    if info is not None:
        try:
            os.killpg(os.getpgid(info.pid), signal.SIGTERM)
        except ProcessLookupError:
            return  # it stopped already (its ready file goes last on a clean stop, and stays after a crash)
        deadline = time.monotonic() + 30
        while RankFiles(socket_dir, name, 0).lock_is_held() and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.mark.slow
def test_an_expert_parallel_moe_engine_spawns_its_daemons_and_answers_as_tp1_does(
    checkpoint_factory, socket_dir, start_engine
) -> None:
    moe = checkpoint_factory(family="qwen3_moe", num_layers=2)
    args = (
        "--tp-size",
        "2",
        "--ep-size",
        "2",
        "--dtype",
        "float32",
        "--weight-cache-mode",
        "daemon",
        "--socket-dir",
        socket_dir,
        "--name",
        "moe",
    )
    try:
        ep = start_engine(moe, *args)
        assert [r["weights"]["mode"] for r in ranks_of(ep)] == ["cache", "cache"]
        assert all(r["weights"]["weights_in_arena"] for r in ranks_of(ep))
        one = start_engine(moe, "--dtype", "float32")
        for prompt in PROMPTS:
            assert (
                ep.complete(prompt, max_tokens=8)["choices"][0]["token_ids"]
                == one.complete(prompt, max_tokens=8)["choices"][0]["token_ids"]
            )
    finally:
        stop_spawned_daemons(socket_dir, "moe")


def test_ranks_started_one_by_one_are_live_but_not_ready_until_all_have_joined(llama, start_engine) -> None:
    # How a supervisor may run ranks as separate processes (e.g. one container per rank).
    common = ("--tp-size", "2", "--dist-addr", f"127.0.0.1:{free_port()}")
    leader = start_engine(llama, *common, "--tp-rank", "0", wait=False)
    deadline = time.monotonic() + 60
    while ready_status(leader) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    assert leader.get("/health").status == 200  # liveness answers while rank 1 is missing
    not_ready = leader.get("/ready")
    assert not_ready.status == 503 and not_ready.body["reason"] == "starting"
    assert leader.post("/v1/completions", {"prompt": "hi"}).body["error"]["code"] == "not_ready"
    follower = start_engine(llama, *common, "--tp-rank", "1", "--port", "0", wait=False)
    leader.wait_ready(60)
    assert [r["rank"] for r in ranks_of(leader)] == [0, 1] and ranks_of(leader)[1]["pid"] == follower.proc.pid
    assert leader.complete(PROMPTS[0], max_tokens=4)["usage"]["completion_tokens"] >= 1
    assert leader.stop() == 0
    assert wait_exit(follower, 30) == 0  # rank 0 drained, then told rank 1 to stop


@pytest.mark.parametrize(
    "args, words",
    [
        (("--tp-size", "3"), "not divisible by tensor-parallel size 3"),
        (("--weight-cache-mode", "client"), "needs --socket-dir and --name"),
        (("--weight-cache-mode", "sometimes"), "must be one of off, client, daemon"),
        (("--tp-size", "2", "--ep-size", "2"), "--ep-size 2 needs a mixture-of-experts model"),
        (("--tp-size", "2", "--ep-size", "4"), "--ep-size 4 must divide --tp-size 2"),
        pytest.param(
            ("--backend", "cuda-vmm"),
            "sees no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),
        ),
    ],
)
def test_a_misconfigured_engine_exits_2_before_starting_anything(llama, start_engine, args, words) -> None:
    engine = start_engine(llama, *args, wait=False)
    assert wait_exit(engine, 60) == 2
    assert words in engine.output() and "ranks started" not in engine.output()


def test_drain_deadline_ends_unfinished_requests_with_an_error_and_exits_zero(llama, start_engine) -> None:
    engine = start_engine(llama, "--drain-timeout", "0.5")
    import json
    import urllib.request

    body = {"prompt": PROMPTS[0], "max_tokens": 500, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(
        f"http://127.0.0.1:{engine.port}/v1/completions", data=json.dumps(body).encode(), method="POST"
    )
    chunks = []
    with urllib.request.urlopen(req, timeout=60) as resp:
        for line in resp:
            if line.startswith(b"data: "):
                chunks.append(line[6:].strip())
                if len(chunks) == 1:
                    engine.proc.send_signal(signal.SIGTERM)
    assert wait_exit(engine, 30) == 0
    assert chunks[-1] == b"[DONE]"
    error = json.loads(chunks[-2])["error"]
    assert error["type"] == "server_error" and "stopped before this request finished" in error["message"]
    assert len(chunks) - 2 < 500


def test_a_client_that_goes_away_stops_its_generation(tp1_engine: Engine) -> None:
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", tp1_engine.port, timeout=30)
    conn.request(
        "POST",
        "/v1/completions",
        body=json.dumps(
            {"prompt": PROMPTS[2], "max_tokens": 120, "temperature": 0, "ignore_eos": True, "stream": True}
        ),
    )
    resp = conn.getresponse()
    assert resp.readline().startswith(b"data: ")
    conn.sock.close()  # hang up mid-stream
    conn.close()
    deadline = time.monotonic() + 10
    while "reason=cancelled" not in tp1_engine.output() and time.monotonic() < deadline:
        time.sleep(0.02)
    finished = re.search(r"msg=\"request finished\" .*reason=cancelled completion_tokens=(\d+)", tp1_engine.output())
    assert finished and int(finished.group(1)) < 120, tp1_engine.output()[-2000:]
    assert "weightcache_engine_active_requests 0\n" in tp1_engine.get("/metrics").body
    assert tp1_engine.complete(PROMPTS[0], max_tokens=3)["usage"]["completion_tokens"] >= 1
