"""charts/weightcache/dashboards/weightcache.json, the chart's Grafana dashboard: every query
names only metric series that the operator, the daemon's status endpoint or the reference engine
export, read from their own metric registries (a renamed or removed metric fails here, not on
someone's empty panel), and Prometheus' own PromQL parser (tests/promql, built once per source
hash with the Go toolchain the control plane uses) accepts it. Rendering it into a ConfigMap is
tested in test_the_charts_values_reach_the_objects_they_set.py."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from repo_root import ROOT
from weightcache.engine.metrics import engine_metrics
from weightcache_contract.daemon_report import DaemonReport, report_metrics
from weightcache_operator.act.metrics import OperatorMetrics

sys.path.insert(0, str(ROOT / "tests" / "cluster"))

from testcluster.cache import cache_root  # noqa: E402

DASHBOARD = ROOT / "charts" / "weightcache" / "dashboards" / "weightcache.json"
PROMQL_CHECK = ROOT / "tests" / "promql"
GRAFANA_VARIABLES = {
    # What Grafana puts in for each variable before sending a query (all values selected).
    "${cache:regex}": ".*",
    "$__rate_interval": "1m",
    "$__range": "6h",
    "$namespace": ".*",
    "$cache": ".*",
}

PROMQL_CALLS = {
    # aggregation operators and the functions the dashboard may call: PromQL's vocabulary, not metrics
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "count_values", "group",
    "rate", "irate", "increase", "delta", "idelta", "changes", "resets", "deriv",
    "histogram_quantile", "clamp_min", "clamp_max", "abs", "time", "timestamp", "vector", "scalar",
    "max_over_time", "min_over_time", "avg_over_time", "last_over_time", "absent", "label_values",
}  # fmt: skip
PROMQL_WORDS = {"bool", "offset", "and", "or", "unless"}


def exported_series() -> dict[str, str]:
    """Series names a scrape can show, each mapped to its family: a histogram shows as
    ``_bucket``, ``_sum`` and ``_count``, never under its own name."""
    families: dict[str, str] = {}
    for registry in (  # every registry the code builds: the operator's, a daemon pod's, an engine's
        OperatorMetrics().registry,
        report_metrics(DaemonReport(cache="c", ready=False, ranks=[])),
        engine_metrics(),
    ):
        families.update(registry.described())
    series = {}
    for name, kind in families.items():
        for suffix in ("_bucket", "_sum", "_count") if kind == "histogram" else ("",):
            series[name + suffix] = name
    return series


def named_metrics(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, function names) in a PromQL expression with Grafana variables."""
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "v", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", text)  # label values
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"label_values\((.*),\s*[a-zA-Z_]\w*\s*\)", r"label_values(\1)", text)
    metrics, calls = set(), set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?", text):
        word = match.group(0).rstrip("( \t")
        if match.group(1):
            calls.add(word)
        elif word not in PROMQL_WORDS and not re.fullmatch(r"\d", text[match.start() - 1 : match.start()] or " "):
            metrics.add(word)
    return metrics, calls


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expression) of every panel target and every query variable."""
    found = [
        (f"panel {panel['title']!r}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"variable ${variable['name']}", variable["query"]["query"]))
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_every_dashboard_query_names_only_series_that_weightcache_exports(dashboard: dict[str, Any]) -> None:
    exported = exported_series()
    assert "weightcache_operator_failover_detection_seconds_bucket" in exported
    assert "weightcache_daemon_bytes_held" in exported and "weightcache_engine_startup_seconds" in exported
    found = queries(dashboard)
    assert len(found) >= 20, found
    for where, expr in found:
        metrics, calls = named_metrics(expr)
        assert metrics, f"{where}: no metric in {expr!r}"
        unknown = metrics - set(exported)
        assert not unknown, f"{where}: {sorted(unknown)} not exported by the operator, daemon or engine: {expr!r}"
        assert calls <= PROMQL_CALLS, f"{where}: unexpected calls {sorted(calls - PROMQL_CALLS)} in {expr!r}"


def test_histogram_quantiles_read_buckets_by_le_and_operator_counters_through_rate_or_increase(
    dashboard: dict[str, Any],
) -> None:
    exported = exported_series()
    for where, expr in queries(dashboard):
        for quantile in re.finditer(r"histogram_quantile\(", expr):
            inner = expr[quantile.end() :]
            assert re.search(r"by \(le\b", inner) and "_bucket{" in inner, f"{where}: {expr!r}"
        for name in named_metrics(expr)[0]:
            if name.endswith("_bucket") and exported[name] != name:
                assert "histogram_quantile(" in expr, f"{where}: buckets outside a quantile: {expr!r}"
            # The operator's counters live as long as its process: only their increase means something.
            # The daemon's and engine's count one daemon's or engine's life, which a panel may show whole.
            if name.startswith("weightcache_operator_") and name.endswith("_total"):
                assert re.search(rf"(rate|increase)\({name}\{{", expr), f"{where}: a counter read raw: {expr!r}"


def test_the_check_refuses_unknown_names_and_a_histogram_under_its_bare_name() -> None:
    exported = set(exported_series())
    bare = "histogram_quantile(0.99, sum by (le) (rate(weightcache_operator_failover_promotion_seconds[5m])))"
    assert named_metrics(bare)[0] - exported == {"weightcache_operator_failover_promotion_seconds"}
    typo = 'sum by (node, pod) (weightcache_daemon_byte_held{namespace=~"$namespace"}) / 2'
    assert named_metrics(typo) == ({"weightcache_daemon_byte_held"}, {"sum"})
    variable = 'label_values(weightcache_operator_engines{namespace=~"$namespace"}, cache)'
    assert named_metrics(variable) == ({"weightcache_operator_engines"}, {"label_values"})


def test_the_dashboard_reads_one_prometheus_chosen_by_a_variable_and_filters_by_namespace_and_cache(
    dashboard: dict[str, Any],
) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "cache"} <= set(variables)
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            if "weightcache_operator_caches" not in expr:  # the one family without a per-cache label
                assert "$namespace" in expr and ("$cache" in expr or "${cache:regex}" in expr), (panel["title"], expr)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def promql_check() -> Path:
    """tests/promql built once per hash of its sources and the toolchain, outside the repository."""
    go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout
    sources = b"".join((PROMQL_CHECK / name).read_bytes() for name in ("go.mod", "go.sum", "main.go"))
    key = hashlib.sha256(sources + version.encode()).hexdigest()[:16]
    target = cache_root() / "promql" / key / "promql-check"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:  # two test sessions at once build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            subprocess.run(
                [go, "build", "-mod=readonly", "-trimpath", "-o", str(target) + ".partial", "."],
                cwd=PROMQL_CHECK,
                env={**os.environ, "GOFLAGS": "-buildvcs=false"},
                check=True,
                timeout=900,
            )
            os.replace(str(target) + ".partial", target)
    return target


def parsed_by_prometheus(exprs: list[str]) -> list[str]:
    result = subprocess.run(
        [str(promql_check())], input="\n".join(exprs) + "\n", capture_output=True, text=True, timeout=60
    )
    assert result.returncode in (0, 1), result.stderr
    return result.stdout.splitlines()


def as_grafana_sends_it(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a variable the dashboard does not define: {expr!r}"
    return re.sub(r"^label_values\((.*),\s*[a-zA-Z_]\w*\)$", r"\1", expr)  # a variable's query: its selector


def test_prometheus_parses_every_dashboard_query_as_an_instant_vector(dashboard: dict[str, Any]) -> None:
    found = queries(dashboard)
    verdicts = parsed_by_prometheus([as_grafana_sends_it(expr) for _where, expr in found])
    assert len(verdicts) == len(found)
    for (where, expr), verdict in zip(found, verdicts, strict=True):
        assert verdict == "ok vector", f"{where}: {verdict}: {expr!r}"
    assert parsed_by_prometheus(["sum by (le (rate(x_bucket[1m]))", "x[1m]"]) == [
        'error 1:12: parse error: unexpected "(" in grouping opts, expected "," or ")"',
        "ok matrix",
    ], "the parser refuses what Prometheus refuses, and tells a range from an instant vector"
