"""A minimal JSON client for the Kubernetes REST API, objects kept as plain dicts.

The kubelet and the service proxy patch and watch at high rates; plain dicts and urllib3 keep
that cheap and make the wire format visible (strategic-merge patches, watch bookmarks) without
a generated model layer in between. Tests are free to use the ``kubernetes`` package instead.
"""

from __future__ import annotations

import json
import ssl
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import urllib3
import yaml

from .netns import entered

Object = dict[str, Any]

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class ApiError(Exception):
    """A non-2xx answer; ``status`` and the server's Status ``body`` make it checkable."""

    def __init__(self, status: int, body: Object | str) -> None:
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"{status}: {message}")
        self.status = status
        self.body = body


class Kube:
    """One identity's connection pool to the API server; safe to share between threads."""

    def __init__(
        self,
        server: str,
        ca_file: Path,
        *,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        token: str | None = None,
        netns: str | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self._credentials = (ca_file, cert_file, key_file, token)
        context = ssl.create_default_context(cafile=str(ca_file))
        if cert_file and key_file:
            context.load_cert_chain(str(cert_file), str(key_file))
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._pool = urllib3.PoolManager(ssl_context=context, maxsize=16, retries=False)
        if netns is not None:
            self._pool.pool_classes_by_scheme = {"https": _pool_in(netns)}  # type: ignore[assignment]

    def from_namespace(self, netns: str | None) -> Kube:
        """The same identity, its connections made inside network namespace ``netns``: what a
        node's kubelet uses, so a cut link cuts it off (``testcluster.kubelet.nodenetwork``)."""
        if netns is None:
            return self
        ca_file, cert_file, key_file, token = self._credentials
        return Kube(self.server, ca_file, cert_file=cert_file, key_file=key_file, token=token, netns=netns)

    @property
    def host(self) -> str:
        """The API server's address, as pods are told it (KUBERNETES_SERVICE_HOST)."""
        return str(urllib.parse.urlsplit(self.server).hostname)

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Kube:
        config = yaml.safe_load(Path(path).read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        return cls(
            cluster["server"],
            Path(cluster["certificate-authority"]),
            cert_file=Path(user["client-certificate"]) if "client-certificate" in user else None,
            key_file=Path(user["client-key"]) if "client-key" in user else None,
            token=user.get("token"),
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Object:
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        url = self.server + path
        if params:
            url += "?" + urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        response = self._pool.request(method, url, body=data, headers=headers, timeout=timeout)
        payload: Any = response.data.decode() if response.data else ""
        try:
            payload = json.loads(payload) if payload else {}
        except json.JSONDecodeError:
            pass
        if response.status >= 300:
            raise ApiError(response.status, payload)
        return payload

    def get(self, path: str, **params: Any) -> Object:
        return self.request("GET", path, params=params or None)

    def create(self, path: str, body: Object) -> Object:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Object, content_type: str = STRATEGIC_MERGE) -> Object:
        return self.request("PATCH", path, body, content_type=content_type)

    def delete(self, path: str, body: Object | None = None) -> Object:
        return self.request("DELETE", path, body)

    def watch(
        self, path: str, *, resource_version: str | None = None, timeout_seconds: int = 300, **params: Any
    ) -> Iterator[tuple[str, Object]]:
        """Yields (type, object) for one watch request until the server closes it.

        The caller lists first and passes the list's resourceVersion, so nothing between the
        list and the watch is missed; it re-lists on ERROR (410 Gone) or at the end.
        """
        fields = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            **{k: str(v) for k, v in params.items()},
        }
        if resource_version:
            fields["resourceVersion"] = resource_version
        response = self._pool.request(
            "GET",
            self.server + path,
            fields=fields,
            headers=self._headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=timeout_seconds + 10),
        )
        try:
            if response.status >= 300:
                raise ApiError(response.status, response.data.decode())
            buffer = b""
            # read1 returns whatever has arrived; a fixed-size read would sit on a lone event.
            while chunk := response.read1(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        yield event["type"], event["object"]
        finally:
            # Closed, not just released: a watch abandoned mid-stream must not hand its
            # half-read connection to the next request.
            response.close()
            response.release_conn()


def _pool_in(netns: str) -> type[urllib3.HTTPSConnectionPool]:
    """A connection pool whose new connections are made inside network namespace ``netns``."""

    class Connection(urllib3.connection.HTTPSConnection):
        def _new_conn(self) -> Any:
            with entered(netns):
                return super()._new_conn()

    class Pool(urllib3.HTTPSConnectionPool):
        ConnectionCls = Connection

    return Pool
