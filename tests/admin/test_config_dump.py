"""GET /admin/config: the effective config with every secret masked."""

from __future__ import annotations

import dataclasses
import hashlib
import types
import typing
from collections.abc import Iterator
from typing import Any

import httpx

from gateway.config.masking import MASK, NOT_SECRET, SECRET_NAME, is_secret, mask_secrets
from gateway.config.schema import GatewayConfig, parse_config
from gateway.http.serving import free_port
from gateway.sim.cluster import SimCluster
from tests.gwharness import running_gateway

SECRETS = {
    "replica": "sk-replica-secret-1",
    "client": "sk-client-secret-2",
    "isolation": "isolation-secret-3-abcdefgh",
    "admin": "admin-token-secret-4-abcdef",
    "redis": "redis-pass-secret-5",
    "discovery": "sk-discovery-secret-6",
}


def _config(sim_url: str) -> tuple[GatewayConfig, str]:
    digest = hashlib.sha256(b"another-client-key").hexdigest()
    cfg = parse_config(
        {
            "replicas": [{"url": sim_url, "api_key": SECRETS["replica"]}],
            # a name that resolves nowhere: discovery keeps an empty set, logged
            "discovery": [
                {
                    "name": "pool",
                    "host": "pool.invalid",
                    "port": 8000,
                    "api_key": SECRETS["discovery"],
                }
            ],
            "listen": {"port": free_port(), "admin_port": free_port()},
            "auth": {
                "enabled": True,
                "keys": [
                    {"tenant": "acme", "key": SECRETS["client"]},
                    {"tenant": "acme", "sha256": digest},
                ],
                "tenants": {"acme": {}},
                "isolation_secret": SECRETS["isolation"],
            },
            "admin": {"token": SECRETS["admin"]},
            # Redis down: `on_failure: open` serves from the in-process store meanwhile
            "state": {
                "backend": "redis",
                "redis": {
                    "url": f"redis://gw:{SECRETS['redis']}@127.0.0.1:1/0",
                    "on_failure": "open",
                },
            },
        }
    )
    return cfg, digest


def test_config_dump_masks_every_secret() -> None:
    with SimCluster.start(1, speed=50) as sim:
        cfg, digest = _config(sim.urls[0])
        with running_gateway(config=cfg) as gw:
            auth = {"Authorization": f"Bearer {SECRETS['admin']}"}
            resp = httpx.get(gw.admin_url + "/admin/config", headers=auth, timeout=10)
    assert resp.status_code == 200
    for secret in [*SECRETS.values(), digest]:
        assert secret not in resp.text
    dump = resp.json()
    assert dump["replicas"][0]["api_key"] == MASK
    assert dump["replicas"][0]["url"] == sim.urls[0]  # no password in it: unchanged
    assert (
        dump["discovery"][0]["api_key"] == MASK and dump["discovery"][0]["host"] == "pool.invalid"
    )
    assert [k.get("key") or k.get("sha256") for k in dump["auth"]["keys"]] == [MASK, MASK]
    assert [k["tenant"] for k in dump["auth"]["keys"]] == ["acme", "acme"]
    assert dump["auth"]["isolation_secret"] == MASK
    assert dump["admin"]["token"] == MASK
    assert dump["state"]["redis"]["url"] == "redis://gw:***@127.0.0.1:1/0"
    assert dump["state"]["key_prefix"] == "gw:"  # not a secret, though named "key"


def _str_fields(cls: type, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, field name) of every str (or sequence of str) field in the config tree."""
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        for arg in _flatten(tp):
            if arg is str:
                yield f"{path}{f.name}", f.name
            elif dataclasses.is_dataclass(arg) and isinstance(arg, type):
                yield from _str_fields(arg, f"{path}{f.name}.")


def _flatten(tp: Any) -> Iterator[Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, tuple, list, dict):
        for arg in typing.get_args(tp):
            if arg is not Ellipsis:
                yield from _flatten(arg)
    else:
        yield tp


def test_every_str_field_named_like_a_secret_is_masked() -> None:
    """A secret field added later is masked without being listed anywhere;
    the exceptions are few and each names a field that exists."""
    fields = list(_str_fields(GatewayConfig))
    named_like_secrets = [(p, n) for p, n in fields if SECRET_NAME.search(n)]
    assert {n for _, n in named_like_secrets} >= {"api_key", "key", "sha256", "token"}
    for path, name in named_like_secrets:
        if name in NOT_SECRET:
            continue
        assert is_secret(name), path
        assert mask_secrets({name: "s3cret"}) == {name: MASK}, path
        assert mask_secrets({name: ["s3cret"]}) == {name: [MASK]}, path
    assert {n for _, n in fields} >= NOT_SECRET, "a NOT_SECRET entry names no field"
