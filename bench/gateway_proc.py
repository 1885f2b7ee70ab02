"""The gateway as `gateway serve` builds it, but served on uvloop instead of
the stdlib asyncio loop: an experiment for bench/overhead.py --gateway-uvloop.

    python -m bench.gateway_uvloop --replica vllm=URL --port P --admin-port A
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Literal, cast

import uvloop

from gateway.app import create_app
from gateway.config import GatewayConfig, ListenConfig, ReplicaConfig
from gateway.serving import Listener, serve_all


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replica", required=True, help="vllm=http://127.0.0.1:PORT")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--admin-port", type=int, required=True)
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = p.parse_args()
    kind, url = args.replica.split("=", 1)
    engine = cast(Literal["auto", "vllm", "llamacpp"], kind)
    cfg = GatewayConfig(listen=ListenConfig(port=args.port, admin_port=args.admin_port),
                        replicas=(ReplicaConfig(url=url, kind=engine),))
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    gw = create_app(cfg)
    listeners = [Listener(gw.public_app, cfg.listen.host, cfg.listen.port),
                 Listener(gw.admin_app, cfg.listen.admin_host, cfg.listen.admin_port)]
    if args.loop == "uvloop":
        uvloop.run(serve_all(listeners, log_level=cfg.log_level))
    else:
        asyncio.run(serve_all(listeners, log_level=cfg.log_level))


if __name__ == "__main__":
    main()
