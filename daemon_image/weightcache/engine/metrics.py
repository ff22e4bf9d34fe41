"""The engine's Prometheus metrics: names, kinds and help texts (the writer is ``weightcache_contract.prometheus``)."""

from __future__ import annotations

from weightcache_contract.prometheus import Metrics

__all__ = ["Metrics", "engine_metrics"]


def engine_metrics() -> Metrics:
    m = Metrics()
    m.describe("weightcache_engine_requests_total", "counter", "HTTP requests by route and status code")
    m.describe("weightcache_engine_request_seconds", "histogram", "HTTP request latency by route")
    m.describe("weightcache_engine_first_token_seconds", "histogram", "time from request to first generated token")
    m.describe("weightcache_engine_prompt_tokens_total", "counter", "prompt tokens processed")
    m.describe("weightcache_engine_generated_tokens_total", "counter", "tokens generated")
    m.describe("weightcache_engine_weight_mode", "gauge", "1 for the weight mode each rank used (cache or disk)")
    m.describe("weightcache_engine_weight_bind_seconds", "gauge", "seconds each rank spent obtaining its weights")
    m.describe("weightcache_engine_weight_bytes", "gauge", "weight bytes per rank, by how they were obtained")
    m.describe("weightcache_engine_weight_fallbacks_total", "counter", "ranks that fell back from the cache to disk")
    m.describe(
        "weightcache_engine_startup_seconds", "gauge", "seconds since process start at which each startup phase ended"
    )
    m.describe(
        "weightcache_engine_ready", "gauge", "1 while weights are bound, warm-up is done and every rank is alive"
    )
    m.describe("weightcache_engine_active_requests", "gauge", "requests admitted and not yet finished")
    return m
