"""vLLM-style KV cache events from the simulator, over ZMQ (optional, off by default).

With `SimConfig.kv_events_endpoint` set (vLLM flavour), the replica binds a ZMQ PUB socket
there and publishes, as vLLM 0.32 does, one multipart message per batch:
`[topic, 8-byte big-endian sequence number, msgpack [ts, [event, ...], 0]]`, each event a
map with a `"type"` key: `BlockStored` when full blocks enter the prefix cache,
`BlockRemoved` when cached blocks are evicted, `AllBlocksCleared` when the cache is reset.
Block hashes are the simulator's 64-bit chained hashes (vLLM's default integer form).
As in vLLM, a batch sent before a subscriber joined is lost; sends never block (a full
queue drops the batch).

Needs `pyzmq` and `msgpack` (the `kv-events` extra).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

TOPIC = b"kv"
MEDIUM = "GPU"


def _modules() -> tuple[Any, Any]:
    try:
        import msgpack  # type: ignore[import-untyped]
        import zmq
    except ImportError as exc:
        raise ImportError(
            "SimConfig.kv_events_endpoint needs pyzmq and msgpack: "
            "pip install 'llm-admission-gateway[kv-events]'"
        ) from exc
    return zmq, msgpack


class KVEventPublisher:
    """A bound ZMQ PUB socket publishing vLLM-shaped KV event batches."""

    def __init__(self, endpoint: str, block_size: int) -> None:
        zmq, self._msgpack = _modules()
        self._zmq = zmq
        self.block_size = block_size
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self._seq = 0
        self.sent = 0
        self.dropped = 0

    def stored(self, hashes: Sequence[int], parent: int | None, tokens: Sequence[int]) -> None:
        self._publish(
            {
                "type": "BlockStored",
                "block_hashes": list(hashes),
                "parent_block_hash": parent,
                "token_ids": list(tokens),
                "block_size": self.block_size,
                "lora_id": None,
                "medium": MEDIUM,
                "lora_name": None,
                "extra_keys": [None] * len(hashes),
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            }
        )

    def removed(self, hashes: Sequence[int]) -> None:
        self._publish(
            {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": MEDIUM, "group_idx": 0}
        )

    def cleared(self) -> None:
        self._publish({"type": "AllBlocksCleared"})

    def _publish(self, event: dict[str, Any]) -> None:
        payload = self._msgpack.packb([time.time(), [event], 0])
        frames = [TOPIC, self._seq.to_bytes(8, "big"), payload]
        self._seq += 1
        try:
            self._sock.send_multipart(frames, flags=self._zmq.NOBLOCK)
            self.sent += 1
        except self._zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
