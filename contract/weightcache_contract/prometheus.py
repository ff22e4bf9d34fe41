"""Prometheus metrics in the text exposition format, written by hand: counters, gauges, histograms.

A dependency on prometheus_client would be larger than this module; the format is simple and
stable (https://prometheus.io/docs/instrumenting/exposition_formats/). Shared by the engine, the
daemon's status endpoint and the operator, so it imports nothing heavier than the standard
library (the operator image has no torch).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STARTUP_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0, 1200.0)
"""For process starts: seconds to tens of minutes (a GPU engine that compiles), where a request's
latency buckets would put every start past a minute into +Inf."""
Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    """Label values escape backslash, double quote and newline (the exposition format's rule)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    """HELP text escapes only backslash and newline."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


class Metrics:
    """Thread-safe: an HTTP thread renders while other threads record."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._help: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._hist: dict[str, dict[Labels, list[float]]] = defaultdict(dict)  # bucket counts + [sum, count]
        self._buckets: dict[str, tuple[float, ...]] = {}

    def describe(self, name: str, kind: str, text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        """``buckets``: a histogram's upper bounds (``le``), ascending; +Inf is added."""
        self._help[name] = (kind, text)
        self._buckets[name] = buckets

    def described(self) -> dict[str, str]:
        """Every metric family described so far, name → kind, whether or not it has a series yet:
        what a scrape can show (the chart's dashboard is checked against it)."""
        return {name: kind for name, (kind, _text) in self._help.items()}

    def inc(self, name: str, amount: float = 1.0, **labels: object) -> None:
        key = tuple(sorted((k, str(v)) for k, v in labels.items()))
        with self._lock:
            self._values[name][key] = self._values[name].get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: object) -> None:
        key = tuple(sorted((k, str(v)) for k, v in labels.items()))
        with self._lock:
            self._values[name][key] = value

    def replace(self, name: str, series: Iterable[tuple[float, Mapping[str, object]]]) -> None:
        """Sets every series of gauge ``name`` at once, dropping those not given: a series whose
        subject is gone (a deleted cache) stops being exported instead of freezing at its last
        value, and a scrape never sees the family half rewritten."""
        values = {tuple(sorted((k, str(v)) for k, v in labels.items())): float(value) for value, labels in series}
        with self._lock:
            self._values[name] = values

    def observe(self, name: str, value: float, **labels: object) -> None:
        key = tuple(sorted((k, str(v)) for k, v in labels.items()))
        bounds = self._buckets.get(name, LATENCY_BUCKETS)
        with self._lock:
            counts = self._hist[name].setdefault(key, [0.0] * (len(bounds) + 2))
            for i, bound in enumerate(bounds):
                if value <= bound:
                    counts[i] += 1
            counts[-2] += value
            counts[-1] += 1

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name in sorted(set(self._values) | set(self._hist)):
                kind, text = self._help.get(name, ("untyped", name))
                lines += [f"# HELP {name} {_escape_help(text)}", f"# TYPE {name} {kind}"]
                for labels, value in sorted(self._values.get(name, {}).items()):
                    lines.append(f"{name}{_labels(labels)} {value:.17g}")
                for labels, counts in sorted(self._hist.get(name, {}).items()):
                    for bound, count in zip(self._buckets.get(name, LATENCY_BUCKETS), counts):
                        lines.append(f"{name}_bucket{_labels(labels + (('le', f'{bound:g}'),))} {count:.17g}")
                    lines.append(f"{name}_bucket{_labels(labels + (('le', '+Inf'),))} {counts[-1]:.17g}")
                    lines.append(f"{name}_sum{_labels(labels)} {counts[-2]:.17g}")
                    lines.append(f"{name}_count{_labels(labels)} {counts[-1]:.17g}")
        return "\n".join(lines) + "\n"
