"""applying.apply_if_different against the real API server: what the operator renders for every
shipped example (daemon DaemonSets, GPU holder, engine Service, disruption budget), once applied and read back with
the API server's defaults, counts as up to date, so a resync of an unchanged cache writes
nothing; a field edited by hand or no longer rendered is applied again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from testcluster.controlplane import ControlPlane
from testcluster.rest import MERGE, Kube
from weightcache_operator.act.applying import apply_if_different, up_to_date
from weightcache_operator.kubeapi import KubeApi
from weightcache_operator.render.budget import engine_budget
from weightcache_operator.render.daemon import daemon_daemonsets
from weightcache_operator.render.gpu_holder import gpu_holder_daemonset
from weightcache_operator.render.service import engine_service
from weightcache_operator.spec import API_VERSION, PLURAL, WeightCache

pytestmark = pytest.mark.e2e

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("weightcache-*.yaml"))


def operator_api(cluster: ControlPlane) -> KubeApi:
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
    return KubeApi(configuration)


def stored_cache(cluster: ControlPlane, kube: Kube, example: Path, namespace: str) -> WeightCache:
    body = yaml.safe_load(example.read_text())
    # No node matches: the DaemonSets exist, nothing runs their pods.
    body["spec"]["placement"] = {"nodeSelector": {"weightcache.io/e2e-no-such-node": "true"}}
    cluster.apply(yaml.safe_dump(body), namespace=namespace)
    return WeightCache.model_validate(
        kube.get(f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{body['metadata']['name']}")
    )


def rendered(cache: WeightCache, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    slots = [[f"node-{k}"] for k in range(cache.spec.parallelism.nodes)]
    daemonsets = [*daemon_daemonsets(cache, slots)]
    holder = gpu_holder_daemonset(cache, slots)
    if holder is not None:
        daemonsets.append(holder)
    base = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"
    service = engine_service(cache)
    budget = engine_budget(cache)
    return [
        *((f"{base}/{ds['metadata']['name']}", ds) for ds in daemonsets),
        (f"/api/v1/namespaces/{namespace}/services/{service['metadata']['name']}", service),
        (f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{budget['metadata']['name']}", budget),
    ]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_what_the_operator_renders_is_up_to_date_once_applied_and_read_back(
    cluster: ControlPlane, kube: Kube, weightcache_crd: str, namespace: str, example: Path
) -> None:
    api = operator_api(cluster)
    cache = stored_cache(cluster, kube, example, namespace)
    for path, wanted in rendered(cache, namespace):
        assert not up_to_date(None, wanted)
        assert up_to_date(apply_if_different(api, path, wanted, None), wanted), f"{path}: the apply's answer"
        live = kube.get(path)  # controllers may have written its status since
        assert up_to_date(live, wanted), f"{path}: the API server's answer differs from what was applied"
        # As a pass observes DaemonSets: an item of a LIST, which carries no apiVersion and kind.
        collection, _, name = path.rpartition("/")
        listed = next(item for item in kube.get(collection)["items"] if item["metadata"]["name"] == name)
        assert "kind" not in listed and up_to_date(listed, wanted), f"{path}: as listed, it differs"
        # The same object returned: no request was sent.
        assert apply_if_different(api, path, wanted, live) is live, f"{path}: an unchanged object was applied again"


def test_a_hand_edit_of_an_owned_field_and_a_field_no_longer_rendered_are_applied_again(
    cluster: ControlPlane, kube: Kube, weightcache_crd: str, namespace: str
) -> None:
    api = operator_api(cluster)
    cache = stored_cache(cluster, kube, EXAMPLES[0], namespace)
    path, wanted = rendered(cache, namespace)[0]
    apply_if_different(api, path, wanted, None)

    labels = wanted["spec"]["template"]["metadata"]["labels"]
    dropped = next(k for k in sorted(labels) if k not in wanted["spec"]["selector"]["matchLabels"])

    edited = kube.patch(path, {"spec": {"template": {"metadata": {"labels": {dropped: "edited-by-hand"}}}}}, MERGE)
    assert not up_to_date(edited, wanted)
    restored = apply_if_different(api, path, wanted, edited)
    assert restored["spec"]["template"]["metadata"]["labels"][dropped] == labels[dropped]
    assert up_to_date(kube.get(path), wanted)

    # The operator stops rendering that label: the hash differs, and the apply removes it.
    assert dropped in restored["spec"]["template"]["metadata"]["labels"]
    fewer = {
        **wanted,
        "spec": {
            **wanted["spec"],
            "template": {
                **wanted["spec"]["template"],
                "metadata": {
                    **wanted["spec"]["template"]["metadata"],
                    "labels": {k: v for k, v in labels.items() if k != dropped},
                },
            },
        },
    }
    live = kube.get(path)
    assert not up_to_date(live, fewer)
    assert dropped not in apply_if_different(api, path, fewer, live)["spec"]["template"]["metadata"]["labels"]
