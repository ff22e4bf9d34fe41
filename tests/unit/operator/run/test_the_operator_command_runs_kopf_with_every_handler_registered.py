"""``python -m weightcache_operator`` hands kopf a registry that holds the operator's handlers: an
entry point that forgot to import them runs a kopf that logs in, joins the peering and then
does nothing, which no pass-level test would notice."""

from __future__ import annotations

import json
import subprocess
import sys

from repo_root import ROOT

# Runs the real entry point with kopf.run replaced by a probe that reports what kopf would run.
PROBE = """
import json, runpy, sys
import kopf

def report(**options):
    registry = kopf.get_default_registry()
    print(json.dumps({
        "activities": sorted(h.id for h in registry._activities.get_all_handlers()),
        "indexers": sorted(h.id for h in registry._indexing.get_all_handlers()),
        "watchers": sorted(h.id for h in registry._watching.get_all_handlers()),
        "changers": sorted(h.id for h in registry._changing.get_all_handlers()),
        "peering": options.get("peering_name"),
    }))

kopf.run = report
runpy.run_module("weightcache_operator", run_name="__main__")
"""


def test_the_operator_command_registers_its_handlers_before_kopf_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={"PYTHONPATH": f"{ROOT / 'contract'}:{ROOT / 'operator'}", "KUBECONFIG": "/nonexistent"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    registered = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"configure", "shut_down"} <= set(registered["activities"]), registered
    assert {"pod_index", "node_index"} <= set(registered["indexers"]), registered
    assert {"on_pod", "on_node"} <= {h.split("/")[0] for h in registered["watchers"]}, registered
    assert registered["changers"] and registered["peering"] == "weightcache-operator", registered
