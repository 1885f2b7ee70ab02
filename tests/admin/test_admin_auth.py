"""The admin token: /admin/* need it when configured, /metrics and /healthz stay open."""

from __future__ import annotations

import httpx

from gateway.config.schema import AdminConfig
from gateway.sim.cluster import SimCluster
from tests.gwharness import running_gateway

TOKEN = "admin-token-0123456789abcdef"


def test_admin_routes_need_the_token_when_configured() -> None:
    with (
        SimCluster.start(1, speed=50) as sim,
        running_gateway(sim.urls, admin=AdminConfig(token=TOKEN)) as gw,
    ):
        url = gw.admin_url
        for path in ("/admin/replicas", "/admin/config", "/admin/sessions", "/admin/nope"):
            bare = httpx.get(url + path, timeout=10)
            assert bare.status_code == 401, path
            assert bare.json()["error"]["type"] == "authentication_error"
            assert bare.json()["error"]["code"] == "invalid_admin_token"
            assert bare.headers["www-authenticate"].startswith("Bearer")
            wrong = httpx.get(url + path, headers={"Authorization": "Bearer nope"}, timeout=10)
            assert wrong.status_code == 401, path
        # A POST that would change state is refused before it runs.
        replica = sim.urls[0].split("//", 1)[1]
        refused = httpx.post(url + f"/admin/replicas/{replica}/drain", timeout=10)
        assert refused.status_code == 401
        assert not gw.gateway.registry.replicas[0].draining
        auth = {"Authorization": f"Bearer {TOKEN}"}
        ok = httpx.get(url + "/admin/replicas", headers=auth, timeout=10)
        assert ok.status_code == 200 and len(ok.json()["replicas"]) == 1
        assert httpx.get(url + "/admin/config", headers=auth, timeout=10).status_code == 200
        assert httpx.get(url + "/admin/nope", headers=auth, timeout=10).status_code == 404
        # Scheme is case-insensitive (RFC 7235); the token is not.
        lower = httpx.get(url + "/admin/replicas", headers={"Authorization": f"bearer {TOKEN}"})
        assert lower.status_code == 200
        upper = {"Authorization": f"Bearer {TOKEN.upper()}"}
        assert httpx.get(url + "/admin/replicas", headers=upper).status_code == 401
        # Prometheus and probes need no token.
        metrics = httpx.get(url + "/metrics", timeout=10)
        assert metrics.status_code == 200 and "gateway_requests_admitted_total" in metrics.text
        assert httpx.get(url + "/healthz", timeout=10).status_code == 200


def test_without_a_token_the_admin_routes_are_open() -> None:
    with SimCluster.start(1, speed=50) as sim, running_gateway(sim.urls) as gw:
        assert httpx.get(gw.admin_url + "/admin/replicas", timeout=10).status_code == 200
