"""The hollow daemons of the scale harness (tests/cluster/testcluster/kubelet/hollowdaemons.py)
answer what a real daemon pod answers: a report the operator's contract accepts, for the ranks
the rendered pod names, and a readiness endpoint that follows the state the test sets."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import pytest
from testcluster.kubelet.hollowdaemons import (
    HollowDaemon,
    HollowDaemonServer,
    HollowDaemonState,
    daemon_of,
    report,
)
from testcluster.sample import sample
from weightcache_contract.daemon_report import DaemonReport
from weightcache_operator.observe.validation import parse
from weightcache_operator.render import daemon_daemonset


def rendered_daemon_pod(slot: int | None, nodes: int) -> dict:
    body = sample()
    body["metadata"] = {"name": "tiny-llama", "namespace": "bench"}
    body["spec"]["parallelism"] = {"tensor": 2, "nodes": nodes}
    cache, problems = parse(body)
    assert cache is not None and not problems, problems
    return {
        "spec": daemon_daemonset(cache, slot=slot, nodes=["n1"] if slot is not None else None)["spec"]["template"][
            "spec"
        ]
    }


def test_a_rendered_daemon_pod_names_its_cache_and_its_local_ranks() -> None:
    assert daemon_of(rendered_daemon_pod(None, 1)) == HollowDaemon("tiny-llama", [0, 1])
    assert daemon_of(rendered_daemon_pod(1, 2)) == HollowDaemon("tiny-llama", [1]), "slot 1 of a 2-node group"
    assert (
        daemon_of({"spec": {"containers": [{"name": "engine", "command": ["python", "-m", "weightcache", "engine"]}]}})
        is None
    )


@pytest.mark.parametrize("health", ["ready", "loading", "failed"])
def test_every_state_reports_in_the_contract_the_operator_reads(health: str) -> None:
    state = HollowDaemonState(health, free_bytes=5 << 30)  # type: ignore[arg-type]
    parsed = DaemonReport.model_validate(report(HollowDaemon("c", [0, 1]), state))
    assert parsed.ready is state.ready and [r.rank for r in parsed.ranks] == [0, 1]
    assert (parsed.fingerprint is not None) is state.ready and parsed.memory[0].free_bytes == 5 << 30
    assert all((r.problem is None) is state.ready for r in parsed.ranks)


def test_one_server_answers_for_each_pod_what_its_node_is_set_to() -> None:
    states = {"n1": HollowDaemonState()}
    server = HollowDaemonServer(lambda node: states.get(node, HollowDaemonState()))
    server.start()
    try:
        server.serve("uid-1", "127.0.0.1", 0, "n1", HollowDaemon("c", [0]))
        port = server._servers["uid-1"].result(5).sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/status", timeout=5) as response:
            assert DaemonReport.model_validate_json(response.read()).ready
        with urllib.request.urlopen(f"{base}/ready", timeout=5) as response:
            assert response.status == 200
        states["n1"] = HollowDaemonState("loading")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/ready", timeout=5)
        assert refused.value.code == 503
        with urllib.request.urlopen(f"{base}/status", timeout=5) as response:
            assert DaemonReport.model_validate_json(response.read()).ranks[0].problem == "loading weights"
        assert server.requests == 4
    finally:
        server.stop()


def test_starting_an_endpoint_never_waits_while_an_answer_in_flight_is_blocked() -> None:
    """The fleet starts endpoints from its pod watch while holding its lock; an answer being
    written may need that lock: waiting for the loop there stalled the watch 10 s per pod."""
    held = threading.Lock()

    def state_of(node: str) -> HollowDaemonState:
        with held:
            return HollowDaemonState()

    server = HollowDaemonServer(state_of)
    server.start()
    try:
        server.serve("a", "127.0.0.1", 0, "n1", HollowDaemon("c", [0]))
        port = server._servers["a"].result(5).sockets[0].getsockname()[1]
        answered: list[bytes] = []
        with held:
            asking = threading.Thread(
                target=lambda: answered.append(
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10).read()
                )
            )
            asking.start()
            time.sleep(0.3)  # the loop is now stuck in state_of
            started = time.monotonic()
            server.serve("b", "127.0.0.1", 0, "n1", HollowDaemon("c", [0]))
            assert time.monotonic() - started < 1
        asking.join(10)
        assert answered and server._servers["b"].result(5).sockets
    finally:
        server.stop()
