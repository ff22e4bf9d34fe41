"""The operator's own metrics (act/metrics.py): passes and their steps, caches by phase, engines, API
requests and rollouts, in Prometheus's text exposition, served on GET /metrics only."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.prometheus import Metrics
from weightcache_operator.act.metrics import OperatorMetrics, metrics_server
from weightcache_operator.spec import WeightCacheStatus


def series(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")
    }


def test_operator_metrics_count_passes_and_track_phases_and_engines() -> None:
    m = OperatorMetrics()
    empty = series(m.render())
    assert {k: v for k, v in empty.items() if k.startswith("weightcache_operator_caches")} == {
        f'weightcache_operator_caches{{phase="{p}"}}': 0 for p in ("Pending", "Loading", "Ready", "Degraded", "Failed")
    }
    m.pass_done("ns", "tiny", "ok", 0.02)
    m.pass_done("ns", "tiny", "ok", 3.0)
    m.pass_done("ns", "tiny", "error", 0.5)
    m.cache_status("ns", "tiny", WeightCacheStatus(phase="Ready", active_engines=1, standby_engines=1))
    m.cache_status("ns", "other", WeightCacheStatus(phase="Failed", active_engines=0, standby_engines=0))
    got = series(m.render())
    assert got['weightcache_operator_reconcile_total{cache="tiny",namespace="ns",outcome="ok"}'] == 2
    assert got['weightcache_operator_reconcile_total{cache="tiny",namespace="ns",outcome="error"}'] == 1
    assert (
        got['weightcache_operator_reconcile_seconds_bucket{cache="tiny",namespace="ns",outcome="ok",le="0.025"}'] == 1
    )
    assert got['weightcache_operator_reconcile_seconds_bucket{cache="tiny",namespace="ns",outcome="ok",le="+Inf"}'] == 2
    assert got['weightcache_operator_reconcile_seconds_sum{cache="tiny",namespace="ns",outcome="ok"}'] == 3.02
    assert (
        got['weightcache_operator_caches{phase="Ready"}'] == 1
        and got['weightcache_operator_caches{phase="Failed"}'] == 1
    )
    assert got['weightcache_operator_engines{cache="tiny",namespace="ns",role="standby"}'] == 1

    m.cache_status("ns", "tiny", None)  # deleted: its series go, the phase count drops
    after = series(m.render())
    assert after['weightcache_operator_caches{phase="Ready"}'] == 0
    assert not any('cache="tiny"' in k for k in after if k.startswith("weightcache_operator_engines"))


def test_exposition_escapes_label_values_and_help_and_replaces_gauge_families() -> None:
    m = Metrics()
    m.describe("g", "gauge", "a \\ backslash\nand a newline")
    m.replace("g", [(1, {"path": 'C:\\dir "x"\nnext'}), (2, {"path": "plain"})])
    text = m.render()
    assert "# HELP g a \\\\ backslash\\nand a newline\n" in text
    assert 'g{path="C:\\\\dir \\"x\\"\\nnext"} 1\n' in text and 'g{path="plain"} 2\n' in text
    m.replace("g", [(3, {"path": "plain"})])
    assert series(m.render()) == {'g{path="plain"}': 3}
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]+="([^"\\]|\\.)*",?)*\})? \S+$')
    assert all(line.startswith("#") or sample.match(line) for line in text.strip().splitlines())


def test_metrics_endpoint_serves_get_metrics_only() -> None:
    m = OperatorMetrics()
    m.pass_done("ns", "tiny", "ok", 0.1)
    server = metrics_server(m, "127.0.0.1:0")
    server.start()
    try:
        host, port = server.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert (
                'weightcache_operator_reconcile_total{cache="tiny",namespace="ns",outcome="ok"} 1'
                in response.read().decode()
            )
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://{host}:{port}/status", timeout=10)
        assert missing.value.code == 404 and "GET /metrics" in json.loads(missing.value.read())["error"]
        with pytest.raises(urllib.error.HTTPError) as post:
            urllib.request.urlopen(
                urllib.request.Request(f"http://{host}:{port}/metrics", b"x", method="POST"), timeout=10
            )
        assert post.value.code == 405 and post.value.headers["Allow"] == "GET"
    finally:
        server.stop()


def test_metrics_address_errors_name_the_variable() -> None:
    with pytest.raises(WeightCacheError, match=r"\$WEIGHTCACHE_OPERATOR_METRICS '9090' is not HOST:PORT"):
        metrics_server(OperatorMetrics(), "9090")


def test_a_pass_stopwatch_charges_each_step_the_time_since_the_previous_lap_and_keeps_the_sums() -> None:
    m = OperatorMetrics()
    ticks = iter([10.0, 10.2, 10.3, 13.3, 13.4, 13.45, 13.5])
    watch = m.stopwatch(clock=lambda: next(ticks))
    watch.lap("observe")  # 0.2 s
    watch.lap("gates")  # 0.1 s
    watch.lap("execute")  # 3 s
    watch.lap("gates")  # 0.1 s
    watch.lap("status")  # 0.05 s
    assert watch.elapsed() == pytest.approx(3.5)
    assert watch.steps_ms() == {"observe": 200, "gates": 200, "execute": 3000, "status": 50}, (
        "a step lapped twice adds up"
    )
    got = series(m.render())
    step = "weightcache_operator_pass_step_seconds"
    assert got[f'{step}_sum{{step="observe"}}'] == pytest.approx(0.2)
    assert got[f'{step}_bucket{{step="observe",le="0.25"}}'] == 1
    assert got[f'{step}_bucket{{step="execute",le="2.5"}}'] == 0
    assert got[f'{step}_bucket{{step="execute",le="5"}}'] == 1
    assert got[f'{step}_sum{{step="status"}}'] == pytest.approx(0.05)
    assert got[f'{step}_count{{step="gates"}}'] == 2, "each lap is one observation"
    m.api_request("LIST", 0.3)
    m.api_request("LIST", 0.01)
    assert series(m.render())['weightcache_operator_api_request_seconds_count{verb="LIST"}'] == 2


def test_rollout_gauges_follow_the_latest_rollout_of_each_cache_until_the_cache_is_gone() -> None:
    m = OperatorMetrics()
    progressing = {"phase": "Progressing", "mode": "Engine", "updated": 1, "total": 3, "currentStep": "replica 1"}
    status = {"phase": "Ready", "activeEngines": 3, "standbyEngines": 3, "rollout": progressing}
    assert not any("rollout" in k for k in series(m.render())), "no rollout yet: no series"
    m.cache_status("ns", "tiny", WeightCacheStatus.model_validate(status))
    got = series(m.render())
    phase = 'weightcache_operator_rollout_phase{cache="tiny",mode="Engine",namespace="ns",phase="%s"}'
    assert [got[phase % p] for p in ("Progressing", "Stalled", "Complete")] == [1, 0, 0]
    assert got['weightcache_operator_rollout_updated_replicas{cache="tiny",namespace="ns"}'] == 1
    assert got['weightcache_operator_rollout_replicas{cache="tiny",namespace="ns"}'] == 3

    # A pass that stopped before planning keeps the last one.
    m.cache_status("ns", "tiny", WeightCacheStatus(phase="Failed"))
    assert series(m.render())[phase % "Progressing"] == 1
    completed = {**status, "rollout": {**progressing, "phase": "Complete", "updated": 3}}
    m.cache_status("ns", "tiny", WeightCacheStatus.model_validate(completed))
    got = series(m.render())
    assert [got[phase % p] for p in ("Progressing", "Stalled", "Complete")] == [0, 0, 1]
    assert got['weightcache_operator_rollout_updated_replicas{cache="tiny",namespace="ns"}'] == 3

    m.cache_status("ns", "tiny", None)
    assert not any("rollout" in k for k in series(m.render()))
