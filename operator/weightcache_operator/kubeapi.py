"""A small JSON client for the Kubernetes API, objects as plain dicts.

Why not the generated ``kubernetes`` models: the operator renders plain dicts and applies them
with server-side apply, and reads only a few fields back; a typed round trip would add a model
layer that drops unknown fields. Credentials come from ``kubernetes.config`` (kubeconfig or the
in-cluster ServiceAccount, whose token it re-reads), so every auth form it supports works here.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, cast

import kubernetes
import urllib3

from weightcache_operator.objects import Object

__all__ = ["Object"]

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
FIELD_MANAGER = "weightcache-operator"


class ApiError(Exception):
    """A non-2xx answer; ``status`` says which."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"{status}: {message}")
        self.status = status
        self.body = body


class KubeApi:
    """One connection pool to the API server; safe to share between handler threads."""

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self._config = configuration
        self.server = configuration.host.rstrip("/")
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file and configuration.key_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
        if not configuration.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        # Enough connections for kopf's handler threads and a pass's concurrent reads
        # (together.THREADS) to keep theirs instead of opening one per request.
        self._pool = urllib3.PoolManager(ssl_context=context, maxsize=32, retries=False)
        self.timed: Callable[[str, float], None] | None = None
        """Told each request's verb and how long the answer took (the operator's metrics)."""

    @classmethod
    def load(cls) -> KubeApi:
        """In-cluster credentials when running in a pod, else $KUBECONFIG / ~/.kube/config."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=configuration)
        return cls(configuration)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        verb: str | None = None,
    ) -> Object:
        """``verb`` names the request for ``timed`` when the method alone does not (LIST, APPLY)."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        token = self._config.get_api_key_with_prefix("authorization") or self._config.get_api_key_with_prefix(
            "BearerToken"
        )
        if token:
            headers["Authorization"] = token
        url = self.server + path
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        started = time.perf_counter()
        try:
            response = self._pool.request(method, url, body=data, headers=headers, timeout=30.0)
        finally:
            if self.timed is not None:
                self.timed(verb or method, time.perf_counter() - started)
        try:
            payload: Any = json.loads(response.data) if response.data else {}
        except ValueError:
            if response.status < 400:
                raise
            # A plain-text error: "404 page not found" for an API group the server does not
            # serve (a CRD not installed).
            payload = response.data.decode(errors="replace").strip()
        if response.status >= 400:
            raise ApiError(response.status, payload)
        return cast(Object, payload)

    def get(self, path: str, **params: Any) -> Object:
        return self.request("GET", path, params=params)

    def list(self, path: str, label_selector: str | None = None) -> list[Object]:
        return cast(
            list[Object], self.request("GET", path, params={"labelSelector": label_selector}, verb="LIST")["items"]
        )

    def create(self, path: str, body: Object) -> Object:
        return self.request("POST", path, body)

    def delete(self, path: str, grace_seconds: int | None = None, propagation: str | None = None) -> None:
        options: Object = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if propagation:
            options["propagationPolicy"] = propagation
        try:
            self.request("DELETE", path, options)
        except ApiError as error:
            if error.status != 404:
                raise

    def patch(self, path: str, body: Object, content_type: str = MERGE) -> Object:
        return self.request("PATCH", path, body, content_type=content_type)

    def apply(self, path: str, body: Object) -> Object:
        """Server-side apply as the operator's field manager (forced: the operator owns these)."""
        return self.request(
            "PATCH",
            path,
            body,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type=APPLY,
            verb="APPLY",
        )
