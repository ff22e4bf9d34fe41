"""status.lastFailover as failover.py writes it from a promotion (who took over from whom, on which
nodes, on what signal, how fast), as the CRD schema takes it, and the failover metrics it feeds."""

from __future__ import annotations

from datetime import timedelta

from builders import NOW, at
from replica_plans import HASH, plan_replica, running_engine
from weightcache_operator.act.metrics import OperatorMetrics
from weightcache_operator.plan.actions import Promotion
from weightcache_operator.plan.failover import failover_status
from weightcache_operator.spec import WeightCacheStatus


def test_last_failover_entry_and_metrics() -> None:
    active = running_engine("a", role="active", ready=False, ready_since=60)
    active["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"finishedAt": at(60)}}
    plan = plan_replica(0, [active, running_engine("s", role="standby", node="node-2", created=1)], 1, HASH, {})
    assert plan.promotion is not None
    noticed = NOW + timedelta(seconds=60, milliseconds=250)
    seen = noticed - timedelta(milliseconds=3)
    entry = failover_status(plan.promotion, noticed, noticed + timedelta(milliseconds=12), seen).wire()
    assert entry == {
        "time": "2026-11-29T10:01:00.250000Z",
        "replica": 0,
        "from": "a",
        "fromNode": "node-1",
        "to": "s",
        "toNode": "node-2",
        "signal": "ContainerRestarted",
        "reason": "container engine of a restarted",
        "detectionMs": 3.0,
        "promotionMs": 12.0,
        "failureApiSecond": "2026-11-29T10:01:00Z",
    }
    parsed = WeightCacheStatus.model_validate({"lastFailover": entry})
    assert parsed.last_failover is not None and parsed.last_failover.from_ == "a"

    metrics = OperatorMetrics()
    metrics.failover("ns", "tiny", "ContainerRestarted", entry["detectionMs"], entry["promotionMs"])
    text = metrics.render()
    assert 'weightcache_operator_failovers_total{cache="tiny",namespace="ns",signal="ContainerRestarted"} 1' in text
    assert 'weightcache_operator_failover_promotion_seconds_bucket{cache="tiny",namespace="ns",le="0.01"} 0' in text
    assert 'weightcache_operator_failover_promotion_seconds_bucket{cache="tiny",namespace="ns",le="0.025"} 1' in text
    assert (
        'weightcache_operator_failover_detection_seconds_count{cache="tiny",namespace="ns",signal="ContainerRestarted"} 1'
        in text
    )


def test_a_promotion_without_a_failed_pod_has_no_from() -> None:
    promotion = Promotion(2, running_engine("s", role="standby"), None, None)
    entry = failover_status(promotion, NOW, NOW, None).wire()
    assert "from" not in entry and "signal" not in entry and entry["to"] == "s" and entry["promotionMs"] == 0.0
