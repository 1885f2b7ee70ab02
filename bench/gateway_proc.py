"""The gateway as `gateway serve` builds it, with its public listener on a
chosen HTTP server: the A/B row of `bench/overhead.py --gateway-uvicorn`.
(`gateway serve` itself refuses uvicorn for the public listener: it has no
head or body limits; this measurement-only switch bypasses the config.)

    python -m bench.gateway_proc --server uvicorn --replica vllm=URL --port P --admin-port A
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Literal, cast

from gateway.app import create_app
from gateway.config.schema import GatewayConfig, ListenConfig, ReplicaConfig
from gateway.http.serving import run, serve_all, tune_gc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replica", required=True, help="vllm=http://127.0.0.1:PORT")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--admin-port", type=int, required=True)
    p.add_argument("--server", choices=("lean", "uvicorn"), default="lean")
    args = p.parse_args()
    kind, url = args.replica.split("=", 1)
    engine = cast(Literal["auto", "vllm", "llamacpp"], kind)
    server = cast(Literal["lean", "uvicorn"], args.server)
    cfg = GatewayConfig(
        listen=ListenConfig(port=args.port, admin_port=args.admin_port),
        replicas=(ReplicaConfig(url=url, kind=engine),),
    )
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    gw = create_app(cfg)
    listeners = gw.listeners()
    listeners[0] = dataclasses.replace(listeners[0], server=server)

    async def main_coro() -> None:
        tune_gc()
        await serve_all(listeners, log_level=cfg.log_level)

    run(main_coro())


if __name__ == "__main__":
    main()
