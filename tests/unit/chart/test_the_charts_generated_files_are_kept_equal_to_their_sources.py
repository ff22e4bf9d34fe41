"""The files generated from other sources are what generating them gives: the chart's crds/ (the CRDs),
deploy/operator.yaml (the chart rendered with its defaults), and the helm `make manifests` finds is the
one these tests run."""

from __future__ import annotations

import subprocess
import sys

import yaml
from helm_chart import CHART, run_helm
from repo_root import ROOT


def test_chart_crds_are_the_generated_ones() -> None:
    shipped = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == shipped
    for name in shipped:
        assert (CHART / "crds" / name).read_text() == (ROOT / "crds" / name).read_text(), (
            f"charts/weightcache/crds/{name} differs from crds/{name}: run `make manifests` and commit the result"
        )
    # Helm installs crds/ verbatim and first; objects of those kinds must be templates.
    for name in shipped:
        assert {d["kind"] for d in yaml.safe_load_all((ROOT / "crds" / name).read_text())} == {
            "CustomResourceDefinition"
        }


def test_deploy_manifest_is_the_rendered_chart(helm: str) -> None:
    """deploy/operator.yaml is for installs without Helm; after its comment header it must be
    exactly what the chart renders with default values."""
    text = (ROOT / "deploy" / "operator.yaml").read_text()
    header, body = text[: text.index("---\n")], text[text.index("---\n") :]
    assert all(line.startswith("#") for line in header.splitlines())
    rendered = run_helm(helm, "template", "weightcache", str(CHART), "--namespace", "weightcache-system")
    assert body == rendered.stdout, "deploy/operator.yaml differs from the chart: run `make manifests` and commit it"


def test_makefile_finds_the_same_helm(helm: str) -> None:
    """`make manifests` locates helm with `python -m testcluster which helm`, starting nothing."""
    result = subprocess.run(
        [sys.executable, "-m", "testcluster", "which", "helm"],
        cwd=ROOT / "tests" / "cluster",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == helm
    refused = subprocess.run(
        [sys.executable, "-m", "testcluster", "which"],
        cwd=ROOT / "tests" / "cluster",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "name the tool, helm or kubectl" in refused.stderr
