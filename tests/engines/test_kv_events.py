"""vLLM KV event messages -> typed events (real stream: tests/engine/vllm/test_gateway_vllm.py)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from gateway.engines.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventDecodeError,
    UnknownEvent,
    decode_message,
)

STORED: dict[str, Any] = {
    "type": "BlockStored",
    "block_hashes": [b"\x01" * 32, b"\x02" * 32],
    "parent_block_hash": None,
    "token_ids": list(range(256)),
    "block_size": 128,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": None,
    "extra_keys": None,
    "group_idx": 0,
}


def frames(payload: Any, seq: int = 7, topic: bytes = b"kv") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), msgpack.packb(payload)]


def test_batch_of_each_event_type() -> None:
    events = [
        STORED,
        {"type": "BlockRemoved", "block_hashes": [b"\x01" * 32], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
        {"type": "SomethingNewer", "x": 1},
    ]
    batch = decode_message(frames([1733.5, events, 0], seq=2**40 + 3))
    assert batch.seq == 2**40 + 3 and batch.topic == b"kv"
    assert batch.ts == 1733.5 and batch.data_parallel_rank == 0
    stored, removed, cleared, unknown = batch.events
    assert stored == BlockStored(
        block_hashes=(b"\x01" * 32, b"\x02" * 32),
        parent_block_hash=None,
        token_ids=tuple(range(256)),
        block_size=128,
        lora_id=None,
        medium="GPU",
    )
    assert removed == BlockRemoved(block_hashes=(b"\x01" * 32,), medium="GPU")
    assert cleared == AllBlocksCleared()
    assert unknown == UnknownEvent(type="SomethingNewer")


def test_integer_hashes_and_missing_rank() -> None:
    event = {**STORED, "block_hashes": [12, 2**63 + 1], "parent_block_hash": 5}
    batch = decode_message(frames([0, [event]]))
    assert batch.data_parallel_rank is None
    (stored,) = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == (12, 2**63 + 1) and stored.parent_block_hash == 5


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ([b"kv", b"\x00" * 8], "expected 3 frames"),
        ([b"kv", b"\x00" * 4, msgpack.packb([0, [], 0])], "sequence frame"),
        ([b"kv", b"\x00" * 8, b"\xc1"], "not msgpack"),
        (frames({"ts": 0}), "expected [ts, events, rank]"),
        (frames(["now", [], 0]), "payload.ts"),
        (frames([0, {}, 0]), "payload.events"),
        (frames([0, [], "zero"]), "data_parallel_rank"),
        (frames([0, [["BlockStored", []]], 0]), "payload.events[0]: expected a map"),
        (frames([0, [{**STORED, "block_hashes": ["x"]}], 0]), "events[0].block_hashes"),
        (frames([0, [{**STORED, "token_ids": None}], 0]), "events[0].token_ids"),
        (frames([0, [{**STORED, "block_size": 0}], 0]), "events[0].block_size"),
        (frames([0, [{**STORED, "parent_block_hash": "p"}], 0]), "parent_block_hash"),
        (frames([0, [{**STORED, "lora_id": "a"}], 0]), "events[0].lora_id"),
        (frames([0, [STORED, {**STORED, "medium": 3}], 0]), "events[1].medium"),
    ],
)
def test_malformed_messages_name_the_part(message: list[bytes], needle: str) -> None:
    with pytest.raises(KVEventDecodeError) as info:
        decode_message(message)
    assert needle in str(info.value)
