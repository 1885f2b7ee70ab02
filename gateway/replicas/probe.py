"""GETs on one replica for its engine adapter (`gateway.engines.EngineGet`).

`ReplicaGet` binds the upstream client to one replica, its auth and a
timeout. Lenient (kind detection, context length): any answer but 200, or a
body that is not JSON, is None. Strict (live-state polls): 404/501 is None
(the route is absent), any other status or bad JSON is a `PollError`. A failed
request raises the client's `GatewayError` leniently, a `PollError` strictly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from gateway.errors import GatewayError


class ProbeAnswer(Protocol):
    @property
    def status(self) -> int: ...
    @property
    def body(self) -> bytes: ...


class ProbeClient(Protocol):
    """What health checks and live-state polls need of the upstream client
    (`gateway.forward.upstream.UpstreamClient`)."""

    async def get(
        self, url: str, timeout: float, headers: Mapping[str, str] | None = None
    ) -> ProbeAnswer:
        """A small bounded GET; GatewayError when it fails."""
        ...


class PollError(Exception):
    """A poll did not yield a reading."""


class ReplicaGet:
    def __init__(
        self,
        client: ProbeClient,
        url: str,
        headers: Mapping[str, str],
        timeout: float,
        *,
        strict: bool = False,
    ) -> None:
        self._client = client
        self._url = url
        self._headers = headers
        self._timeout = timeout
        self._strict = strict

    async def text(self, path: str) -> str | None:
        try:
            resp = await self._client.get(self._url + path, self._timeout, self._headers)
        except GatewayError as exc:
            if self._strict:
                raise PollError(exc.message) from exc
            raise
        if resp.status == 200:
            return resp.body.decode("utf-8", "replace")
        if self._strict and resp.status not in (404, 501):
            raise PollError(f"{path} answered HTTP {resp.status}")
        return None

    async def json(self, path: str) -> Any:
        text = await self.text(path)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            if self._strict:
                raise PollError(f"{path} is not JSON: {exc}") from exc
            return None
